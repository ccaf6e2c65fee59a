package sim

import (
	"fmt"
	"time"

	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// checkStale checks every answer that wrote nothing (a rejection, a
// retried send, a join of a member): some state of the committed log
// between the attempt's send and the answer must give the same decision.
// An answer from a writer whose producer was not fenced must always pass. The
// real writer does give such answers once fenced (doc.go, "What the model
// found"): unless Config.StrictAnswers, those are counted, not violations.
func (w *World) checkStale() {
	for _, o := range w.ops {
		for _, a := range o.answers {
			if a.wrote || w.justified(o, a) || w.remembered(o, a) || w.carriedVerdict(o, a) {
				continue
			}
			w.stale(PropStaleAnswer, a, "op%d %s %s by %s (user %s, cmid %s) sent at step %d answered %s %s seq %d at step %d; no state of the log in between gives that answer",
				o.id, o.cmd.Op, o.cmd.ConversationID, o.cmd.Sender, o.cmd.UserID, o.cmd.ClientMessageID, a.att.sentStep, a.reply.Op, a.reply.Code, a.reply.Seq, a.sentStep)
		}
	}
}

// stale reports an answer the log contradicts: a violation of prop, or,
// when a fenced writer gave it and answers are not strict, a count.
func (w *World) stale(prop string, a *answer, format string, args ...any) {
	if a.counted {
		return
	}
	if a.fenced && !w.cfg.StrictAnswers {
		a.counted = true
		w.stats.StaleAnswers++
		if w.staleExample == "" {
			w.staleExample = fmt.Sprintf(format, args...)
		}
		return
	}
	w.violate(prop, format+" (writer fenced: %v)", append(args, a.fenced)...)
}

// justified reports whether Decide on the committed log as it was at some
// point between the attempt's send and the answer gives the same answer. The
// points are the log's prefixes, one event at a time: the commands of one
// batch are ordered between the events of its transaction.
func (w *World) justified(o *op, a *answer) bool {
	recs := w.convLog(o.cmd.ConversationID)
	c := shardcore.NewConv()
	for k := 0; k <= len(recs); k++ {
		if k > 0 {
			shardcore.Apply(c, recs[k-1].Event)
		}
		if k < len(recs) && recs[k].CommittedStep <= a.att.sentStep {
			continue // a later prefix was already the log when the attempt was sent
		}
		if k > 0 && recs[k-1].CommittedStep > a.sentStep {
			break
		}
		// Decided where the conversation is at that prefix.
		st := shardcore.Stamp{Now: time.Unix(0, 0), VShard: c.At, Dedicated: c.Moved}
		d := shardcore.Decide(c, &o.cmd, st, shardcore.Limits{MaxMembers: w.cfg.MaxMembers})
		switch {
		case d.Event != nil:
		case d.Reject != nil:
			if a.reply.Op == protocol.OpRejected && a.reply.Code == d.Reject.Code {
				return true
			}
		default:
			if a.reply.Op == protocol.OpAccepted && a.reply.Seq == d.Seq {
				return true
			}
		}
	}
	return false
}

// remembered reports whether an answer that wrote nothing repeats the
// first decision of its key: an earlier answer, to an attempt of an op
// with the same key, sender and op, that the log justified and that gave
// the same rejection, or — a join of a current member — the same
// acceptance from the same writer, or from the vshard that writer's
// moved record carried it to. The writer answers every attempt of a key
// with that first answer for a while (docs/protocol.md, "Attempts in
// flight"), however the state changed since, and its moved record carries
// the answer on.
func (w *World) remembered(o *op, a *answer) bool {
	noop := noopJoin(o, a)
	if o.cmd.ClientMessageID == "" || (a.reply.Op != protocol.OpRejected && !noop) {
		return false
	}
	same := func(o2 *op, a2 *answer) bool {
		if noop {
			return noopJoin(o2, a2) && a2.reply.Seq == a.reply.Seq && (a2.by == a.by || w.carried(o.cmd.ConversationID, a2, a.by))
		}
		return a2.reply.Op == protocol.OpRejected && a2.reply.Code == a.reply.Code && a2.reply.Code != protocol.CodeUnavailable
	}
	for _, o2 := range w.ops {
		if !sameKey(o, o2) {
			continue
		}
		for _, a2 := range o2.decided {
			if a2 != a && !a2.wrote && a2.sentStep <= a.sentStep && same(o2, a2) && w.justified(o2, a2) {
				return true
			}
		}
	}
	return false
}

// carried reports whether moved records of conv carried answer a2 to
// writer by: a moved record committed by a2's writer (its vshard and
// epoch) after a2, then any chain of later moved records from the vshards
// reached (the writer it moves to adopts the answers and its own moved
// record carries them on), reaching by's vshard.
func (w *World) carried(conv string, a2 *answer, by *writer) bool {
	if a2.by == nil || by == nil {
		return false
	}
	return movedTo(w.log.ConvRecords(conv), a2.sentStep, func(r *Record) bool {
		return r.Event.VShard == a2.by.v && r.Event.Epoch == a2.by.epoch
	})[by.v]
}

// carriedVerdict reports whether answer a, which wrote nothing, repeats a
// verdict that a committed moved record of the conversation carried: the
// decision of an attempt decided in the moving batch, which its client may
// never have heard (the commit's reply was lost, so the writer answered
// unavailable), but which the writer the conversation moved to adopted
// and answers every later attempt of the key with. Some attempt of the
// key must have been sent before that record's commit, and the log must
// justify the verdict between that send and the commit. A join of a
// current member must also come from a vshard the record's chain of moves
// reached.
func (w *World) carriedVerdict(o *op, a *answer) bool {
	noop := noopJoin(o, a)
	if o.cmd.ClientMessageID == "" || (a.reply.Op != protocol.OpRejected && !noop) || a.reply.Code == protocol.CodeUnavailable {
		return false
	}
	recs := w.log.ConvRecords(o.cmd.ConversationID)
	for _, r := range recs {
		m := r.Event
		if m.Kind != logrecord.KindMoved || r.CommittedStep == 0 || r.CommittedStep > a.sentStep {
			continue
		}
		for _, v := range m.Verdicts {
			if v.ClientMessageID != o.cmd.ClientMessageID || v.Sender != o.cmd.Sender || v.Op != o.cmd.Op {
				continue
			}
			if noop {
				if v.Code != "" || v.Seq != a.reply.Seq || a.by == nil || !movedTo(recs, r.CommittedStep, func(x *Record) bool { return x == r })[a.by.v] {
					continue
				}
			} else if v.Code != string(a.reply.Code) {
				continue
			}
			if w.decidedBefore(o, a.reply, r.CommittedStep) {
				return true
			}
		}
	}
	return false
}

// decidedBefore reports whether some attempt of an op with o's key, sender
// and op, sent at or before step, could have been answered reply: the log
// justifies reply between that attempt's send and step.
func (w *World) decidedBefore(o *op, reply *protocol.Reply, step int) bool {
	for _, o2 := range w.ops {
		if !sameKey(o, o2) {
			continue
		}
		for _, att := range o2.attempts {
			if att.sentStep <= step && w.justified(o2, &answer{att: att, reply: reply, sentStep: step}) {
				return true
			}
		}
	}
	return false
}

// sameKey reports whether ops o and o2 are attempts of one key: the same
// conversation, client_message_id, sender and op.
func sameKey(o, o2 *op) bool {
	return o2.cmd.ConversationID == o.cmd.ConversationID && o2.cmd.ClientMessageID == o.cmd.ClientMessageID &&
		o2.cmd.Sender == o.cmd.Sender && o2.cmd.Op == o.cmd.Op
}

// movedTo returns the vshards that moved records of recs (one
// conversation's, in commit order) carried it to, starting from the
// records start picks and following every later moved record from a
// vshard reached; records committed before step are passed over.
func movedTo(recs []*Record, step int, start func(*Record) bool) map[int]bool {
	reached := map[int]bool{}
	for _, r := range recs {
		m := r.Event
		if m.Kind != logrecord.KindMoved || m.ToVShard == nil || r.CommittedStep == 0 || r.CommittedStep < step {
			continue
		}
		if start(r) || reached[m.VShard] {
			reached[*m.ToVShard] = true
		}
	}
	return reached
}
