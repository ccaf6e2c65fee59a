package shardworker

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/time/rate"

	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
	"github.com/chatpipe/chatpipe/shardcore"
)

// call is one command waiting in a shard's queue.
type call struct {
	reqID string
	cmd   shardcore.Command
	// deadline (zero: none) is when the gateway stops waiting: a command
	// not decided by then is not decided at all, only answered unavailable
	// (nothing written).
	deadline time.Time
	// done is called exactly once with the reply; retry means nothing was
	// written and the command may go to whoever owns the shard now.
	done func(r *protocol.Reply, retry bool)
}

// expired reports whether c's deadline passed by now.
func (c *call) expired(now time.Time) bool { return !c.deadline.IsZero() && now.After(c.deadline) }

// shard is the writer of one vshard for one ownership epoch.
type shard struct {
	w     *Worker
	v     int
	epoch int64
	part  int32
	log   *slog.Logger

	in     chan *call
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	ready  atomic.Bool

	convs map[string]*shardcore.Conv
	// unstored lists, in log order, events this writer committed (and, at
	// takeover, each replayed conversation up to the marker) that persist
	// may not have stored yet; stored tracks per conversation with entries
	// there the highest seq known stored. Both only serve TrimDedupe and
	// are bounded by persist's lag.
	unstored []unstoredEvent
	stored   map[string]*storedSeq
	lastTrim time.Time
	// dedupeHeld is the number of dedupe results in memory as of the last
	// trim (read by the worker's gauge).
	dedupeHeld atomic.Int64
	// rates is the per-conversation message token bucket (nil map: off).
	rates   map[string]*rate.Limiter
	entropy io.Reader
	gc      groupCommit // owned by the shard's loop

	qmu    sync.Mutex // guards closed against submit racing the final drain
	closed bool
}

func newShard(w *Worker, v int, epoch int64) *shard {
	ctx, cancel := context.WithCancel(context.Background())
	return &shard{
		w: w, v: v, epoch: epoch, part: logrecord.Partition(v, w.cfg.Partitions),
		log: w.log.With("vshard", v, "epoch", epoch),
		in:  make(chan *call, w.cfg.QueueLen), ctx: ctx, cancel: cancel, done: make(chan struct{}),
		entropy: ulid.Monotonic(rand.Reader, 0),
		gc:      groupCommit{max: max(w.cfg.LingerMax, 0)},
	}
}

// submit queues c; false when the queue is full.
func (s *shard) submit(c *call) bool {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if s.closed {
		return false
	}
	select {
	case s.in <- c:
		return true
	default:
		return false
	}
}

// stop makes the shard stop accepting at once: commands it collected but
// has not decided are answered with a retry, and the batch in hand, if any,
// finishes (the new owner's marker fences its commit anyway).
func (s *shard) stop() { s.cancel() }

func (s *shard) run() {
	defer close(s.done)
	defer s.failQueued()
	backoff := 100 * time.Millisecond
	for s.ctx.Err() == nil {
		err := s.session()
		if s.ctx.Err() != nil {
			return
		}
		s.log.Warn("shard writer stopped; re-checking ownership before taking over again", "err", err)
		select {
		case <-s.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
		// Re-check right before re-opening the producer: re-initialising
		// the transactional.id fences whoever holds it. (A pause between the
		// check and the re-open can still fence a new owner for a moment;
		// it then re-checks and fences back, and every answer waits for a
		// commit, so no stale answer gets out.)
		if !s.stillOwner() {
			return
		}
	}
}

// stillOwner asks etcd (linearizable read) whether this worker still owns
// the vshard at this epoch. After a fence only the owner may make a new
// producer: a zombie that re-opened its producer would fence the real
// owner. While etcd cannot answer, it waits.
func (s *shard) stillOwner() bool {
	for s.ctx.Err() == nil {
		ctx, cancel := context.WithTimeout(s.ctx, 3*time.Second)
		o, ok, err := lease.ReadOwner(ctx, s.w.cfg.Etcd, s.w.cfg.Prefix, s.v)
		cancel()
		if err == nil {
			gen := s.w.gen.Load()
			return ok && o.Worker == s.w.cfg.ID && o.Gen == gen && o.Epoch == s.epoch
		}
		select {
		case <-s.ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
	return false
}

func (s *shard) failQueued() {
	s.qmu.Lock()
	s.closed = true
	s.qmu.Unlock()
	for {
		select {
		case c := <-s.in:
			c.done(unavailable(c.reqID, "vshard %d is moving to another worker", s.v), true)
		default:
			return
		}
	}
}

func unavailable(id, format string, args ...any) *protocol.Reply {
	e := protocol.Errorf(protocol.CodeUnavailable, format, args...)
	e.RetryAfterMS = 200
	return protocol.Rejected(id, e)
}

// session runs one takeover → replay → accept cycle until an error or stop.
func (s *shard) session() error {
	start := time.Now()
	cl, err := kgo.NewClient(append(slices.Clip(s.w.cfg.KafkaOpts),
		kgo.SeedBrokers(s.w.cfg.Brokers...),
		kgo.TransactionalID(logrecord.TransactionalID(s.v)),
		kgo.TransactionTimeout(s.w.cfg.TxnTimeout),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.DefaultProduceTopic(s.w.cfg.Topic),
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(s.w.cfg.CommitTimeout),
		kgo.MaxBufferedRecords(s.w.cfg.MaxBatch*2),
	)...)
	if err != nil {
		return fmt.Errorf("shardworker: producer: %w", err)
	}
	defer cl.Close()

	var markerOff int64
	var convs map[string]*shardcore.Conv
	var n int
	if faultAcceptBeforeMarker {
		convs, n, markerOff, err = s.replayWithoutMarker()
	} else {
		markerOff, err = s.commitMarker(cl)
		if err != nil {
			return err
		}
		if s.ctx.Err() != nil {
			return nil
		}
		convs, n, err = s.replay(markerOff)
	}
	if err != nil {
		return err
	}
	s.convs = convs
	s.unstored, s.stored = s.unstored[:0], map[string]*storedSeq{}
	for cid, conv := range convs {
		// Replayed from the log tail: nothing of it is known stored until
		// persist passes the marker.
		s.stored[cid] = &storedSeq{}
		s.markUnstored(cid, conv.LastSeq, markerOff)
	}
	s.w.stats.Takeovers.Add(1)
	s.w.takeoverSeconds.Observe(time.Since(start).Seconds())
	s.log.Info("accepting", "marker_offset", markerOff, "replayed", n, "conversations", len(convs), "took", time.Since(start).Round(time.Millisecond))
	s.ready.Store(true)
	defer s.ready.Store(false)
	var prevStart time.Time
	for {
		batch, start, ok := s.collect()
		if !ok {
			return nil
		}
		if s.ctx.Err() != nil { // stopped while collecting: the new owner answers these
			for _, c := range batch {
				c.done(unavailable(c.reqID, "vshard %d is moving to another worker", s.v), true)
			}
			return nil
		}
		processStart := time.Now() // after the linger: observe gets decide + commit only
		if err := s.process(cl, batch); err != nil {
			return err
		}
		var cycle time.Duration
		if !prevStart.IsZero() {
			cycle = start.Sub(prevStart)
		}
		s.gc.observe(len(batch), cycle, time.Since(processStart))
		prevStart = start
	}
}

// commitMarker commits the takeover marker through the vshard's
// transactional.id. Initialising that id fences the previous producer and
// aborts its open transaction; the marker's offset bounds the replay.
func (s *shard) commitMarker(cl *kgo.Client) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.w.cfg.CommitTimeout)
	defer cancel()
	ev := &logrecord.Event{Kind: logrecord.KindTakeover, VShard: s.v, Epoch: s.epoch, Worker: s.w.cfg.ID, CreatedAt: time.Now().UTC()}
	rec, err := s.record(ev)
	if err != nil {
		return 0, err
	}
	if err := cl.BeginTransaction(); err != nil {
		return 0, fmt.Errorf("shardworker: begin marker transaction: %w", err)
	}
	res := cl.ProduceSync(ctx, rec)
	if err := res.FirstErr(); err != nil {
		_ = cl.AbortBufferedRecords(ctx)
		_ = cl.EndTransaction(ctx, kgo.TryAbort)
		return 0, fmt.Errorf("shardworker: produce marker: %w", err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		return 0, fmt.Errorf("shardworker: commit marker: %w", err)
	}
	return res[0].Record.Offset, nil
}

// replay rebuilds the state of every conversation of the vshard that has
// events after persist's committed offset, up to the marker: Postgres for
// the prefix, then the log tail, read_committed. Other conversations are
// loaded from Postgres on first touch.
func (s *shard) replay(markerOff int64) (map[string]*shardcore.Conv, int, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.w.cfg.ReplayTimeout)
	defer cancel()
	from, ok, err := persistOffset(ctx, s.w.cfg.DB, s.w.cfg.Topic, s.part)
	if err != nil {
		return nil, 0, err
	}
	var tail []*logrecord.Event
	if !ok || from < markerOff {
		start := kgo.NewOffset().AtStart()
		if ok {
			start = kgo.NewOffset().At(from)
		}
		tail, err = readTail(ctx, s.w.cfg.Brokers, s.w.cfg.Topic, s.part, start, markerOff, s.v, faultAcceptBeforeMarker, s.w.cfg.KafkaOpts...)
		if err != nil {
			return nil, 0, err
		}
	}
	var ids []string
	seen := map[string]bool{}
	for _, e := range tail {
		if !seen[e.ConversationID] {
			seen[e.ConversationID] = true
			ids = append(ids, e.ConversationID)
		}
	}
	convs, _, err := fetchState(ctx, s.w.cfg.DB, ids, nil)
	if err != nil {
		return nil, 0, err
	}
	for _, e := range tail {
		shardcore.Apply(convs[e.ConversationID], e)
	}
	return convs, len(tail), nil
}

// readTail reads partition part from start up to (not including) the
// marker at end, read_committed, and returns the events of vshard v.
// untilIdle (only for the broken order of the fault tests, which has no
// marker to wait for) stops at the first empty fetch instead.
func readTail(ctx context.Context, brokers []string, topic string, part int32, start kgo.Offset, end int64, v int, untilIdle bool, extra ...kgo.Opt) ([]*logrecord.Event, error) {
	cl, err := kgo.NewClient(append(slices.Clip(extra),
		kgo.SeedBrokers(brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {part: start}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(200*time.Millisecond),
	)...)
	if err != nil {
		return nil, fmt.Errorf("shardworker: replay consumer: %w", err)
	}
	defer cl.Close()
	want := strconv.Itoa(v)
	var out []*logrecord.Event
	for {
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if untilIdle {
			pctx, cancel = context.WithTimeout(ctx, time.Second)
		}
		fs := cl.PollFetches(pctx)
		idle := pctx.Err() != nil
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("shardworker: replay of partition %d did not reach the marker at %d: %w", part, end, err)
		}
		if untilIdle && idle {
			return out, nil
		}
		if errs := fs.Errors(); len(errs) > 0 {
			return nil, fmt.Errorf("shardworker: replay fetch: %w", errs[0].Err)
		}
		reached := false
		var bad error
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= end {
				reached = true
				return
			}
			if bad != nil || headerValue(r, logrecord.HeaderVShard) != want {
				return
			}
			e, err := logrecord.Unmarshal(r.Value)
			if err != nil {
				// Its seq is unknown: replaying without it could hand the
				// seq out again. The takeover fails (and is retried) until
				// this build can read it (a newer version) or an operator
				// steps in (a malformed record).
				bad = fmt.Errorf("shardworker: replay of vshard %s: record at %d/%d: %w", want, r.Partition, r.Offset, err)
				return
			}
			if e.Kind == logrecord.KindTakeover {
				return
			}
			out = append(out, e)
		})
		if bad != nil {
			return nil, bad
		}
		if reached {
			return out, nil
		}
	}
}

func headerValue(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func (s *shard) record(e *logrecord.Event) (*kgo.Record, error) {
	val, err := e.Marshal()
	if err != nil {
		return nil, err
	}
	r := &kgo.Record{Key: []byte(e.Key()), Value: val, Partition: s.part, Topic: s.w.cfg.Topic}
	for _, h := range e.Headers() {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: h[0], Value: []byte(h[1])})
	}
	return r, nil
}

// collect waits for one command, then takes whatever else has queued, up to
// MaxBatch, waiting at most the linger for more: the fixed Linger if set,
// else the adaptive group commit's. It returns when the first command came.
// Commands past their deadline are answered and left out (keep).
func (s *shard) collect() ([]*call, time.Time, bool) {
	var batch []*call
	for len(batch) == 0 {
		select {
		case c := <-s.in:
			batch = s.keep(batch, c)
		case <-s.ctx.Done():
			return nil, time.Time{}, false
		}
	}
	start := time.Now()
	wait := s.w.cfg.Linger
	if wait <= 0 {
		wait = s.gc.linger(s.w.cfg.TxnBudget / float64(max(s.w.owned.Load(), 1)))
	}
	var linger <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		linger = t.C
	}
	for len(batch) < s.w.cfg.MaxBatch {
		// Queued commands first: once the linger has fired, a select over
		// both would pick between them at random and leave some behind.
		select {
		case c := <-s.in:
			batch = s.keep(batch, c)
			continue
		default:
		}
		if linger == nil {
			break
		}
		select {
		case c := <-s.in:
			batch = s.keep(batch, c)
			continue
		case <-linger:
		}
		break
	}
	return batch, start, true
}

// keep adds c to batch, unless its deadline passed while it was queued:
// the gateway has given up on it (its client heard "outcome unknown" and
// may have retried), so deciding it now would apply it late. It is
// answered unavailable with a retry instead: nothing was written.
func (s *shard) keep(batch []*call, c *call) []*call {
	if c.expired(time.Now()) {
		c.done(unavailable(c.reqID, "the command waited past its deadline; nothing was written"), true)
		return batch
	}
	return append(batch, c)
}

// process decides a batch, commits its events in one transaction and
// answers. A returned error ends the session: the state is thrown away, and
// every command of the batch has been answered `unavailable`.
func (s *shard) process(cl *kgo.Client, batch []*call) error {
	answered := false
	defer func() {
		if !answered {
			for _, c := range batch {
				c.done(unavailable(c.reqID, "the writer failed; retry with the same ids"), false)
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), s.w.cfg.CommitTimeout)
	defer cancel()

	// 1. State this batch needs and the writer lacks: one round trip.
	var need []string
	var keys []dedupeKey
	seenConv, seenKey := map[string]bool{}, map[dedupeKey]bool{}
	for _, c := range batch {
		cid := c.cmd.ConversationID
		conv, loaded := s.convs[cid]
		if !loaded && !seenConv[cid] {
			seenConv[cid] = true
			need = append(need, cid)
		}
		k := dedupeKey{cid, c.cmd.ClientMessageID}
		if c.cmd.ClientMessageID != "" && !seenKey[k] && (!loaded || shardcore.NeedsDedupeLookup(conv, &c.cmd)) {
			seenKey[k] = true
			keys = append(keys, k)
		}
	}
	if len(need) > 0 || len(keys) > 0 {
		loaded, found, err := fetchState(ctx, s.w.cfg.DB, need, keys)
		if err != nil {
			s.log.Warn("cannot load conversation state", "err", err)
			for _, c := range batch {
				c.done(unavailable(c.reqID, "conversation state is unavailable"), true)
			}
			answered = true
			return nil
		}
		for cid, conv := range loaded {
			s.convs[cid] = conv
		}
		for k, f := range found {
			shardcore.Remember(s.convs[k.conv], k.cmid, f)
		}
	}

	// 2. Decide, in arrival order, applying each event at once so the next
	// command of the conversation sees it.
	now := time.Now()
	replies := make([]*protocol.Reply, len(batch))
	var recs []*kgo.Record
	var seqs []int64 // seq of each event of recs
	decided := false // some answer depends on the conversation's state
	for i, c := range batch {
		if c.expired(now) { // collected in time, but the state lookup took the rest (see keep)
			replies[i] = unavailable(c.reqID, "the command waited past its deadline; nothing was written")
			continue
		}
		conv := s.convs[c.cmd.ConversationID]
		if wait, ok := s.allowSend(conv, &c.cmd, now); !ok {
			e := protocol.Errorf(protocol.CodeRateLimited, "more than %g messages/s in %s", s.w.cfg.ConvRate, c.cmd.ConversationID)
			e.RetryAfterMS = max(wait.Milliseconds(), 1)
			replies[i] = protocol.Rejected(c.reqID, e)
			continue
		}
		id, err := ulid.New(ulid.Timestamp(now), s.entropy)
		if err != nil {
			return fmt.Errorf("shardworker: message id: %w", err)
		}
		d := shardcore.Decide(conv, &c.cmd, shardcore.Stamp{Now: now, MessageID: id.String(), VShard: s.v, Epoch: s.epoch}, s.w.cfg.Limits)
		decided = true
		switch {
		case d.Reject != nil:
			replies[i] = protocol.Rejected(c.reqID, d.Reject)
			// Another attempt of the key gets this answer too, for a while:
			// one decided later must not be accepted after it.
			shardcore.Refuse(conv, &c.cmd, d.Reject, now, s.w.cfg.RefusalMemory)
		case d.Event != nil:
			shardcore.Apply(conv, d.Event)
			rec, err := s.record(d.Event)
			if err != nil {
				return err
			}
			recs, seqs = append(recs, rec), append(seqs, d.Event.Seq)
			replies[i] = accepted(c, d.Event.Seq, d.Event.MessageID)
		default:
			replies[i] = accepted(c, d.Seq, d.MessageID)
		}
	}

	// 3. Commit; answer only after the commit returned success. A batch
	// that writes nothing still answers from the writer's state (a retry's
	// first result, forbidden, not_found, …), and a writer fenced without
	// knowing it would answer from a stale one: so such a batch commits a
	// takeover marker first, which succeeds only while no other writer has
	// taken the vshard over since this one did.
	events := len(recs)
	if events == 0 && decided {
		rec, err := s.record(&logrecord.Event{Kind: logrecord.KindTakeover, VShard: s.v, Epoch: s.epoch, Worker: s.w.cfg.ID, CreatedAt: now.UTC()})
		if err != nil {
			return err
		}
		recs = append(recs, rec)
	}
	if len(recs) > 0 {
		start := time.Now()
		if err := s.commit(ctx, cl, recs); err != nil {
			return err
		}
		s.w.commitSeconds.Observe(time.Since(start).Seconds())
		s.w.stats.Commits.Add(1)
		s.w.stats.Events.Add(int64(events))
		for i, r := range recs[:events] {
			s.markUnstored(string(r.Key), seqs[i], r.Offset)
		}
	}
	answered = true
	for i, c := range batch {
		c.done(replies[i], false)
	}
	// Only a batch that committed can have grown the state (a batch that
	// writes no event commits a marker).
	if len(recs) > 0 && (len(s.convs) > s.w.cfg.MaxConvs || now.Sub(s.lastTrim) >= s.w.cfg.TrimInterval) {
		s.housekeep(ctx, now)
	}
	return nil
}

// unstoredEvent is an event at a log offset that persist may not have
// stored yet.
type unstoredEvent struct {
	conv string
	seq  int64
	off  int64
}

// storedSeq is what the writer knows of a conversation with unstored
// events: how many are listed, and the highest seq known stored.
type storedSeq struct {
	pending int
	seq     int64
}

// markUnstored lists conversation cid's event seq at log offset off as not
// yet known stored. Seqs of a conversation grow with offsets, so when the
// conversation had nothing pending, everything below seq is stored.
func (s *shard) markUnstored(cid string, seq, off int64) {
	st := s.stored[cid]
	if st == nil {
		st = &storedSeq{seq: seq - 1}
		s.stored[cid] = st
	}
	st.pending++
	s.unstored = append(s.unstored, unstoredEvent{cid, seq, off})
}

// storedUpTo is the highest seq of conversation cid known to be in
// Postgres: every seq of a conversation with nothing pending.
func (s *shard) storedUpTo(cid string, conv *shardcore.Conv) int64 {
	if st := s.stored[cid]; st != nil {
		return st.seq
	}
	return conv.LastSeq
}

// housekeep reads persist's offset of the partition and bounds the memory
// of the writer: it forgets what persist has stored, trims every cached
// conversation's dedupe to the configured bounds, and evicts conversations
// beyond MaxConvs. Without persist's offset it trims nothing.
func (s *shard) housekeep(ctx context.Context, now time.Time) {
	s.lastTrim = now
	persisted, ok, err := persistOffset(ctx, s.w.cfg.DB, s.w.cfg.Topic, s.part)
	if err != nil || !ok {
		return
	}
	n := 0
	for ; n < len(s.unstored) && s.unstored[n].off < persisted; n++ {
		u := s.unstored[n]
		st := s.stored[u.conv]
		st.seq = max(st.seq, u.seq)
		if st.pending--; st.pending == 0 {
			delete(s.stored, u.conv)
		}
	}
	if n > 0 {
		s.unstored = append(s.unstored[:0], s.unstored[n:]...)
	}
	cutoff := now.Add(-s.w.cfg.DedupeMemory)
	trimmed, held := 0, 0
	refusedBefore := now.Add(-s.w.cfg.RefusalMemory)
	for cid, conv := range s.convs {
		trimmed += shardcore.TrimDedupe(conv, s.storedUpTo(cid, conv), s.w.cfg.DedupeKeep, cutoff)
		held += len(conv.Dedupe)
		shardcore.TrimRefusals(conv, refusedBefore)
	}
	s.w.stats.DedupeTrimmed.Add(int64(trimmed))
	s.dedupeHeld.Store(int64(held))
	if len(s.convs) > s.w.cfg.MaxConvs {
		s.evict()
	}
}

// evict drops cached conversations whose events are all in Postgres (none
// listed unstored, as of housekeep's read of persist's offset) and that
// remember no rejection, until the cache is at 3/4 of MaxConvs; they are
// reloaded on their next command.
// Conversations persist has not caught up with stay: reloading them would
// miss their newest events, so the cache is bounded by MaxConvs plus
// persist's lag.
func (s *shard) evict() {
	target := s.w.cfg.MaxConvs * 3 / 4
	n := 0
	for cid := range s.convs {
		if len(s.convs) <= target {
			break
		}
		// A conversation with remembered rejections stays: reloaded, it
		// would decide their keys again (they expire within RefusalMemory).
		if s.stored[cid] == nil && len(s.convs[cid].Refused) == 0 {
			delete(s.convs, cid)
			delete(s.rates, cid)
			n++
		}
	}
	s.w.stats.Evictions.Add(int64(n))
	s.log.Debug("evicted conversations", "n", n, "cached", len(s.convs))
}

// allowSend takes a token from the conversation's message bucket for a new
// send; a retry that dedupe answers costs nothing (it writes nothing). It
// runs in the mailbox, before any seq is assigned.
func (s *shard) allowSend(conv *shardcore.Conv, cmd *shardcore.Command, now time.Time) (time.Duration, bool) {
	if cmd.Op != protocol.OpSend || s.w.cfg.ConvRate <= 0 {
		return 0, true
	}
	if _, dup := conv.Dedupe[cmd.ClientMessageID]; dup {
		return 0, true
	}
	if s.rates == nil {
		s.rates = map[string]*rate.Limiter{}
	}
	lim := s.rates[cmd.ConversationID]
	if lim == nil {
		lim = rate.NewLimiter(rate.Limit(s.w.cfg.ConvRate), s.w.cfg.ConvBurst)
		s.rates[cmd.ConversationID] = lim
	}
	r := lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d, false
	}
	return 0, true
}

func accepted(c *call, seq int64, messageID string) *protocol.Reply {
	r := &protocol.Reply{Op: protocol.OpAccepted, ID: c.reqID, ConversationID: c.cmd.ConversationID, Seq: seq, MessageID: messageID}
	r.ClientMessageID = c.cmd.ClientMessageID
	return r
}

// commit produces recs in one transaction and commits it. Any produce error
// aborts the whole transaction (a commit after a failed produce would
// commit what did succeed). An error from EndTransaction may still mean the
// transaction committed: the caller treats every error as an unknown
// outcome.
func (s *shard) commit(ctx context.Context, cl *kgo.Client, recs []*kgo.Record) error {
	if err := cl.BeginTransaction(); err != nil {
		return fmt.Errorf("shardworker: begin transaction: %w", err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	wg.Add(len(recs))
	for _, r := range recs {
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
			wg.Done()
		})
	}
	if err := cl.Flush(ctx); err != nil && firstErr == nil {
		firstErr = err
	}
	wg.Wait()
	if firstErr != nil {
		s.countFence(firstErr)
		_ = cl.AbortBufferedRecords(ctx)
		_ = cl.EndTransaction(ctx, kgo.TryAbort)
		return fmt.Errorf("shardworker: produce: %w", firstErr)
	}
	if faultSleepBeforeCommit > 0 {
		markCommit()
		time.Sleep(faultSleepBeforeCommit)
	}
	// EndTransaction gets a context of its own: a cancelled or expired one
	// leaves the outcome unknown without even asking the broker (franz-go
	// advises against cancelling it), and after a long pause the broker's
	// answer — fenced or committed — is exactly what the writer must learn.
	ectx, ecancel := context.WithTimeout(context.Background(), s.w.cfg.CommitTimeout)
	defer ecancel()
	if err := cl.EndTransaction(ectx, kgo.TryCommit); err != nil {
		s.countFence(err)
		s.w.stats.UnknownCommits.Add(1)
		return fmt.Errorf("shardworker: commit: %w", err)
	}
	return nil
}

func (s *shard) countFence(err error) {
	if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
		s.w.stats.FencedWrites.Add(1)
		s.log.Warn("writes fenced: another writer took this vshard over", "err", err)
	}
}
