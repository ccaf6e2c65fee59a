package sim

import (
	"fmt"
	"slices"

	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// Properties, named after the invariants I1–I7 of doc.go.
const (
	// PropLost: an accepted answer whose event is not in the committed log (I1).
	PropLost = "I1 accepted-but-lost"
	// PropUnpersisted: an accepted answer whose event is not in the sink once persist caught up (I1).
	PropUnpersisted = "I1 accepted-but-not-persisted"
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
	// PropDuplicate: two committed messages of a conversation share a client_message_id (I4).
	PropDuplicate = "I4 duplicate-client_message_id"
	// PropRetry: a retry answered other than the first result (I4).
	PropRetry = "I4 retry-not-first-result"
	// PropRemoved: a message from a user who was not a member at its seq (I5).
	PropRemoved = "I5 message-from-non-member"
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
)

// check runs the end-of-run properties on the drained world.
func (w *World) check() {
	for _, c := range w.sink.Conflicts {
		w.violate(PropSinkConflict, "%s", c)
	}
	w.checkLog()
	w.checkStale()
	w.checkAnswers()
	w.checkRealTime()
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
// client_message_id), I5 (no message from a non-member) on each
// conversation's committed events, and I2 on each vshard's records.
func (w *World) checkLog() {
	for _, conv := range w.convs {
		bySeq := map[int64]*Record{}
		cmids := map[string]*Record{}
		r := roster{}
		var top int64
		for _, rec := range w.convLog(conv) {
			e := rec.Event
			if prev, ok := bySeq[e.Seq]; ok {
				w.violate(PropCollision, "%s seq %d: %s (%s by %s, epoch %d) at offset %d and %s (%s by %s, epoch %d) at offset %d",
					conv, e.Seq, prev.Event.MessageID, prev.Event.Kind, prev.Event.Sender, prev.Event.Epoch, prev.Offset,
					e.MessageID, e.Kind, e.Sender, e.Epoch, rec.Offset)
			} else if e.Seq < top {
				w.violate(PropRegression, "%s seq %d (%s) committed at offset %d after seq %d", conv, e.Seq, e.MessageID, rec.Offset, top)
			}
			bySeq[e.Seq] = rec
			top = max(top, e.Seq)
			if e.Kind == logrecord.KindMessage {
				if prev, ok := cmids[e.ClientMessageID]; ok {
					w.violate(PropDuplicate, "%s client_message_id %s at seq %d and seq %d", conv, e.ClientMessageID, prev.Event.Seq, e.Seq)
				} else {
					cmids[e.ClientMessageID] = rec
				}
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

// checkAnswers: I1 (every accepted answer's event is committed and
// persisted) and I4 (every answer to a send of a client_message_id is the
// first result).
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
		if o.cmd.Op != protocol.OpSend {
			continue
		}
		first, committed := w.firstMessage(conv, o.cmd.ClientMessageID)
		for _, a := range o.answers {
			r := a.reply
			switch {
			case !committed:
				if r.Op == protocol.OpAccepted {
					w.violate(PropRetry, "op%d send %s/%s accepted seq %d but no message with that id is committed", o.id, conv, o.cmd.ClientMessageID, r.Seq)
				}
			case r.Op == protocol.OpAccepted:
				if r.Seq != first.Event.Seq || r.MessageID != first.Event.MessageID {
					w.violate(PropRetry, "op%d send %s/%s answered seq %d %s; the first result is seq %d %s",
						o.id, conv, o.cmd.ClientMessageID, r.Seq, r.MessageID, first.Event.Seq, first.Event.MessageID)
				}
			case a.sentStep > first.CommittedStep && first.Event.Sender == o.cmd.Sender:
				w.stale(PropRetry, a, "op%d send %s/%s rejected %s at step %d after its first result (seq %d) was committed at step %d",
					o.id, conv, o.cmd.ClientMessageID, r.Code, a.sentStep, first.Event.Seq, first.CommittedStep)
			}
		}
	}
}

func (w *World) inLog(conv string, seq int64, messageID string) bool {
	for _, rec := range w.log.ConvRecords(conv) {
		if rec.Event.Seq == seq && (messageID == "" || rec.Event.MessageID == messageID) {
			return true
		}
	}
	return false
}

// firstMessage is the first committed message of conv with cmid, in log order.
func (w *World) firstMessage(conv, cmid string) (*Record, bool) {
	for _, rec := range w.convLog(conv) {
		if rec.Event.Kind == logrecord.KindMessage && rec.Event.ClientMessageID == cmid {
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

// checkDevices: I6 — every device's list of a conversation is what its
// user may see of the committed log, in seq order.
func (w *World) checkDevices() {
	for _, conv := range w.convs {
		var truth []*logrecord.Event
		seen := map[int64]bool{}
		for _, rec := range w.convLog(conv) {
			if !seen[rec.Event.Seq] {
				seen[rec.Event.Seq] = true
				truth = append(truth, rec.Event)
			}
		}
		slices.SortFunc(truth, func(a, b *logrecord.Event) int { return int(a.Seq - b.Seq) })
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
