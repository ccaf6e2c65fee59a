package gateway

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/chatpipe/chatpipe/internal/link"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// Routing a command to the worker that owns its conversation's vshard,
// over the pooled link to that worker, with the retries a move needs.

// handle answers user's write command req (create, join, kick, leave,
// send, read): the conversation cap first, then the route; it counts the
// answer.
func (g *Gateway) handle(ctx context.Context, user string, req *protocol.Request) *protocol.Reply {
	var rep *protocol.Reply
	switch req.Op {
	case protocol.OpCreate, protocol.OpJoin:
		if e := g.checkConvCap(ctx, user, req); e != nil {
			rep = protocol.Rejected(req.ID, e)
			break
		}
		rep = g.route(ctx, user, req)
	case protocol.OpKick, protocol.OpLeave, protocol.OpSend, protocol.OpRead:
		rep = g.route(ctx, user, req)
	default:
		rep = protocol.Rejected(req.ID, protocol.Errorf(protocol.CodeBadRequest, "op %s is not available in this version", req.Op))
	}
	switch {
	case rep.Op == protocol.OpAccepted:
		g.stats.Accepted.Add(1)
	case rep.Code == protocol.CodeUnavailable:
		g.stats.Unavailable.Add(1)
	default:
		g.stats.Rejected.Add(1)
	}
	g.count(g.opLabel(req), replyCode(rep))
	return rep
}

// vshardOf is where a conversation's commands go: its override, else its
// hashed vshard.
func (g *Gateway) vshardOf(cid string) int {
	if v, ok := g.cfg.Owners.Override(cid); ok {
		return v
	}
	return logrecord.VShard(cid, g.cfg.VShards)
}

// retrySafe reports whether a command whose outcome is unknown may be sent
// again: one carrying a client_message_id (every send; create, join, kick
// and leave when the client gave one) is deduplicated by it, so a second
// attempt returns the first one's result. A membership command without a
// key is not: a join that took effect may have been undone since (the user
// kicked), and sending it again would add them back — one command, two
// effects. Those are sent again only when nothing was written (the worker
// said retry, or the request never left), and otherwise answered
// unavailable for the client to decide (docs/protocol.md).
// A read marker is safe without a key: recording it twice is recording it
// once.
func retrySafe(req *protocol.Request) bool {
	return req.ClientMessageID != "" || req.Op == protocol.OpRead
}

// route sends a write command to the owner of its vshard, retrying while
// ownership moves, for at most RouteTimeout since the last move it saw.
func (g *Gateway) route(ctx context.Context, user string, req *protocol.Request) *protocol.Reply {
	deadline := time.Now().Add(g.cfg.RouteTimeout)
	backoff := 10 * time.Millisecond
	why := "has no live owner" // what the last try ran into
	for {
		changed := g.cfg.Owners.Changed()
		// Looked up at each try: an override that changed since (the
		// conversation is moving) takes effect at once.
		v := g.vshardOf(req.ConversationID)
		sleep := backoff
		if row, w, ok := g.cfg.Owners.Route(v); ok {
			rep, moved, reason, after := g.attempt(ctx, w.Addr, v, row.Epoch, user, req)
			if rep != nil {
				return rep
			}
			why = reason
			if after > 0 && after < sleep {
				// The worker said when to try again (a conversation
				// moving between vshards: soon).
				sleep = after
			}
			if moved {
				deadline = time.Now().Add(g.cfg.RouteTimeout)
				continue
			}
		} else {
			why = "has no live owner"
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return unavailable(req.ID, "vshard "+strconv.Itoa(v)+" "+why+"; retry with the same ids", 1000)
		}
		select {
		case <-ctx.Done():
		case <-changed:
		case <-time.After(sleep):
		}
		backoff = min(backoff*2, 250*time.Millisecond)
	}
}

// attempt sends req once to the worker at addr, owner of v at epoch. It
// returns the reply to give the client, or nil to try again (moved: the
// shard moved while the call was waiting; why: what went wrong, for the
// client's answer if the retries run out; after: when the worker said to
// try again, if it did).
func (g *Gateway) attempt(ctx context.Context, addr string, v int, epoch int64, user string, req *protocol.Request) (rep *protocol.Reply, moved bool, why string, after time.Duration) {
	cl, err := g.client(ctx, addr)
	if err != nil {
		return nil, false, "cannot reach its owner", 0
	}
	cctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	defer cancel()
	safe := retrySafe(req)
	var mc *moveCall
	if safe {
		// A frozen owner never answers: when the shard moves, ask the new
		// owner instead (dedupe makes that safe).
		mc = &moveCall{v: v, epoch: epoch, cancel: cancel}
		g.moves.add(mc)
	}
	resp, err := cl.Do(cctx, user, req)
	if mc != nil {
		g.moves.remove(mc)
		moved = mc.moved.Load()
	}
	switch {
	case errors.Is(err, link.ErrNotSent):
		return nil, moved, "could not be asked (the request was not sent)", 0 // nothing was written
	case err != nil && !safe:
		return unavailable(req.ID, "the outcome of this command is unknown; look at the conversation before sending it again", 200), false, "", 0
	case err != nil:
		return nil, moved, "did not answer in time (the outcome is unknown)", 0
	case resp.Retry, safe && resp.Reply.Code == protocol.CodeUnavailable:
		return nil, moved, "answered: " + resp.Reply.Message, time.Duration(resp.Reply.RetryAfterMS) * time.Millisecond
	}
	return resp.Reply, false, "", 0
}

func unavailable(id, msg string, after int64) *protocol.Reply {
	e := protocol.Errorf(protocol.CodeUnavailable, "%s", msg)
	e.RetryAfterMS = after
	return protocol.Rejected(id, e)
}

func (g *Gateway) client(ctx context.Context, addr string) (Link, error) {
	g.pmu.Lock()
	cl := g.pool[addr]
	g.pmu.Unlock()
	if cl != nil {
		select {
		case <-cl.Done():
		default:
			return cl, nil
		}
	}
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ncl, err := g.cfg.Dial(dctx, addr, g.cfg.Wire)
	if err != nil {
		return nil, err
	}
	g.pmu.Lock()
	defer g.pmu.Unlock()
	if cur := g.pool[addr]; cur != nil && cur != cl {
		select {
		case <-cur.Done():
		default:
			ncl.Close()
			return cur, nil
		}
	}
	g.pool[addr] = ncl
	return ncl, nil
}
