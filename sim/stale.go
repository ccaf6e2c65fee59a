package sim

import (
	"fmt"
	"time"

	"github.com/chatpipe/chatpipe/protocol"
	"github.com/chatpipe/chatpipe/shardcore"
)

// checkStale counts answers that wrote nothing (rejections, retried sends,
// joins of members) and that no state of the committed log justifies
// between the op's first send and the answer: a writer answered from state
// the log had already moved past. It is a measurement, not a property: the
// real writer answers such commands without any fence (see doc.go).
func (w *World) checkStale() {
	for _, o := range w.ops {
		for _, a := range o.answers {
			if a.wrote || w.justified(o, a) {
				continue
			}
			w.stats.StaleAnswers++
			if a.fenced {
				w.stats.StaleFromFenced++
			}
			if w.staleExample == "" {
				w.staleExample = fmt.Sprintf("op%d %s %s by %s (user %s) sent at step %d answered %s %s seq %d at step %d",
					o.id, o.cmd.Op, o.cmd.ConversationID, o.cmd.Sender, o.cmd.UserID, o.issuedStep, a.reply.Op, a.reply.Code, a.reply.Seq, a.sentStep)
			}
		}
	}
}

// justified reports whether Decide on the committed log as it was at some
// point between o's first send and the answer gives the same answer. The
// points are the log's prefixes, one event at a time: the commands of one
// batch are ordered between the events of its transaction.
func (w *World) justified(o *op, a *answer) bool {
	recs := w.convLog(o.cmd.ConversationID)
	c := shardcore.NewConv()
	for k := 0; k <= len(recs); k++ {
		if k > 0 {
			shardcore.Apply(c, recs[k-1].Event)
		}
		if k < len(recs) && recs[k].CommittedStep <= o.issuedStep {
			continue // a later prefix was already the log when o was sent
		}
		if k > 0 && recs[k-1].CommittedStep > a.sentStep {
			break
		}
		d := shardcore.Decide(c, &o.cmd, shardcore.Stamp{Now: time.Unix(0, 0)}, shardcore.Limits{MaxMembers: w.cfg.MaxMembers})
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
