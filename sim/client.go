package sim

import (
	"fmt"
	"slices"

	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/protocol"
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

// issueRandom draws a new op: a send, the same command again (a send or
// a keyed membership command), a send to a conversation nobody created
// (refused), a kick, a join or a leave. Membership commands carry a
// client_message_id three times in four, as the Go client's always do.
func (w *World) issueRandom() {
	conv := w.convs[w.ch.Choose(len(w.convs), "conversation")]
	user := w.users[w.ch.Choose(len(w.users), "user")]
	switch k := w.ch.Choose(14, "op kind"); {
	case k < 5:
		w.sends++
		cmd := shardcore.Command{Op: protocol.OpSend, ConversationID: conv, Sender: user,
			ClientMessageID: fmt.Sprintf("%s-%d", user, w.sends), Body: "hello"}
		w.issue(cmd, true)
	case k < 8:
		// the user's app sends the same command again (reconnect, double
		// tap, a retry after its own timeout): a send (k 5), or a keyed
		// membership command (k 6, 7) — a keyed join whose user was
		// kicked or left after it was sent, when there is one
		send := k == 5
		var earlier, rejoins []*op
		for _, o := range w.ops {
			if o.cmd.ClientMessageID == "" || o.cmd.Op == protocol.OpCreate || (o.cmd.Op == protocol.OpSend) != send {
				continue
			}
			earlier = append(earlier, o)
			if o.cmd.Op == protocol.OpJoin && w.removedAfter(o) {
				rejoins = append(rejoins, o)
			}
		}
		if len(rejoins) > 0 {
			earlier = rejoins
		}
		if len(earlier) == 0 {
			return
		}
		w.issue(earlier[w.ch.Choose(len(earlier), "again")].cmd, false)
	case k == 8:
		if len(w.ghosts) == 0 {
			return
		}
		w.sends++
		ghost := w.ghosts[w.ch.Choose(len(w.ghosts), "ghost")]
		w.issue(shardcore.Command{Op: protocol.OpSend, ConversationID: ghost, Sender: user,
			ClientMessageID: fmt.Sprintf("%s-%d", user, w.sends), Body: "anyone?"}, true)
	case k == 9:
		target := w.users[1+w.ch.Choose(len(w.users)-1, "kicked")]
		if u, ok := w.joinedUser(conv); ok && u != w.users[0] {
			target = u
		}
		w.issue(shardcore.Command{Op: protocol.OpKick, ConversationID: conv, Sender: w.users[0], UserID: target, ClientMessageID: w.key(w.users[0])}, true)
	case k < 12:
		target := w.users[w.ch.Choose(len(w.users), "joined")]
		w.issue(shardcore.Command{Op: protocol.OpJoin, ConversationID: conv, Sender: user, UserID: target, ClientMessageID: w.key(user)}, false)
	default:
		if u, ok := w.joinedUser(conv); ok {
			user = u
		}
		w.issue(shardcore.Command{Op: protocol.OpLeave, ConversationID: conv, Sender: user, ClientMessageID: w.key(user)}, true)
	}
}

// key is the client_message_id of a membership command of user: a new
// one three times in four, none otherwise.
func (w *World) key(user string) string {
	if w.ch.Choose(4, "keyed") == 0 {
		return ""
	}
	w.sends++
	return fmt.Sprintf("%s-k%d", user, w.sends)
}

// joinedUser is, half of the time, the user of an earlier join in conv
// (someone added to a group is the one who leaves it, or is kicked).
func (w *World) joinedUser(conv string) (string, bool) {
	var users []string
	for _, o := range w.ops {
		if o.cmd.Op == protocol.OpJoin && o.cmd.ConversationID == conv && !slices.Contains(users, o.cmd.UserID) {
			users = append(users, o.cmd.UserID)
		}
	}
	if len(users) == 0 || w.ch.Choose(2, "a joined user") == 0 {
		return "", false
	}
	return users[w.ch.Choose(len(users), "joined user")], true
}

// removedAfter reports whether a kick or leave of join's user in join's
// conversation was committed after join was sent.
func (w *World) removedAfter(join *op) bool {
	for _, rec := range w.log.ConvRecords(join.cmd.ConversationID) {
		if removes(rec.Event, join.cmd.UserID) && rec.CommittedStep > join.issuedStep {
			return true
		}
	}
	return false
}
