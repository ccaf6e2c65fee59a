package sim

import (
	"fmt"

	"github.com/chatpipe/chatpipe/protocol"
)

// answer is a reply on its way to a client, with what the simulation knows
// about how it was made.
type answer struct {
	att   *attempt
	reply *protocol.Reply
	// wrote is true when the writer produced a new event for the command.
	wrote bool
	// sentStep is the world step the writer (or gateway) sent it, at
	// tick sentAt.
	sentStep int
	sentAt   int64
	// by is the writer that sent it (nil: the gateway or a worker).
	by *writer
	// fenced is true when the writer that sent it had been fenced already.
	fenced bool
	// counted is true once the answer was counted as stale.
	counted bool
}

// message is one message in flight: a request from the gateway to a worker
// (to != "") or a reply to a client. Messages are delivered in any order, any
// time later, or lost.
type message struct {
	id  int
	att *attempt
	to  string // worker id of a request
	ans *answer
}

// String describes the message for traces.
func (m *message) String() string {
	if m.to != "" {
		return fmt.Sprintf("msg%d request op%d.%d %s→%s", m.id, m.att.op.id, m.att.n, m.att.op.cmd.Op, m.to)
	}
	return fmt.Sprintf("msg%d reply op%d.%d %s %s seq=%d", m.id, m.att.op.id, m.att.n, m.ans.reply.Op, m.ans.reply.Code, m.ans.reply.Seq)
}

// network holds the messages in flight.
type network struct {
	next     int
	inflight []*message
}

func (n *network) send(m *message) {
	n.next++
	m.id = n.next
	n.inflight = append(n.inflight, m)
}

func (n *network) remove(m *message) {
	for i, x := range n.inflight {
		if x == m {
			n.inflight = append(n.inflight[:i], n.inflight[i+1:]...)
			return
		}
	}
}

// route is the gateway: it sends an attempt to the live owner of the
// conversation's vshard in its (possibly stale) view, or answers
// unavailable when the view has none.
func (w *World) route(att *attempt) {
	v := w.routeOf(w.gwRoutes, att.op.cmd.ConversationID)
	row, _, ok := w.gateway.Live(v)
	if !ok {
		w.reply(att, unavailable(att, "no live owner of vshard %d", v), false)
		return
	}
	w.net.send(&message{att: att, to: row.Worker})
}

// reply sends an answer to the client of att. An accepted answer that
// leaves a writer is checked at once against the committed log: a reply is
// a side effect, and I1/I7 allow it only after the commit.
func (w *World) reply(att *attempt, r *protocol.Reply, wrote bool) *answer {
	if r.Op == protocol.OpAccepted {
		if _, ok := w.log.CommittedAt(att.op.cmd.ConversationID, r.Seq); !ok {
			w.violate(PropUngated, "op%d (%s %s) answered accepted seq %d before any event with that seq was committed",
				att.op.id, att.op.cmd.Op, att.op.cmd.ConversationID, r.Seq)
		}
	}
	a := &answer{att: att, reply: r, wrote: wrote, sentStep: w.step, sentAt: w.now}
	att.op.decided = append(att.op.decided, a)
	w.net.send(&message{att: att, ans: a})
	return a
}

// deliver hands a message to its receiver.
func (w *World) deliver(m *message) {
	w.net.remove(m)
	if m.to == "" {
		w.receive(m.att, m.ans)
		return
	}
	wk := w.worker(m.to)
	if !wk.alive {
		// connection refused: the gateway answers unavailable
		w.reply(m.att, unavailable(m.att, "worker %s is down", wk.id), false)
		return
	}
	wk.handle(w, m.att)
}

func unavailable(att *attempt, format string, args ...any) *protocol.Reply {
	e := protocol.Errorf(protocol.CodeUnavailable, format, args...)
	e.RetryAfterMS = 200
	return protocol.Rejected(att.reqID(), e)
}
