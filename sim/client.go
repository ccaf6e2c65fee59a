package sim

import (
	"fmt"

	"github.com/chatpipe/chatpipe/protocol"
	"github.com/chatpipe/chatpipe/shardcore"
)

// op is one client operation: a command the client keeps retrying, with the
// same ids, until it gets a definitive answer (accepted, or rejected with
// any code but unavailable).
type op struct {
	id  int
	cmd shardcore.Command
	// fresh is true when the op's answer must be a new event created after
	// the op was issued: a create, a send with a client_message_id never
	// used before, a kick or a leave.
	fresh bool

	issuedStep int
	attempts   []*attempt
	lastSent   int64 // tick of the last attempt
	retryable  bool  // the last attempt was answered unavailable

	done     bool
	final    *protocol.Reply
	doneStep int
	answers  []*answer // every definitive answer, in arrival order
	// decided is every answer a writer sent for it, delivered or lost.
	decided    []*answer
	retryCount int
}

// attempt is one try of an op.
type attempt struct {
	op       *op
	n        int
	sentStep int
}

func (a *attempt) reqID() string { return fmt.Sprintf("op%d.%d", a.op.id, a.n) }

// issue starts a new op and sends its first attempt.
func (w *World) issue(cmd shardcore.Command, fresh bool) *op {
	o := &op{id: len(w.ops) + 1, cmd: cmd, fresh: fresh, issuedStep: w.step}
	w.ops = append(w.ops, o)
	w.send(o)
	return o
}

func (w *World) send(o *op) {
	a := &attempt{op: o, n: len(o.attempts) + 1, sentStep: w.step}
	o.attempts = append(o.attempts, a)
	o.lastSent, o.retryable = w.now, false
	w.route(a)
}

// needsRetry reports whether the client would try o again now: it was
// answered unavailable (and backed off a tick) or its last attempt timed
// out (lost request or reply, paused or crashed worker).
func (w *World) needsRetry(o *op) bool {
	if o.done {
		return false
	}
	return (o.retryable && w.now > o.lastSent) || w.now >= o.lastSent+w.cfg.ClientTimeout
}

// retry sends another attempt of o with the same ids.
func (w *World) retry(o *op) {
	o.retryCount++
	w.stats.Retries++
	w.send(o)
}

// receive is the client getting an answer.
func (w *World) receive(a *attempt, ans *answer) {
	o := a.op
	if ans.reply.Op == protocol.OpRejected && ans.reply.Code == protocol.CodeUnavailable {
		if !o.done && a.n == len(o.attempts) {
			o.retryable = true
		}
		return
	}
	o.answers = append(o.answers, ans)
	if !o.done {
		o.done, o.final, o.doneStep = true, ans.reply, w.step
	}
}

// issueRandom draws a new op: a send, a duplicate of an earlier send, a
// kick, a join or a leave.
func (w *World) issueRandom() {
	conv := w.convs[w.ch.Choose(len(w.convs), "conversation")]
	user := w.users[w.ch.Choose(len(w.users), "user")]
	switch k := w.ch.Choose(10, "op kind"); {
	case k < 5:
		w.sends++
		cmd := shardcore.Command{Op: protocol.OpSend, ConversationID: conv, Sender: user,
			ClientMessageID: fmt.Sprintf("%s-%d", user, w.sends), Body: "hello"}
		w.issue(cmd, true)
	case k < 7:
		var earlier []*op
		for _, o := range w.ops {
			if o.cmd.Op == protocol.OpSend {
				earlier = append(earlier, o)
			}
		}
		if len(earlier) == 0 {
			return
		}
		// the user's app sends the same message again (reconnect, double tap)
		w.issue(earlier[w.ch.Choose(len(earlier), "duplicate of")].cmd, false)
	case k == 7:
		target := w.users[1+w.ch.Choose(len(w.users)-1, "kicked")]
		w.issue(shardcore.Command{Op: protocol.OpKick, ConversationID: conv, Sender: w.users[0], UserID: target}, true)
	case k == 8:
		target := w.users[w.ch.Choose(len(w.users), "joined")]
		w.issue(shardcore.Command{Op: protocol.OpJoin, ConversationID: conv, Sender: user, UserID: target}, false)
	default:
		w.issue(shardcore.Command{Op: protocol.OpLeave, ConversationID: conv, Sender: user}, true)
	}
}
