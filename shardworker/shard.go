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

	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// replyFunc is a queued command's Tag (shardcore.Call): it is called
// exactly once with the reply; retry means nothing was written and the
// command may go to whoever owns the shard now.
type replyFunc func(r *protocol.Reply, retry bool)

// reply answers c.
func reply(c *shardcore.Call, r *protocol.Reply, retry bool) { c.Tag.(replyFunc)(r, retry) }

// shard drives the writer of one vshard for one ownership epoch: the pure
// state machine shardcore.Writer decides everything, and this loop performs
// its effects against Kafka, etcd and Postgres and feeds the results back.
type shard struct {
	w     *Worker
	v     int
	epoch int64
	// ownerRev is the mod revision of the owner row that started this
	// writer (the row changes only with the epoch): releasing an override
	// is conditional on it.
	ownerRev int64
	part     int32
	log      *slog.Logger

	in     chan *shardcore.Call
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	ready  atomic.Bool
	// dedupeHeld is the number of dedupe results in memory as of the last
	// trim (read by the worker's gauge).
	dedupeHeld atomic.Int64
	hot        hotCounter // committed events per conversation (Worker.Hot)

	m       *shardcore.Writer // owned by run's loop
	cl      *kgo.Client       // the session's transactional producer
	entropy io.Reader

	qmu    sync.Mutex // guards closed against submit racing the final drain
	closed bool

	// Overrides the worker fed in, for run's loop to hand the writer.
	rmu      sync.Mutex
	routeQ   []routeUpdate
	routeSig chan struct{}
	// told is the last override of each conversation handed to the
	// writer (owned by run's loop): a release deletes the override only
	// at the revision the writer last heard of, so that no older route it
	// has yet to act on can follow the delete.
	told map[string]lease.Override
}

// routeUpdate is one override change for the writer (shardcore's Route
// and Unroute).
type routeUpdate struct {
	conv   string
	to     int
	rev    int64 // the override's mod revision
	routed bool
}

// route queues an override change for the writer; it never blocks.
func (s *shard) route(u routeUpdate) {
	s.rmu.Lock()
	s.routeQ = append(s.routeQ, u)
	s.rmu.Unlock()
	select {
	case s.routeSig <- struct{}{}:
	default:
	}
}

// takeRoutes hands the writer the override changes queued so far.
func (s *shard) takeRoutes() {
	s.rmu.Lock()
	q := s.routeQ
	s.routeQ = nil
	s.rmu.Unlock()
	now := time.Now()
	for _, u := range q {
		if u.routed {
			s.told[u.conv] = lease.Override{VShard: u.to, Rev: u.rev}
			s.m.Route(now, u.conv, u.to)
		} else {
			delete(s.told, u.conv)
			s.m.Unroute(u.conv)
		}
	}
}

// release deletes conversation cid's override, which the writer reports
// here and released to this vshard (Notice.Released), if it is still the
// override the writer last heard of and this writer's owner row is
// unchanged (lease.ReleaseOverride). A delete that fails leaves the
// override: the writer reports it again at its next look.
func (s *shard) release(cid string) {
	o, ok := s.told[cid]
	if !ok || o.VShard != s.v {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, 3*time.Second)
	defer cancel()
	done, err := lease.ReleaseOverride(ctx, s.w.cfg.Etcd, s.w.cfg.Prefix, cid, o.Rev, s.v, s.ownerRev)
	switch {
	case err != nil:
		s.log.Warn("cannot remove the override of a conversation that is home; trying again at the next look", "conversation", cid, "err", err)
	case done:
		s.w.stats.Releases.Add(1)
		s.log.Info("conversation home: override removed", "conversation", cid)
	default:
		s.log.Debug("override changed before its release", "conversation", cid)
	}
}

func newShard(w *Worker, v int, row lease.Row) *shard {
	ctx, cancel := context.WithCancel(context.Background())
	return &shard{
		w: w, v: v, epoch: row.Epoch, ownerRev: row.ModRevision, part: w.layout().Partition(v), routeSig: make(chan struct{}, 1),
		told: map[string]lease.Override{},
		log:  w.log.With("vshard", v, "epoch", row.Epoch),
		in:   make(chan *shardcore.Call, w.cfg.QueueLen), ctx: ctx, cancel: cancel, done: make(chan struct{}),
		entropy: ulid.Monotonic(rand.Reader, 0),
	}
}

// writerConfig is the state machine's configuration for this shard.
func (s *shard) writerConfig() shardcore.WriterConfig {
	c := s.w.cfg
	return shardcore.WriterConfig{
		VShard: s.v, VShards: c.VShards, Dedicated: s.w.layout().IsDedicated(s.v), Epoch: s.epoch, Worker: c.ID, Limits: c.Limits,
		MaxBatch: c.MaxBatch, Linger: c.Linger, LingerMax: c.LingerMax,
		ConvRate: c.ConvRate, ConvBurst: c.ConvBurst,
		RefusalMemory: c.RefusalMemory, DedupeMemory: c.DedupeMemory, DedupeKeep: c.DedupeKeep,
		MaxConvs: c.MaxConvs, TrimInterval: c.TrimInterval,
		Backoff: 100 * time.Millisecond, BackoffMax: 5 * time.Second, OwnerRetry: 500 * time.Millisecond,
		NewID: func(now time.Time) (string, error) {
			id, err := ulid.New(ulid.Timestamp(now), s.entropy)
			return id.String(), err
		},
		Faults: shardcore.WriterFaults{AcceptBeforeMarker: faultAcceptBeforeMarker},
	}
}

// submit queues c; false when the queue is full.
func (s *shard) submit(c *shardcore.Call) bool {
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

// run is the driver loop: act on what the writer asks, then wait for a
// command, its wake-up time or the stop.
func (s *shard) run() {
	defer close(s.done)
	defer s.failQueued()
	defer func() {
		if s.cl != nil {
			s.cl.Close()
		}
	}()
	// Wait for a turn to take over (Config.MaxTakeovers); the commands
	// that arrive meanwhile queue as they would during the takeover. A
	// writer that takes over again (after a failed commit: a broker
	// restart fails every writer's at once) waits for a turn again.
	if !s.waitTurn() {
		return
	}
	turn := true
	endTurn := func() {
		if turn {
			turn = false
			<-s.w.takeovers
		}
	}
	defer endTurn()
	s.m = shardcore.NewWriter(s.writerConfig(), time.Now())
	s.takeRoutes()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	stopped := false
	for {
		rd := s.m.Ready()
		s.act(&rd)
		s.ready.Store(s.m.Accepting())
		if turn && s.m.Accepting() {
			endTurn()
		}
		if rd.Done {
			return
		}
		if !stopped && s.ctx.Err() != nil {
			stopped = true
			s.m.Stop(time.Now())
			if rd.Effect == nil || rd.Effect.Abandon {
				continue
			}
		}
		if rd.Effect != nil {
			if !turn && !stopped && !s.m.Accepting() {
				if turn = s.waitTurn(); !turn {
					stopped = true // as above
					s.m.Stop(time.Now())
					if rd.Effect.Abandon {
						continue
					}
				}
			}
			s.perform(rd.Effect)
			continue
		}
		// Idle: take the override changes and what has queued, then let
		// the writer decide. A writer that always finds commands queued
		// never waits in the select below, and a route it has not taken
		// would have it move a conversation by an override that is gone.
		select {
		case <-s.routeSig:
			s.takeRoutes()
			s.m.Tick(time.Now())
			continue
		default:
		}
		s.m.SetShare(s.w.cfg.TxnBudget / float64(max(s.w.owned.Load(), 1)))
		if s.drain() || (!rd.Wake.IsZero() && !time.Now().Before(rd.Wake)) {
			s.m.Tick(time.Now())
			continue
		}
		var wake <-chan time.Time
		if !rd.Wake.IsZero() {
			timer.Reset(time.Until(rd.Wake))
			wake = timer.C
		}
		select {
		case c := <-s.in:
			s.m.Submit(time.Now(), c)
			s.drain()
			s.m.Tick(time.Now())
		case <-wake:
			s.m.Tick(time.Now())
		case <-s.routeSig:
			s.takeRoutes()
			s.m.Tick(time.Now())
		case <-s.ctx.Done():
		}
		timer.Stop() // (since Go 1.23 a stopped timer delivers no stale tick)
	}
}

// waitTurn takes one of the worker's takeover turns; false if the shard
// was stopped first.
func (s *shard) waitTurn() bool {
	select {
	case s.w.takeovers <- struct{}{}:
		return true
	case <-s.ctx.Done():
		return false
	}
}

// drain hands the writer the commands that have queued, up to a batch.
func (s *shard) drain() bool {
	got := false
	for s.m.Queued() < s.w.cfg.MaxBatch {
		select {
		case c := <-s.in:
			s.m.Submit(time.Now(), c)
			got = true
		default:
			return got
		}
	}
	return got
}

// act sends the writer's answers and counts and logs what it noticed.
func (s *shard) act(rd *shardcore.Ready) {
	for _, a := range rd.Answers {
		reply(a.Call, a.Reply, a.Retry)
	}
	n := &rd.Notice
	if n.TookOver {
		s.w.stats.Takeovers.Add(1)
		s.w.takeoverSeconds.Observe(n.Took.Seconds())
		s.log.Info("accepting", "marker_offset", n.MarkerOffset, "replayed", n.Replayed, "conversations", n.Conversations, "took", n.Took.Round(time.Millisecond))
	}
	if n.Failed != nil && s.ctx.Err() == nil {
		s.log.Warn("shard writer stopped; re-checking ownership before taking over again", "err", n.Failed)
	}
	if n.StateErr != nil {
		s.log.Warn("cannot load conversation state", "err", n.StateErr)
	}
	if n.DedupeHeld >= 0 {
		s.w.stats.DedupeTrimmed.Add(int64(n.Trimmed))
		s.dedupeHeld.Store(int64(n.DedupeHeld))
	}
	for _, cid := range n.Moved {
		s.w.stats.ConvMoves.Add(1)
		s.log.Info("conversation moved out", "conversation", cid)
	}
	for _, cid := range n.Released {
		s.release(cid)
	}
	for _, d := range n.Arrived {
		s.w.arrivalSeconds.Observe(d.Seconds())
		s.log.Info("conversation moved in", "after", d.Round(time.Millisecond))
	}
	if n.Evicted > 0 {
		s.w.stats.Evictions.Add(int64(n.Evicted))
		s.log.Debug("evicted conversations", "n", n.Evicted)
	}
}

// perform makes one round trip for the writer and feeds its result back.
func (s *shard) perform(e *shardcore.Effect) {
	switch e.Kind {
	case shardcore.EffectOpenProducer:
		s.m.ProducerOpened(time.Now(), s.openProducer())
	case shardcore.EffectCommit:
		offs, err := s.commitEvents(e)
		s.m.Committed(time.Now(), offs, err)
	case shardcore.EffectPersistOffset:
		ctx, cancel := s.effectContext(e)
		off, ok, err := s.w.persistOffset(ctx, s.part)
		cancel()
		s.m.PersistOffset(time.Now(), off, ok, err)
	case shardcore.EffectReadTail:
		ctx, cancel := s.effectContext(e)
		tail, err := s.readTail(ctx, e)
		cancel()
		s.m.TailRead(time.Now(), tail, err)
	case shardcore.EffectLoadState:
		ctx, cancel := s.effectContext(e)
		convs, found, err := s.loadState(ctx, e)
		cancel()
		// The state may show a move that an override change queued
		// meanwhile led to (its writer was told at the same time): the
		// writer decides with that change, not with the route it had.
		s.takeRoutes()
		s.m.StateLoaded(time.Now(), convs, found, err)
	case shardcore.EffectReadOwner:
		// After a fence only the owner may make a new producer: a zombie
		// that re-opened its producer would fence the real owner. (A pause
		// between this read and the re-open can still fence a new owner
		// for a moment — the marker's Confirm then keeps the zombie from
		// committing; the new owner re-checks and fences back, and every
		// answer waits for a commit, so no stale answer gets out.)
		still, err := s.stillOwner()
		s.m.OwnerRead(time.Now(), still, err)
	default:
		panic(fmt.Sprintf("shardworker: unknown effect %v", e.Kind))
	}
}

// stillOwner reads the vshard's owner row (a linearizable read) and
// reports whether it still names this worker, its registration and this
// writer's epoch.
func (s *shard) stillOwner() (bool, error) {
	ctx, cancel := context.WithTimeout(s.ctx, 3*time.Second)
	defer cancel()
	o, ok, err := lease.ReadOwner(ctx, s.w.cfg.Etcd, s.w.cfg.Prefix, s.v)
	return ok && o.Worker == s.w.cfg.ID && o.Gen == s.w.gen.Load() && o.Epoch == s.epoch, err
}

// effectContext bounds one round trip: the replay's steps by ReplayTimeout
// and the stop (they may be abandoned), the others by CommitTimeout only.
func (s *shard) effectContext(e *shardcore.Effect) (context.Context, context.CancelFunc) {
	if e.Abandon {
		return context.WithTimeout(s.ctx, s.w.cfg.ReplayTimeout)
	}
	return context.WithTimeout(context.Background(), s.w.cfg.CommitTimeout)
}

// openProducer opens the session's transactional producer. Its id is
// initialised (fencing the previous producer and aborting its open
// transaction) by the marker's transaction, the first thing it does.
func (s *shard) openProducer() error {
	if s.cl != nil {
		s.cl.Close()
		s.cl = nil
	}
	cl, err := kgo.NewClient(append(slices.Clip(s.w.cfg.KafkaOpts),
		kgo.SeedBrokers(s.w.cfg.Brokers...),
		kgo.TransactionalID(logrecord.TransactionalID(s.v)),
		kgo.TransactionTimeout(s.w.cfg.TxnTimeout),
		// One client per vshard: thousands per worker, each sending the
		// broker its own KIP-714 metrics (12 % of a worker's CPU during a
		// cold start of 1,371 vshards); the worker's /metrics has them.
		kgo.DisableClientMetrics(),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.DefaultProduceTopic(s.w.cfg.Topic),
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(s.w.cfg.CommitTimeout),
		kgo.MaxBufferedRecords(s.w.cfg.MaxBatch*2),
	)...)
	if err != nil {
		return fmt.Errorf("shardworker: producer: %w", err)
	}
	s.cl = cl
	return nil
}

// commitEvents produces e's events in one transaction and commits it,
// returning each event's offset.
func (s *shard) commitEvents(e *shardcore.Effect) ([]int64, error) {
	if s.cl == nil || e.Open { // the broken order of the fault tests opens late
		if err := s.openProducer(); err != nil {
			return nil, err
		}
	}
	recs := make([]*kgo.Record, len(e.Events))
	for i, ev := range e.Events {
		r, err := s.record(ev)
		if err != nil {
			return nil, err
		}
		recs[i] = r
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.w.cfg.CommitTimeout)
	defer cancel()
	start := time.Now()
	if err := s.commit(ctx, s.cl, recs, e.Marker, e.Confirm); err != nil {
		return nil, err
	}
	if !e.Marker {
		s.w.commitSeconds.Observe(time.Since(start).Seconds())
		s.w.stats.Commits.Add(1)
		n := 0
		for _, ev := range e.Events {
			if ev.HasSeq() {
				n++
			}
		}
		s.w.stats.Events.Add(int64(n))
		s.hot.count(time.Now(), e.Events)
	}
	offs := make([]int64, len(recs))
	for i, r := range recs {
		offs[i] = r.Offset
	}
	return offs, nil
}

// readTail reads the log tail e asks for: from persist's offset (or the
// start) up to the marker.
func (s *shard) readTail(ctx context.Context, e *shardcore.Effect) ([]*logrecord.Event, error) {
	end := e.To
	if end < 0 {
		var err error
		if end, err = s.partitionEnd(ctx); err != nil {
			return nil, err
		}
	}
	start := kgo.NewOffset().AtStart()
	if !e.FromStart {
		start = kgo.NewOffset().At(e.From)
	}
	if !e.FromStart && e.From >= end {
		return nil, nil
	}
	return readTail(ctx, s.w.cfg.Brokers, s.w.cfg.Topic, s.part, start, end, s.v, faultAcceptBeforeMarker, s.w.cfg.KafkaOpts...)
}

// loadState loads what e asks for in one round trip (plus, for the broken
// order of the fault tests, every conversation of the vshard).
func (s *shard) loadState(ctx context.Context, e *shardcore.Effect) (map[string]*shardcore.Conv, map[shardcore.DedupeKey]shardcore.First, error) {
	convs := e.Convs
	if e.AllOfVShard {
		more, err := s.vshardConversations(ctx)
		if err != nil {
			return nil, nil, err
		}
		have := map[string]bool{}
		for _, c := range convs {
			have[c] = true
		}
		for _, c := range more {
			if !have[c] {
				convs = append(convs, c)
			}
		}
	}
	var loaded map[string]*shardcore.Conv
	var found map[shardcore.DedupeKey]shardcore.First
	var err error
	if l := s.w.loader; l != nil && !e.Abandon && !e.AllOfVShard {
		loaded, found, err = l.load(ctx, convs, e.Keys) // a batch's load: shared with other writers'
	} else {
		loaded, found, err = fetchState(ctx, s.w.cfg.DB, convs, e.Keys)
	}
	if err == nil && e.AllOfVShard {
		s.log.Warn("FAULT: accepting without a takeover marker")
		time.Sleep(faultAcceptDelay)
	}
	return loaded, found, err
}

func (s *shard) failQueued() {
	s.qmu.Lock()
	s.closed = true
	s.qmu.Unlock()
	for {
		select {
		case c := <-s.in:
			reply(c, shardcore.Unavailable(c.ReqID, "vshard %d is moving to another worker", s.v), true)
		default:
			return
		}
	}
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
		kgo.DisableClientMetrics(), // one short-lived client per takeover
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
			if !e.HasSeq() {
				return // a takeover or read marker: no seq, no state
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

// commit produces recs in one transaction and commits it. Any produce error
// aborts the whole transaction (a commit after a failed produce would
// commit what did succeed). An error from EndTransaction may still mean the
// transaction committed: the caller treats every error as an unknown
// outcome. marker: recs is a takeover marker (the fault tests' sleep before
// the commit holds batches open, not takeovers).
func (s *shard) commit(ctx context.Context, cl *kgo.Client, recs []*kgo.Record, marker, confirm bool) error {
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
	if err := cl.Flush(ctx); err != nil {
		// Flush gave up at ctx's deadline. A record still buffered then
		// (waiting, say, for partition metadata that a restarting broker
		// does not give yet) fails only once the client gives up on it,
		// which can take longer than any stop may wait: close the client,
		// which fails every buffered record at once, and let the next
		// session open a new one. The open transaction is the broker's to
		// abort (its timeout, or that next producer's InitProducerID).
		cl.Close()
		if s.cl == cl {
			s.cl = nil
		}
		wg.Wait()
		if firstErr != nil && !errors.Is(firstErr, kgo.ErrClientClosed) {
			err = firstErr // (a record's own error, from before the close)
		}
		s.countFence(err)
		return fmt.Errorf("shardworker: produce: %w", err)
	}
	wg.Wait() // (every promise has run once Flush returns nil)
	if firstErr != nil {
		s.countFence(firstErr)
		_ = cl.AbortBufferedRecords(ctx)
		_ = cl.EndTransaction(ctx, kgo.TryAbort)
		return fmt.Errorf("shardworker: produce: %w", firstErr)
	}
	if faultSleepBeforeCommit > 0 && !marker {
		markCommit()
		time.Sleep(faultSleepBeforeCommit)
		holdCommit()
	}
	if confirm {
		// The produce initialised the transactional.id (fencing every
		// older producer); only now is a look at the owner row proof that
		// no newer owner initialised it before: one that did first had
		// its row written before that.
		if still, err := s.stillOwner(); err != nil || !still {
			_ = cl.EndTransaction(ctx, kgo.TryAbort)
			if err == nil {
				err = errors.New("the owner row names another writer")
			}
			return fmt.Errorf("shardworker: confirm ownership before the marker: %w", err)
		}
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
		if faultRecommitAfterAbort && !marker && s.recommitAfterAbort(recs) == nil {
			return nil
		}
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
