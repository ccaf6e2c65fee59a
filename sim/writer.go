package sim

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// writer drives the real writer of one vshard for one ownership epoch,
// shardcore.Writer, as shardworker's shard does: it performs the writer's
// effects against the simulated log, owner store and sink, one scheduling
// point each (each is a round trip in the real writer), and feeds the
// results back. Nothing here decides anything the real writer decides.
type writer struct {
	wk    *worker
	v     int
	part  int32
	epoch int64 // ownership epoch of the row that started it
	txnID string

	m       *shardcore.Writer
	pending *shardcore.Effect // the round trip the writer asked for, not made yet
	done    bool
	// produced: the pending batch commit's events are produced (its
	// transaction is open in the log) at offs; the commit is the next step.
	produced bool
	offs     []int64

	pepoch int64 // producer epoch of the current session
	opened bool  // the session initialised its producer

	// loading is the batch load the writer waits for in its worker's
	// loader (pending is its effect).
	loading *loadReq
	// What the driver knows of the events the writer may not know stored
	// (internal/shardcore/writer_memory.go), for PropCacheBound: the offset of its
	// session's marker, the conversations of the log tail it replayed,
	// and, since it took over, the conversation of each event it
	// committed and the tail's conversations at the marker's offset.
	markerOff int64
	tailConvs []string
	unstored  []unstoredRef
	// told is the last override of each conversation the writer was told
	// of (shardworker's shard.told): a release deletes only that one.
	told map[string]toldRoute
}

// toldRoute is an override as a writer was told of it: its target and
// its revision.
type toldRoute struct {
	to  int
	rev int64
}

// unstoredRef is a conversation with an event at a log offset.
type unstoredRef struct {
	conv string
	off  int64
}

// errNotOwner is what the RecheckAtOpen what-if feeds the writer when the
// row moved between the backoff and the open.
var errNotOwner = errors.New("sim: the owner row moved")

// errPgDown and errEtcdDown are what a round trip to a dependency that is
// down returns.
var (
	errPgDown   = errors.New("sim: postgres is down")
	errEtcdDown = errors.New("sim: etcd is down")
)

// refusalMemory is the writers' RefusalMemory: how long a keyed answer
// that wrote nothing answers the key's other attempts.
const refusalMemory = 120 * time.Second

func newWriter(w *World, wk *worker, v int, epoch int64) *writer {
	wr := &writer{wk: wk, v: v, part: w.layout().Partition(v), epoch: epoch, txnID: logrecord.TransactionalID(v), told: map[string]toldRoute{}}
	faults := shardcore.WriterFaults{
		AcceptBeforeMarker:       w.cfg.Bugs.AcceptBeforeMarker,
		AcceptedBeforeCommit:     w.cfg.Bugs.AcceptedBeforeCommit,
		MembershipOutsideMailbox: w.cfg.Bugs.MembershipOutsideMailbox,
		ReplayBeforeMarker:       w.cfg.Bugs.ReplayBeforeMarker,
		AcceptBeforeMoved:        w.cfg.Bugs.AcceptBeforeMoved,
		ForgetNoopJoin:           w.cfg.Bugs.ForgetNoopJoin,
		VerdictsPinConvs:         w.cfg.Bugs.VerdictsPinConvs,
		KnownForgetsTrimmed:      w.cfg.Bugs.KnownForgetsTrimmed,
		DropCarriedVerdicts:      w.cfg.Bugs.DropCarriedVerdicts,
		NoEmptyBatchMarker:       !w.cfg.WhatIf.FenceCheckedAnswers,
	}
	wr.m = shardcore.NewWriter(shardcore.WriterConfig{
		VShard: v, VShards: w.cfg.VShards, Dedicated: w.layout().IsDedicated(v), Epoch: epoch, Worker: wk.id,
		Limits:   shardcore.Limits{MaxMembers: w.cfg.MaxMembers},
		MaxBatch: w.cfg.MaxBatch,
		// Trim as tightly as the real writer may: after every commit, one
		// result kept per conversation, a small cache; retries are then
		// answered by the lookup and evicted conversations reloaded.
		RefusalMemory: refusalMemory, DedupeMemory: 1 << 62, DedupeKeep: 1,
		MaxConvs: w.cfg.WriterMaxConvs, TrimInterval: 0,
		NewID: func(time.Time) (string, error) {
			w.msgIDs++
			return fmt.Sprintf("m%d", w.msgIDs), nil
		},
		Faults: faults,
	}, w.clock())
	wr.collect(w)
	return wr
}

// String is worker/vshard@epoch.
func (wr *writer) String() string {
	return fmt.Sprintf("%s/v%d@e%d", wr.wk.id, wr.v, wr.epoch)
}

// phase is where the real writer is.
func (wr *writer) phase() shardcore.Phase { return wr.m.Phase() }

// ended reports whether the writer has ended (everything answered).
func (wr *writer) ended() bool { return wr.done }

// stepKind is one thing a writer can do next.
type stepKind int

const (
	stEffect stepKind = iota // make the round trip the writer asked for
	stTick                   // hand over the mailbox: a batch starts
)

// stepName names a step as the trace and the scripts do.
func (wr *writer) stepName(s stepKind) string {
	if s == stTick {
		return "process"
	}
	e := wr.pending
	switch e.Kind {
	case shardcore.EffectOpenProducer:
		return "open"
	case shardcore.EffectCommit:
		if wr.phase() == shardcore.PhaseMarker {
			return "marker"
		}
		if !wr.produced {
			return "produce"
		}
		return "commit"
	case shardcore.EffectPersistOffset:
		if wr.phase() == shardcore.PhaseHousekeep {
			return "housekeep"
		}
		return "replay-offset"
	case shardcore.EffectReadTail:
		return "replay-tail"
	case shardcore.EffectLoadState:
		if wr.phase() == shardcore.PhaseReplayLoad {
			return "replay-load"
		}
		return "load"
	case shardcore.EffectReadOwner:
		return "recheck"
	}
	return e.Kind.String()
}

// steps lists what the writer can do next.
func (wr *writer) steps(w *World) []stepKind {
	if wr.done || wr.loading != nil {
		return nil
	}
	if e := wr.pending; e != nil {
		// readTail polls until it reaches its end: records before it in an
		// open transaction (another vshard of the partition) hold it
		if e.Kind == shardcore.EffectReadTail && e.To >= 0 && w.log.StableOffset(wr.part) <= e.To {
			return nil
		}
		return []stepKind{stEffect}
	}
	if wr.m.CanStart(w.clock()) {
		return []stepKind{stTick}
	}
	return nil
}

// available reports whether the writer has a step of category c
// (catWriter or catLostCommit) now.
func (wr *writer) available(w *World, c category) bool {
	if wr.ended() {
		return false
	}
	for _, s := range wr.steps(w) {
		if c == catWriter || wr.committing(s) {
			return true
		}
	}
	return false
}

// committing reports whether the step is a commit (whose reply may be lost).
func (wr *writer) committing(s stepKind) bool {
	return s == stEffect && wr.pending.Kind == shardcore.EffectCommit && (wr.produced || wr.phase() == shardcore.PhaseMarker)
}

// do runs one step; lost makes a commit's reply get lost (the log commits,
// the writer sees an error).
func (wr *writer) do(w *World, s stepKind, lost bool) {
	now := w.clock()
	if s == stTick {
		w.stats.Batches++
		wr.m.Tick(now)
		wr.collect(w)
		return
	}
	e := wr.pending
	wr.pending = nil
	if e.Kind == shardcore.EffectCommit && !e.Marker && !wr.produced {
		// A batch: produce now, commit in a step of its own (a pause or a
		// crash can land in between, the transaction open in the log).
		offs, err := wr.produce(w, e)
		if err != nil {
			wr.m.Committed(now, nil, err)
			wr.collect(w)
			return
		}
		wr.pending, wr.produced, wr.offs = e, true, offs
		return
	}
	switch e.Kind {
	case shardcore.EffectOpenProducer:
		if w.cfg.WhatIf.RecheckAtOpen && !wr.stillOwner(w) {
			wr.m.ProducerOpened(now, errNotOwner)
			break
		}
		wr.pepoch, wr.opened = w.log.InitProducer(wr.txnID), true
		wr.m.ProducerOpened(now, nil)
	case shardcore.EffectCommit:
		offs := wr.offs
		if !wr.produced { // the marker: produce and commit in one step
			var err error
			if offs, err = wr.produce(w, e); err != nil {
				wr.m.Committed(now, nil, err)
				break
			}
		}
		if e.Confirm && !w.cfg.WhatIf.NoMarkerConfirm && (w.etcdDown() || !wr.stillOwner(w)) {
			// shardworker reads the owner row between the marker's
			// produce and its commit, and aborts if it moved.
			_ = w.log.Abort(wr.txnID, wr.pepoch)
			wr.produced, wr.offs = false, nil
			wr.m.Committed(now, nil, errNotOwner)
			break
		}
		wr.produced, wr.offs = false, nil
		err := wr.commit(w, e, lost)
		if err != nil {
			offs = nil
		}
		wr.committed(e, offs)
		wr.m.Committed(now, offs, err)
	case shardcore.EffectPersistOffset:
		if w.pgDown() {
			wr.m.PersistOffset(now, 0, false, errPgDown)
			break
		}
		off, ok := w.sink.Offset(wr.part)
		housekeep := wr.phase() == shardcore.PhaseHousekeep
		if !housekeep {
			wr.tailConvs = nil // a new replay
		}
		wr.m.PersistOffset(now, off, ok, nil)
		if housekeep && ok {
			wr.checkCache(w, off)
		}
	case shardcore.EffectReadTail:
		end := e.To
		if end < 0 {
			end = w.log.StableOffset(wr.part) // no marker: the log as it is now
		}
		var tail []*logrecord.Event
		if e.FromStart || e.From < end {
			recs, _ := w.log.ReadCommitted(wr.part, e.From, end)
			for _, r := range recs {
				if r.Event.VShard == wr.v && r.Event.HasSeq() {
					tail = append(tail, r.Event)
					if !slices.Contains(wr.tailConvs, r.Event.ConversationID) {
						wr.tailConvs = append(wr.tailConvs, r.Event.ConversationID)
					}
				}
			}
		}
		wr.m.TailRead(now, tail, nil)
	case shardcore.EffectLoadState: // a replay's load (a batch's goes to the loader)
		if w.pgDown() {
			wr.m.StateLoaded(now, nil, nil, errPgDown)
			break
		}
		convs := map[string]*shardcore.Conv{}
		for _, c := range e.Convs {
			convs[c] = w.sink.LoadConv(c)
		}
		if e.AllOfVShard {
			for _, c := range w.convs {
				if _, ok := convs[c]; !ok && logrecord.VShard(c, w.cfg.VShards) == wr.v {
					convs[c] = w.sink.LoadConv(c)
				}
			}
		}
		found := map[shardcore.DedupeKey]shardcore.First{}
		for _, k := range e.Keys {
			if f, ok := w.sink.Lookup(k.Conv, k.CMID); ok {
				found[k] = f
			}
		}
		wr.m.StateLoaded(now, convs, found, nil)
	case shardcore.EffectReadOwner:
		if w.etcdDown() {
			wr.m.OwnerRead(now, false, errEtcdDown)
			break
		}
		wr.m.OwnerRead(now, wr.stillOwner(w), nil)
	}
	wr.collect(w)
}

// produce produces the effect's events in one transaction. Any produce
// error aborts the whole transaction.
func (wr *writer) produce(w *World, e *shardcore.Effect) ([]int64, error) {
	if e.Open {
		// AcceptBeforeMarker: fence only now
		wr.pepoch, wr.opened = w.log.InitProducer(wr.txnID), true
	}
	offs := make([]int64, len(e.Events))
	for i, ev := range e.Events {
		rec, err := w.log.Produce(wr.txnID, wr.pepoch, wr.part, ev, w.now)
		if err != nil {
			_ = w.log.Abort(wr.txnID, wr.pepoch)
			return nil, err
		}
		rec.ProducedStep = w.step
		offs[i] = rec.Offset
	}
	return offs, nil
}

// commit commits the transaction the effect's events were produced in.
func (wr *writer) commit(w *World, e *shardcore.Effect, lost bool) error {
	err := w.log.Commit(wr.txnID, wr.pepoch, w.step)
	if err == nil && lost {
		w.stats.LostCommitReplies++
		err = errCommitUnknown
	}
	if err != nil {
		if err == ErrFenced {
			w.stats.FencedCommits++
		}
		return err
	}
	if !e.Marker {
		w.stats.Commits++
	}
	return nil
}

// collect acts on what the writer asks after an input: it sends the
// answers and keeps the round trip asked for as the writer's next step.
func (wr *writer) collect(w *World) {
	rd := wr.m.Ready()
	for _, a := range rd.Answers {
		if a.Retry && a.Reply.Code == protocol.CodeUnavailable && w.locatedAt(a.Call.Cmd.ConversationID) == wr.v {
			w.stats.ArrivalsBeforePersist++
		}
		ans := w.reply(a.Call.Tag.(*attempt), a.Reply, a.Wrote)
		ans.by = wr
		// whether the writer's producer was already fenced (it cannot know)
		ans.fenced = wr.opened && w.log.producer(wr.txnID).epoch != wr.pepoch
	}
	if rd.Notice.TookOver {
		w.stats.Takeovers++
		// The writer's list of unstored events starts again: the tail's
		// conversations at the marker's offset.
		wr.unstored = wr.unstored[:0]
		for _, c := range wr.tailConvs {
			wr.unstored = append(wr.unstored, unstoredRef{c, wr.markerOff})
		}
		wr.tailConvs = nil
		for _, c := range sortedKeys(w.routes) {
			if at, to := w.locatedAt(c), w.routes[c]; at != to && (wr.v == at || wr.v == to) {
				w.stats.MovesAcrossTakeover++
			}
		}
	}
	w.stats.ConvMoves += len(rd.Notice.Moved)
	for _, c := range rd.Notice.Released {
		w.release(wr, c)
	}
	if now := w.clock(); rd.Effect == nil && !rd.Wake.IsZero() && !rd.Wake.After(now) && wr.phase() == shardcore.PhaseAccepting && !wr.m.CanStart(now) {
		// The driver ticks a writer whose wake time has come; with nothing
		// to start, that Tick must leave no wake time behind that has come
		// too, or the driver would tick it in a loop.
		wr.m.Tick(now)
		if again := wr.m.Ready(); again.Effect != nil || len(again.Answers) > 0 {
			w.violate(PropBusyWake, "%s did something on a Tick with nothing to start", wr)
		} else if !again.Wake.IsZero() && !again.Wake.After(now) {
			w.violate(PropBusyWake, "%s asks to be woken at %v (now %v) again after a Tick with nothing to start", wr, again.Wake.Unix(), now.Unix())
		}
	}
	if rd.Effect != nil {
		wr.pending = rd.Effect
		if viaLoader(rd.Effect) {
			wr.wk.queueLoad(wr, rd.Effect)
		}
	}
	if rd.Done {
		wr.done, wr.pending = true, nil
	}
}

// enqueue is shard.submit: the command waits in the mailbox.
func (wr *writer) enqueue(w *World, att *attempt) {
	wr.m.Submit(w.clock(), &shardcore.Call{ReqID: att.reqID(), Cmd: att.op.cmd, Tag: att})
	wr.collect(w)
}

// stop is the context's cancel: the owner row moved, or the lease was
// lost.
func (wr *writer) stop(w *World) {
	wr.m.Stop(w.clock())
	if wr.pending != nil && wr.pending.Abandon {
		wr.pending = nil // the round trip is given up
	}
	wr.collect(w)
}

func (wr *writer) stillOwner(w *World) bool {
	o, ok := w.owners.Owner(wr.v)
	return ok && o.Worker == wr.wk.id && o.Gen == wr.wk.gen && o.Epoch == wr.epoch
}

// inFlight reports whether the writer holds a produced, uncommitted batch.
func (wr *writer) inFlight() bool { return wr.produced }

// clock is the simulated time as the writer sees it.
func (w *World) clock() time.Time { return time.Unix(w.now, 0) }

// committed notes the events of a transaction that committed (offs: their
// offsets; nil: it did not): the marker's offset, or each event's
// conversation as not yet known stored.
func (wr *writer) committed(e *shardcore.Effect, offs []int64) {
	if offs == nil {
		return
	}
	if e.Marker {
		if wr.phase() == shardcore.PhaseMarker {
			wr.markerOff = offs[0]
		}
		return
	}
	for i, ev := range e.Events {
		if ev.HasSeq() && i < len(offs) {
			wr.unstored = append(wr.unstored, unstoredRef{ev.ConversationID, offs[i]})
		}
	}
}

// checkCache is PropCacheBound, after a housekeeping pass that read
// persist's offset persisted: the writer caches at most MaxConvs
// conversations, or, when more of them have events persist had not stored
// by then, those (internal/shardcore/writer_memory.go: "bounded by MaxConvs plus
// persist's lag").
func (wr *writer) checkCache(w *World, persisted int64) {
	n := 0
	for n < len(wr.unstored) && wr.unstored[n].off < persisted {
		n++
	}
	wr.unstored = append(wr.unstored[:0], wr.unstored[n:]...)
	var pinned []string
	for _, u := range wr.unstored {
		if !slices.Contains(pinned, u.conv) {
			pinned = append(pinned, u.conv)
		}
	}
	cached := wr.m.Cached()
	w.stats.Housekeeps++
	w.stats.CacheHigh = max(w.stats.CacheHigh, cached)
	if bound := max(w.cfg.WriterMaxConvs, len(pinned)); cached > bound {
		w.violate(PropCacheBound, "%s caches %d conversations after housekeeping; MaxConvs is %d and %d have events persist had not stored (%v)",
			wr, cached, w.cfg.WriterMaxConvs, len(pinned), pinned)
	}
}
