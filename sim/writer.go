package sim

import (
	"fmt"
	"maps"
	"time"

	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
	"github.com/chatpipe/chatpipe/shardcore"
)

// phase is where a writer is in shardworker's session: takeover (open the
// producer, commit the marker), replay (persist's offset, then the log tail
// up to the marker), accepting, committing a batch, or re-checking
// ownership after a failure.
type phase int

const (
	phOpen phase = iota
	phMarker
	phReplayOffset
	phReplayTail
	phAccepting
	phCommitting
	phRecheck
	phDone
)

var phaseNames = [...]string{"open", "marker", "replay-offset", "replay-tail", "accepting", "committing", "recheck", "done"}

// String names the phase.
func (p phase) String() string { return phaseNames[p] }

// stepKind is one thing a writer can do next; each is one scheduling point,
// because each is a round trip to Kafka, Postgres or etcd in the real writer.
type stepKind int

const (
	stOpen         stepKind = iota // InitProducer: fences the previous session, aborts its transaction
	stMarker                       // produce and commit the takeover marker
	stReplayOffset                 // read persist's offset from the sink
	stReplayTail                   // read the log tail up to the marker, load its conversations
	stProcess                      // take a batch, load state, Decide/Apply, produce
	stCommit                       // commit the batch and answer
	stRecheck                      // linearizable read of the owner row
	stFinish                       // the loop ends: queued commands are answered unavailable
)

var stepNames = [...]string{"open", "marker", "replay-offset", "replay-tail", "process", "commit", "recheck", "finish"}

// String names the step.
func (s stepKind) String() string { return stepNames[s] }

// call is a command in a writer's mailbox.
type call struct {
	att *attempt
	cmd shardcore.Command
	// members is the writer's view of the members when the command arrived;
	// only the MembershipOutsideMailbox bug uses it.
	members map[string]int64
}

// writer is the model of shardworker's shard: the writer of one vshard for
// one ownership epoch. Its decisions are shardcore's: Decide, Apply,
// ObserveSeq and NeedsDedupeLookup.
type writer struct {
	wk    *worker
	v     int
	part  int32
	epoch int64 // ownership epoch of the row that started it
	txnID string

	phase     phase
	cancelled bool // stop(): the owner row moved, or the lease was lost
	sessions  int

	pepoch    int64 // producer epoch of the current session
	opened    bool  // the session initialised its producer (AcceptBeforeMarker opens late)
	markerOff int64
	from      int64 // persist's offset read at replay
	fromOK    bool

	convs    map[string]*shardcore.Conv
	queue    []*call
	inflight []*call
	replies  []*protocol.Reply
	wrote    []bool
}

func newWriter(wk *worker, v int, epoch int64, partitions int) *writer {
	return &writer{wk: wk, v: v, part: logrecord.Partition(v, partitions), epoch: epoch, txnID: logrecord.TransactionalID(v)}
}

// String is worker/vshard@epoch.
func (wr *writer) String() string {
	return fmt.Sprintf("%s/v%d@e%d", wr.wk.id, wr.v, wr.epoch)
}

// steps lists what the writer can do next.
func (wr *writer) steps(w *World) []stepKind {
	switch wr.phase {
	case phOpen:
		// run's loop checks the context before each session
		if wr.cancelled {
			return []stepKind{stFinish}
		}
		return []stepKind{stOpen}
	case phMarker:
		// commitMarker does not watch the context
		return []stepKind{stMarker}
	case phReplayOffset:
		if wr.cancelled {
			return []stepKind{stFinish}
		}
		return []stepKind{stReplayOffset}
	case phReplayTail:
		if wr.cancelled {
			return []stepKind{stFinish}
		}
		// readTail polls until it reaches the marker: records before it
		// in an open transaction (another vshard of the partition) hold it
		if !w.cfg.Bugs.AcceptBeforeMarker && w.log.StableOffset(wr.part) <= wr.markerOff {
			return nil
		}
		return []stepKind{stReplayTail}
	case phAccepting:
		// collect selects between the queue and the context: a stopped
		// writer may still take what has queued
		var s []stepKind
		if len(wr.queue) > 0 {
			s = append(s, stProcess)
		}
		if wr.cancelled {
			s = append(s, stFinish)
		}
		return s
	case phCommitting:
		// the commit runs on a background context
		return []stepKind{stCommit}
	case phRecheck:
		if wr.cancelled {
			return []stepKind{stFinish}
		}
		return []stepKind{stRecheck}
	}
	return nil
}

// do runs one step; lost makes a commit's reply get lost (the log commits,
// the writer sees an error).
func (wr *writer) do(w *World, s stepKind, lost bool) {
	switch s {
	case stOpen:
		wr.open(w)
	case stMarker:
		wr.marker(w, lost)
	case stReplayOffset:
		wr.from, wr.fromOK = w.sink.Offset(wr.part)
		wr.phase = phReplayTail
	case stReplayTail:
		wr.replayTail(w)
	case stProcess:
		wr.process(w)
	case stCommit:
		wr.commit(w, lost)
	case stRecheck:
		wr.recheck(w)
	case stFinish:
		wr.finish(w)
	}
}

// open starts a session. The correct writer initialises its producer now
// (fencing every older session of the vshard); AcceptBeforeMarker delays
// that to its first commit.
func (wr *writer) open(w *World) {
	if w.cfg.WhatIf.RecheckAtOpen && !wr.stillOwner(w) {
		wr.finish(w)
		return
	}
	wr.sessions++
	wr.convs = nil
	if w.cfg.Bugs.AcceptBeforeMarker {
		wr.opened = false
		wr.phase = phReplayOffset
		return
	}
	wr.pepoch, wr.opened = w.log.InitProducer(wr.txnID), true
	wr.phase = phMarker
}

func (wr *writer) markerEvent(w *World) *logrecord.Event {
	return &logrecord.Event{V: logrecord.Version, Kind: logrecord.KindTakeover, VShard: wr.v, Epoch: wr.epoch, Worker: wr.wk.id, CreatedAt: time.Unix(w.now, 0).UTC()}
}

// marker commits the takeover marker; its offset bounds the replay.
func (wr *writer) marker(w *World, lost bool) {
	rec, err := w.log.Produce(wr.txnID, wr.pepoch, wr.part, wr.markerEvent(w), w.now)
	if err == nil {
		err = w.log.Commit(wr.txnID, wr.pepoch, w.step)
		if err == nil && lost {
			w.stats.LostCommitReplies++
			err = errCommitUnknown
		}
	} else {
		_ = w.log.Abort(wr.txnID, wr.pepoch)
	}
	if err != nil {
		wr.fail(w)
		return
	}
	if wr.cancelled {
		wr.finish(w)
		return
	}
	wr.markerOff = rec.Offset
	wr.phase = phReplayOffset
}

// replayTail rebuilds every conversation of the vshard with events after
// persist's offset: the sink's state, then the log tail up to the marker.
// Other conversations are loaded from the sink on first touch.
func (wr *writer) replayTail(w *World) {
	end := wr.markerOff
	if w.cfg.Bugs.AcceptBeforeMarker {
		end = w.log.StableOffset(wr.part) // no marker: the log as it is now
	}
	var tail []*logrecord.Event
	if !wr.fromOK || wr.from < end {
		recs, _ := w.log.ReadCommitted(wr.part, wr.from, end)
		for _, r := range recs {
			if r.Event.VShard == wr.v && r.Event.Kind != logrecord.KindTakeover {
				tail = append(tail, r.Event)
			}
		}
	}
	wr.convs = map[string]*shardcore.Conv{}
	for _, e := range tail {
		if _, ok := wr.convs[e.ConversationID]; !ok {
			wr.convs[e.ConversationID] = w.sink.LoadConv(e.ConversationID)
		}
	}
	for _, e := range tail {
		shardcore.Apply(wr.convs[e.ConversationID], e)
	}
	w.stats.Takeovers++
	wr.phase = phAccepting
}

// enqueue is shard.submit: the command waits in the mailbox.
func (wr *writer) enqueue(w *World, att *attempt) {
	c := &call{att: att, cmd: att.op.cmd}
	if w.cfg.Bugs.MembershipOutsideMailbox {
		conv, ok := wr.convs[c.cmd.ConversationID]
		if !ok {
			conv = w.sink.LoadConv(c.cmd.ConversationID)
		}
		c.members = maps.Clone(conv.Members)
	}
	wr.queue = append(wr.queue, c)
}

// process is shard.process up to the commit: load the state the batch
// needs, decide every command in arrival order applying each event at
// once, and produce the events in one transaction.
func (wr *writer) process(w *World) {
	n := min(len(wr.queue), w.cfg.MaxBatch)
	batch := wr.queue[:n:n]
	wr.queue = wr.queue[n:]
	w.stats.Batches++

	// 1. state the batch needs: conversations not cached, dedupe misses
	for _, c := range batch {
		cid := c.cmd.ConversationID
		conv, ok := wr.convs[cid]
		if !ok {
			conv = w.sink.LoadConv(cid)
			wr.convs[cid] = conv
		}
		if shardcore.NeedsDedupeLookup(conv, &c.cmd) {
			if f, ok := w.sink.Lookup(cid, c.cmd.ClientMessageID); ok {
				shardcore.Remember(conv, c.cmd.ClientMessageID, f)
			}
		}
	}

	// 2. decide in arrival order
	replies := make([]*protocol.Reply, len(batch))
	wrote := make([]bool, len(batch))
	var events []*logrecord.Event
	for i, c := range batch {
		conv := wr.convs[c.cmd.ConversationID]
		seen := conv
		if w.cfg.Bugs.MembershipOutsideMailbox && c.members != nil {
			stale := *conv
			stale.Members = c.members
			seen = &stale
		}
		w.msgIDs++
		st := shardcore.Stamp{Now: time.Unix(w.now, 0), MessageID: fmt.Sprintf("m%d", w.msgIDs), VShard: wr.v, Epoch: wr.epoch}
		d := shardcore.Decide(seen, &c.cmd, st, shardcore.Limits{MaxMembers: w.cfg.MaxMembers})
		switch {
		case d.Reject != nil:
			replies[i] = protocol.Rejected(c.att.reqID(), d.Reject)
		case d.Event != nil:
			shardcore.Apply(conv, d.Event)
			events = append(events, d.Event)
			replies[i], wrote[i] = acceptedReply(c, d.Event.Seq, d.Event.MessageID), true
		default:
			replies[i] = acceptedReply(c, d.Seq, d.MessageID)
		}
	}
	if len(events) == 0 {
		if w.cfg.WhatIf.FenceCheckedAnswers && wr.opened && w.log.producer(wr.txnID).epoch != wr.pepoch {
			w.log.Fenced++
			for _, c := range batch {
				wr.answer(w, c, unavailable(c.att, "fenced; retry with the same ids"), false)
			}
			wr.fail(w)
			return
		}
		for i, c := range batch {
			wr.answer(w, c, replies[i], false)
		}
		return
	}

	// 3. produce; any error aborts the whole transaction
	if !wr.opened {
		// AcceptBeforeMarker: fence and mark only now, marker last
		wr.pepoch, wr.opened = w.log.InitProducer(wr.txnID), true
		events = append(events, wr.markerEvent(w))
	}
	for _, e := range events {
		if _, err := w.log.Produce(wr.txnID, wr.pepoch, wr.part, e, w.now); err != nil {
			_ = w.log.Abort(wr.txnID, wr.pepoch)
			for _, c := range batch {
				wr.answer(w, c, unavailable(c.att, "produce failed; retry with the same ids"), false)
			}
			wr.fail(w)
			return
		}
	}
	wr.inflight, wr.replies, wr.wrote = batch, replies, wrote
	wr.phase = phCommitting
	if w.cfg.Bugs.AcceptedBeforeCommit {
		for i, c := range batch {
			wr.answer(w, c, replies[i], wrote[i])
		}
	}
}

func acceptedReply(c *call, seq int64, messageID string) *protocol.Reply {
	r := &protocol.Reply{Op: protocol.OpAccepted, ID: c.att.reqID(), ConversationID: c.cmd.ConversationID, Seq: seq, MessageID: messageID}
	if c.cmd.Op == protocol.OpSend {
		r.ClientMessageID = c.cmd.ClientMessageID
	}
	return r
}

// commit ends the batch's transaction. Only a nil error answers the
// batch; anything else answers unavailable and ends the session.
func (wr *writer) commit(w *World, lost bool) {
	err := w.log.Commit(wr.txnID, wr.pepoch, w.step)
	if err == nil && lost {
		w.stats.LostCommitReplies++
		err = errCommitUnknown
	}
	batch, replies, wrote := wr.inflight, wr.replies, wr.wrote
	wr.inflight, wr.replies, wr.wrote = nil, nil, nil
	if err != nil {
		if err == ErrFenced {
			w.stats.FencedCommits++
		}
		if !w.cfg.Bugs.AcceptedBeforeCommit {
			for _, c := range batch {
				wr.answer(w, c, unavailable(c.att, "commit failed; retry with the same ids"), false)
			}
		}
		wr.fail(w)
		return
	}
	w.stats.Commits++
	wr.phase = phAccepting
	if !w.cfg.Bugs.AcceptedBeforeCommit {
		for i, c := range batch {
			wr.answer(w, c, replies[i], wrote[i])
		}
	}
	// Bound dedupe as tightly as the driver may: keep one result, drop
	// every other that Postgres holds; a retry must then be answered by
	// the lookup.
	for _, c := range batch {
		if conv := wr.convs[c.cmd.ConversationID]; conv != nil {
			shardcore.TrimDedupe(conv, w.sink.MaxSeq(c.cmd.ConversationID), 1, time.Time{})
		}
	}
}

// fail ends the session: the state is thrown away; a stopped writer ends,
// any other re-checks ownership before taking over again.
func (wr *writer) fail(w *World) {
	wr.convs = nil
	if wr.cancelled {
		wr.finish(w)
		return
	}
	wr.phase = phRecheck
}

// recheck is stillOwner: only a writer the owner row still names (worker,
// gen, epoch) opens a new session.
func (wr *writer) recheck(w *World) {
	if wr.stillOwner(w) {
		wr.phase = phOpen
		return
	}
	wr.finish(w)
}

func (wr *writer) stillOwner(w *World) bool {
	o, ok := w.owners.Owner(wr.v)
	return ok && o.Worker == wr.wk.id && o.Gen == wr.wk.gen && o.Epoch == wr.epoch
}

// finish is the end of shard.run: failQueued answers every queued command
// unavailable (the gateway may retry elsewhere).
func (wr *writer) finish(w *World) {
	for _, c := range wr.queue {
		wr.answer(w, c, unavailable(c.att, "vshard %d is moving to another worker", wr.v), false)
	}
	wr.queue, wr.convs = nil, nil
	wr.phase = phDone
}

// answer sends the reply to c, noting whether the writer's producer was
// already fenced (it cannot know).
func (wr *writer) answer(w *World, c *call, r *protocol.Reply, wrote bool) {
	a := w.reply(c.att, r, wrote)
	a.fenced = wr.opened && w.log.producer(wr.txnID).epoch != wr.pepoch
}

// inFlight reports whether the writer holds a produced, uncommitted batch.
func (wr *writer) inFlight() bool { return wr.phase == phCommitting }
