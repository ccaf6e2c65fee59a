package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// Properties, named after the invariants I1–I7 of doc.go.
const (
	// PropLost: an accepted answer whose event is not in the committed log (I1).
	PropLost = "I1 accepted-but-lost"
	// PropUnpersisted: an accepted answer whose event is not in the sink once persist caught up (I1).
	PropUnpersisted = "I1 accepted-but-not-persisted"
	// PropArrival: a conversation's event was written by a vshard it had
	// not arrived at: when it was committed, the committed log placed the
	// conversation at another vshard; or it was produced by the vshard a
	// moved record sent the conversation to before persist had stored that
	// record, so decided from a state that was not loaded from durable
	// state (I2: one writer per conversation; docs/architecture.md rule 25
	// relies on it).
	PropArrival = "I2 written-before-arrival"
	// PropEpochs: a vshard's committed records go back to an older producer epoch (I2).
	PropEpochs = "I2 producer-epoch-order"
	// PropOwnerEpochs: a vshard's committed records go back to an older
	// ownership epoch: a writer of an older epoch committed after a newer
	// owner's record (I2).
	PropOwnerEpochs = "I2 ownership-epoch-order"
	// PropCollision: two committed events of a conversation share a seq (I3).
	PropCollision = "I3 seq-collision"
	// PropRegression: a conversation's seqs go down in log order (I3).
	PropRegression = "I3 seq-regression"
	// PropRealTime: an op accepted before another was sent has a seq that is not smaller (I3).
	PropRealTime = "I3 accepted-before-sent-order"
	// PropSinkConflict: persist found a (conversation, seq) or client_message_id held by another message (I3, I4).
	PropSinkConflict = "I3/I4 sink-conflict"
	// PropDuplicate: two committed events of a conversation share a client_message_id (I4).
	PropDuplicate = "I4 duplicate-client_message_id"
	// PropRetry: a retry of a keyed command answered other than the first result (I4).
	PropRetry = "I4 retry-not-first-result"
	// PropOneEffect: a keyed command took effect twice, or after it was
	// told no: a join answered accepted without a write (its user was a
	// member), or a final rejection, by a writer that later, within
	// RefusalMemory, committed the op for the same key — or the vshard
	// its moved record sent the conversation to did (I4; docs/protocol.md:
	// one command, at most one effect).
	PropOneEffect = "I4 keyed-command-two-effects"
	// PropRemoved: a message from a user who was not a member at its seq (I5).
	PropRemoved = "I5 message-from-non-member"
	// PropProjection: the read model's membership periods of a
	// conversation are not those of its events in seq order up to its
	// projected last seq — after any projection batch, and at the end,
	// when it has applied every event — so a kicked or left user is still
	// a member there, or a member is not (I5; docs/architecture.md rule 25).
	PropProjection = "I5 projected-membership"
	// PropDevices: a device's list differs from the log's, seq-ordered (I6).
	PropDevices = "I6 devices-diverge"
	// PropUngated: an accepted answer left a writer before its event was committed (I7, I1).
	PropUngated = "I7 accepted-before-commit"
	// PropStaleAnswer: an answer that wrote nothing and that no state of the
	// committed log between the attempt's send and the answer justifies (I7).
	PropStaleAnswer = "I7 stale-answer"
	// PropLiveness: the healed world did not answer every op, persist every record and sync every device.
	PropLiveness = "liveness"
	// PropBusyWake: an accepting writer asked to be woken now with nothing
	// to start, so a driver would call Tick in a loop.
	PropBusyWake = "busy-wake"
	// PropCacheBound: after a housekeeping pass a writer caches more
	// conversations than MaxConvs, or than those with events persist had
	// not stored if they are more (a writer's state is bounded:
	// docs/operations.md, "Memory bounds").
	PropCacheBound = "bounded-writer-cache"
)

// check runs the end-of-run properties on the drained world.
func (w *World) check() {
	for _, c := range w.sink.Conflicts {
		w.violate(PropSinkConflict, "%s", c)
	}
	w.checkLog()
	w.checkStale()
	w.checkAnswers()
	w.checkOneEffect()
	w.checkRealTime()
	w.checkProjection()
	w.checkDevices()
}

// convLog returns conv's committed events in commit order: by the step of
// their commit, then by offset (the events of one transaction are in one
// partition). A moved conversation's events are in more than one
// partition, whose offsets do not compare.
func (w *World) convLog(conv string) []*Record {
	recs := slices.Clone(w.log.ConvRecords(conv))
	slices.SortFunc(recs, func(a, b *Record) int {
		if a.CommittedStep != b.CommittedStep {
			return a.CommittedStep - b.CommittedStep
		}
		return int(a.Offset - b.Offset)
	})
	return recs
}

// checkLog: I3 (no collision, no regression), I4 (no duplicate
// client_message_id), I5 (no message from a non-member) and I2 (written
// where it has arrived) on each conversation's committed events, and I2
// on each vshard's records.
func (w *World) checkLog() {
	for _, conv := range w.convs {
		bySeq := map[int64]*Record{}
		cmids := map[string]*Record{}
		r := roster{}
		var top int64
		at, arrived := logrecord.VShard(conv, w.cfg.VShards), (*Record)(nil)
		for _, rec := range w.convLog(conv) {
			e := rec.Event
			w.checkArrival(conv, rec, at, arrived)
			if e.Kind == logrecord.KindMoved && e.ToVShard != nil && e.VShard == at {
				at, arrived = *e.ToVShard, rec
			}
			if prev, ok := bySeq[e.Seq]; ok {
				w.violate(PropCollision, "%s seq %d: %s (%s by %s, epoch %d) at offset %d and %s (%s by %s, epoch %d) at offset %d",
					conv, e.Seq, prev.Event.MessageID, prev.Event.Kind, prev.Event.Sender, prev.Event.Epoch, prev.Offset,
					e.MessageID, e.Kind, e.Sender, e.Epoch, rec.Offset)
			} else if e.Seq < top {
				w.violate(PropRegression, "%s seq %d (%s) committed at offset %d after seq %d", conv, e.Seq, e.MessageID, rec.Offset, top)
			}
			bySeq[e.Seq] = rec
			top = max(top, e.Seq)
			if e.ClientMessageID != "" {
				if prev, ok := cmids[e.ClientMessageID]; ok {
					w.violate(PropDuplicate, "%s client_message_id %s at seq %d (%s) and seq %d (%s)", conv, e.ClientMessageID, prev.Event.Seq, prev.Event.Kind, e.Seq, e.Kind)
				} else {
					cmids[e.ClientMessageID] = rec
				}
			}
			if e.Kind == logrecord.KindMessage {
				if !r[e.Sender] {
					w.violate(PropRemoved, "%s seq %d: message %s from %s, who is not a member there (members %v)", conv, e.Seq, e.ClientMessageID, e.Sender, sortedKeys(r))
				}
			}
			r.apply(e)
		}
	}
	for p := 0; p < w.log.Partitions(); p++ {
		pepoch, oepoch := map[int]int64{}, map[int]int64{}
		for _, rec := range w.log.Records(int32(p)) {
			if !rec.Committed() {
				continue
			}
			v := rec.Event.VShard
			if rec.ProducerEpoch < pepoch[v] {
				w.violate(PropEpochs, "vshard %d: producer epoch %d committed at offset %d after epoch %d", v, rec.ProducerEpoch, rec.Offset, pepoch[v])
			}
			if rec.Event.Epoch < oepoch[v] {
				w.stats.EpochRegressions++
				w.violate(PropOwnerEpochs, "vshard %d: %s of ownership epoch %d committed at offset %d after epoch %d", v, rec.Event.Kind, rec.Event.Epoch, rec.Offset, oepoch[v])
			}
			pepoch[v], oepoch[v] = max(pepoch[v], rec.ProducerEpoch), max(oepoch[v], rec.Event.Epoch)
		}
	}
}

// checkArrival: I2 for conv's committed event rec, when its committed log
// before it places conv at vshard at, brought there by the moved record
// arrived (nil: never moved).
func (w *World) checkArrival(conv string, rec *Record, at int, arrived *Record) {
	e := rec.Event
	if e.VShard != at {
		w.violate(PropArrival, "%s seq %d (%s) written by vshard %d at step %d; the committed log places it at vshard %d", conv, e.Seq, e.Kind, e.VShard, rec.CommittedStep, at)
		return
	}
	if arrived == nil {
		return
	}
	stored, ok := w.sink.StoredAt(conv, arrived.Event.Seq)
	switch {
	case !ok:
		w.violate(PropArrival, "%s seq %d (%s) produced by vshard %d at step %d; persist never stored the moved record (seq %d) that sent it there",
			conv, e.Seq, e.Kind, e.VShard, rec.ProducedStep, arrived.Event.Seq)
	case stored >= rec.ProducedStep:
		w.violate(PropArrival, "%s seq %d (%s) produced by vshard %d at step %d; the moved record (seq %d) that sent it there was stored by persist at step %d",
			conv, e.Seq, e.Kind, e.VShard, rec.ProducedStep, arrived.Event.Seq, stored)
	}
}

// checkAnswers: I1 (every accepted answer's event is committed and
// persisted) and I4 (every answer to a command with a client_message_id
// is the first result; a join answered accepted without a write is
// checked by checkOneEffect).
func (w *World) checkAnswers() {
	for _, o := range w.ops {
		conv := o.cmd.ConversationID
		for _, a := range o.answers {
			r := a.reply
			if r.Op != protocol.OpAccepted {
				continue
			}
			if !w.inLog(conv, r.Seq, r.MessageID) {
				w.violate(PropLost, "op%d (%s %s by %s) accepted seq %d %s, not in the committed log", o.id, o.cmd.Op, conv, o.cmd.Sender, r.Seq, r.MessageID)
			}
			if e, ok := w.sink.rows[conv][r.Seq]; !ok || (r.MessageID != "" && e.MessageID != r.MessageID) {
				w.violate(PropUnpersisted, "op%d (%s %s) accepted seq %d %s, not in the sink", o.id, o.cmd.Op, conv, r.Seq, r.MessageID)
			}
		}
		if o.cmd.ClientMessageID == "" || o.cmd.Op == protocol.OpCreate {
			continue
		}
		first, committed := w.firstMessage(conv, o.cmd.ClientMessageID)
		for _, a := range o.answers {
			r := a.reply
			switch {
			case noopJoin(o, a) && (!committed || a.sentStep <= first.CommittedStep):
				// nothing to do then: the key's first result, as long as
				// no event has it
			case !committed:
				if r.Op == protocol.OpAccepted {
					w.violate(PropRetry, "op%d %s %s/%s accepted seq %d but no event with that id is committed", o.id, o.cmd.Op, conv, o.cmd.ClientMessageID, r.Seq)
				}
			case r.Op == protocol.OpAccepted:
				if r.Seq != first.Event.Seq || r.MessageID != first.Event.MessageID {
					w.violate(PropRetry, "op%d %s %s/%s answered seq %d %q at step %d; the first result is seq %d %s, committed at step %d",
						o.id, o.cmd.Op, conv, o.cmd.ClientMessageID, r.Seq, r.MessageID, a.sentStep, first.Event.Seq, first.Event.MessageID, first.CommittedStep)
				}
			case a.sentStep > first.CommittedStep && first.Event.Sender == o.cmd.Sender:
				w.stale(PropRetry, a, "op%d %s %s/%s rejected %s at step %d after its first result (seq %d) was committed at step %d",
					o.id, o.cmd.Op, conv, o.cmd.ClientMessageID, r.Code, a.sentStep, first.Event.Seq, first.CommittedStep)
			}
		}
	}
}

// noopJoin reports whether a is the answer to a join of a current
// member: accepted, nothing written, no message id.
func noopJoin(o *op, a *answer) bool {
	return o.cmd.Op == protocol.OpJoin && a.reply.Op == protocol.OpAccepted && !a.wrote && a.reply.MessageID == ""
}

// checkOneEffect: I4 for the answers a writer keeps for a key (docs/
// protocol.md, "Attempts in flight"): a keyed join of a current member
// answered accepted without a write, and a final rejection (forbidden,
// not_found, too_large). The writer keeps such an answer for
// RefusalMemory, and the moved record it commits for the conversation
// meanwhile carries it to the vshard the conversation moves to: neither
// may commit the sender's op for the key in that time, whatever happened
// to the membership meanwhile — one command, at most one effect, and
// never one told no. (A new owner after a failover decides the key
// again: the memory is not in the log.)
func (w *World) checkOneEffect() {
	memory := int64(refusalMemory / time.Second)
	for _, o := range w.ops {
		if o.cmd.ClientMessageID == "" || o.cmd.Op == protocol.OpRead {
			continue
		}
		for _, a := range o.decided {
			if !keptAnswer(o, a) {
				continue
			}
			if noopJoin(o, a) {
				w.stats.NoopJoins++
				for _, o2 := range w.ops {
					if o2.cmd.ConversationID == o.cmd.ConversationID && o2.cmd.ClientMessageID == o.cmd.ClientMessageID {
						for _, at := range o2.attempts {
							if at.sentStep > a.sentStep {
								w.stats.NoopJoinRetries++
							}
						}
					}
				}
			}
			recs := w.log.ConvRecords(o.cmd.ConversationID)
			for _, rec := range recs {
				e := rec.Event
				if e.ClientMessageID != o.cmd.ClientMessageID || e.Sender != o.cmd.Sender || e.Kind != opKinds[o.cmd.Op] ||
					rec.CommittedStep <= a.sentStep || e.CreatedAt.Unix()-a.sentAt > memory {
					continue
				}
				by := "the same writer"
				if e.VShard != a.by.v || e.Epoch != a.by.epoch {
					m := carriedBy(recs, a, e)
					if m == nil {
						continue
					}
					by = fmt.Sprintf("v%d, where its moved record at seq %d carried the answer", e.VShard, m.Seq)
					w.stats.CarriedVerdictsTested++
				}
				w.violate(PropOneEffect, "op%d %s in %s by %s (key %s): %s answered %s without a write at step %d, then %s committed %s seq %d for the key at step %d",
					o.id, o.cmd.Op, o.cmd.ConversationID, o.cmd.Sender, o.cmd.ClientMessageID, a.by, answerText(a.reply), a.sentStep, by, e.Kind, e.Seq, rec.CommittedStep)
			}
		}
	}
}

// keptAnswer reports whether writer answer a to keyed op o is one the
// writer keeps for the key: a join of a current member, or a final
// rejection.
func keptAnswer(o *op, a *answer) bool {
	if a.by == nil || a.wrote {
		return false
	}
	if noopJoin(o, a) {
		return true
	}
	r := a.reply
	return r.Op == protocol.OpRejected && (r.Code == protocol.CodeForbidden || r.Code == protocol.CodeNotFound || r.Code == protocol.CodeTooLarge)
}

// carriedBy returns the moved record that carried answer a to the writer
// of event e: committed by a's writer (its vshard and epoch) after a, to
// e's vshard, the conversation's last moved record below e's seq (nil:
// none did).
func carriedBy(recs []*Record, a *answer, e *logrecord.Event) *logrecord.Event {
	var last *Record
	for _, r := range recs {
		if m := r.Event; m.Kind == logrecord.KindMoved && m.Seq < e.Seq && (last == nil || m.Seq > last.Event.Seq) {
			last = r
		}
	}
	if last == nil {
		return nil
	}
	m := last.Event
	if m.VShard != a.by.v || m.Epoch != a.by.epoch || last.CommittedStep < a.sentStep || m.ToVShard == nil || *m.ToVShard != e.VShard {
		return nil
	}
	return m
}

func answerText(r *protocol.Reply) string {
	if r.Op == protocol.OpRejected {
		return string(r.Code)
	}
	return fmt.Sprintf("accepted seq %d", r.Seq)
}

// opKinds is the event kind each write op commits.
var opKinds = map[string]string{
	protocol.OpCreate: logrecord.KindCreate, protocol.OpJoin: logrecord.KindJoin, protocol.OpKick: logrecord.KindKick,
	protocol.OpLeave: logrecord.KindLeave, protocol.OpSend: logrecord.KindMessage,
}

func (w *World) inLog(conv string, seq int64, messageID string) bool {
	for _, rec := range w.log.ConvRecords(conv) {
		if rec.Event.Seq == seq && (messageID == "" || rec.Event.MessageID == messageID) {
			return true
		}
	}
	return false
}

// firstMessage is the first committed event of conv with cmid, in log
// order.
func (w *World) firstMessage(conv, cmid string) (*Record, bool) {
	for _, rec := range w.convLog(conv) {
		if rec.Event.ClientMessageID == cmid {
			return rec, true
		}
	}
	return nil, false
}

// checkRealTime: an op whose accepted answer arrived before another op was
// first sent has the smaller seq, when the other op's answer is an event
// made for it (a fresh op).
func (w *World) checkRealTime() {
	for _, a := range w.ops {
		if !a.done || a.final.Op != protocol.OpAccepted {
			continue
		}
		for _, b := range w.ops {
			if b == a || !b.fresh || !b.done || b.final.Op != protocol.OpAccepted || b.cmd.ConversationID != a.cmd.ConversationID {
				continue
			}
			if b.issuedStep > a.doneStep && b.final.Seq <= a.final.Seq {
				w.violate(PropRealTime, "%s: op%d (%s) accepted seq %d at step %d, op%d (%s) sent at step %d got seq %d",
					a.cmd.ConversationID, a.id, a.cmd.Op, a.final.Seq, a.doneStep, b.id, b.cmd.Op, b.issuedStep, b.final.Seq)
			}
		}
	}
}

// seqOrdered is conv's committed events in seq order (the first committed
// of a seq, if two share it).
func (w *World) seqOrdered(conv string) []*logrecord.Event {
	var evs []*logrecord.Event
	seen := map[int64]bool{}
	for _, rec := range w.convLog(conv) {
		if !seen[rec.Event.Seq] {
			seen[rec.Event.Seq] = true
			evs = append(evs, rec.Event)
		}
	}
	slices.SortFunc(evs, func(a, b *logrecord.Event) int { return int(a.Seq - b.Seq) })
	return evs
}

// project runs one projection transaction on parts and checks rule 25 on
// each conversation it touched.
func (w *World) project(parts []int32) {
	for _, conv := range w.proj.Poll(w, parts, w.cfg.PersistBatch) {
		w.checkProjected(conv, fmt.Sprintf("after a batch of %v", parts), w.proj.LastSeq(conv))
	}
}

// checkProjection: I5 on the read model once it has applied everything —
// every conversation's periods are those of all its events, and its
// projected last seq is its last event's.
func (w *World) checkProjection() {
	for _, conv := range w.convs {
		evs := w.seqOrdered(conv)
		if len(evs) == 0 {
			continue
		}
		top := evs[len(evs)-1].Seq
		if last := w.proj.LastSeq(conv); last != top {
			w.violate(PropProjection, "%s projected up to seq %d, its last event is seq %d", conv, last, top)
		}
		w.checkProjected(conv, "at the end", top)
	}
}

// checkProjected: conv's projected periods are those of its events in seq
// order up to seq upTo (each broken conversation is reported once).
func (w *World) checkProjected(conv, when string, upTo int64) {
	if w.projBroken[conv] {
		return
	}
	got, want := w.proj.Periods(conv), logPeriods(w.seqOrdered(conv), upTo)
	if !slices.Equal(got, want) {
		w.projBroken[conv] = true
		w.violate(PropProjection, "%s %s (projected to seq %d): memberships %s, its events up to seq %d say %s",
			conv, when, w.proj.LastSeq(conv), periodsString(got), upTo, periodsString(want))
	}
}

func periodsString(ps []period) string {
	b := []byte("[")
	for i, p := range ps {
		if i > 0 {
			b = append(b, ' ')
		}
		b = fmt.Appendf(b, "%s:%d-", p.user, p.joined)
		if p.left == 0 {
			b = append(b, "open"...)
		} else {
			b = fmt.Appendf(b, "%d", p.left)
		}
	}
	return string(append(b, ']'))
}

// checkDevices: I6 — every device's list of a conversation is what its
// user may see of the committed log, in seq order.
func (w *World) checkDevices() {
	for _, conv := range w.convs {
		truth := w.seqOrdered(conv)
		want := map[string]string{}
		for _, d := range w.devices {
			if _, ok := want[d.user]; !ok {
				want[d.user] = listString(visibleTo(truth, d.user))
			}
			if got := listString(d.got[conv]); got != want[d.user] {
				w.violate(PropDevices, "%s on device %s/%d: %s, the log says %s", conv, d.user, d.n, got, want[d.user])
			}
		}
	}
}

func listString(evs []*logrecord.Event) string {
	b := []byte("[")
	for i, e := range evs {
		if i > 0 {
			b = append(b, ' ')
		}
		b = fmt.Appendf(b, "%d:%s", e.Seq, e.MessageID)
	}
	return string(append(b, ']'))
}
