package gateway

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/internal/delivery"
	"github.com/chatpipe/chatpipe/protocol"
)

// The gateway is the delivery feed's sink: it knows which users have
// devices connected here.
var _ delivery.Sink = (*Gateway)(nil)

// Local reports whether user has a device connected to this gateway.
func (g *Gateway) Local(user string) bool { return g.users.local(user) }

// Any reports whether any device is connected here (delivery.Sink).
func (g *Gateway) Any() bool { return g.users.any() }

// Deliver queues pushes to every device of user on this gateway without
// blocking. A device whose send buffer is full takes the rest later from
// the read model (backlog.go). A batching device gets up to batchFrames
// frames per queued message. It returns how many devices it queued to.
func (g *Gateway) Deliver(user string, pushes []delivery.Push) int {
	var joined [][]byte // the batched messages, made once for all the user's batching devices
	devices := 0
	g.users.each(user, func(s *session) {
		devices++
		if !s.batch {
			s.push(pushes, nil)
			return
		}
		if joined == nil {
			frames := make([][]byte, 0, batchFrames)
			for rest := pushes; len(rest) > 0; {
				n := min(len(rest), batchFrames)
				frames = frames[:0]
				for _, p := range rest[:n] {
					frames = append(frames, p.Frame)
				}
				joined = append(joined, joinFrames(frames))
				rest = rest[n:]
			}
		}
		s.push(pushes, joined)
	})
	return devices
}

// batchFrames is how many event frames one queued message of a batching
// device holds at most: its send buffer then bounds it to SendBuffer ×
// batchFrames frames.
const batchFrames = 16

// joinFrames is frames separated by newlines (one frame: itself).
func joinFrames(frames [][]byte) []byte {
	if len(frames) == 1 {
		return frames[0]
	}
	n := len(frames) - 1
	for _, f := range frames {
		n += len(f)
	}
	b := make([]byte, 0, n)
	for i, f := range frames {
		if i > 0 {
			b = append(b, '\n')
		}
		b = append(b, f...)
	}
	return b
}

// Lost closes every connection so each device reconnects and syncs:
// events meant for them may have been missed.
func (g *Gateway) Lost(reason string) {
	g.cmu.Lock()
	defer g.cmu.Unlock()
	for c := range g.conns {
		go c.Close(websocket.StatusTryAgainLater, "delivery fell behind; reconnect and sync")
	}
}

// queue waits for room in the send buffer: replies the client asked for
// (sync and history pages) wait for a slow reader instead of dropping it.
func (s *session) queue(ctx context.Context, v any) bool {
	b, err := json.Marshal(v)
	if err != nil {
		return false
	}
	select {
	case s.out <- b:
		return true
	case <-ctx.Done():
		return false
	}
}

// sync answers with the events of all the user's conversations after the
// cursors, then `synced`. It returns the answer's rejection code ("" for
// synced), and false when the connection went away before an answer.
func (s *session) sync(ctx context.Context, req *protocol.Request) (protocol.Code, bool) {
	if s.g.cfg.Reads == nil {
		return s.reject(unavailable(req.ID, "this gateway has no read model configured", 1000))
	}
	if rep := s.awaitWrites(ctx, req.ID, ""); rep != nil {
		return s.reject(rep)
	}
	res, err := s.g.cfg.Reads.Sync(ctx, s.user, req.Cursors, s.g.cfg.SyncMax)
	if err != nil {
		if ctx.Err() != nil {
			return "", false
		}
		s.g.cfg.Log.Warn("sync failed", "user", s.user, "err", err)
		return s.reject(unavailable(req.ID, "the read model is unavailable; retry", 500))
	}
	for _, e := range res.Events {
		if !s.queue(ctx, e) {
			return "", false
		}
	}
	return "", s.queue(ctx, &protocol.Synced{Op: protocol.OpSynced, ID: req.ID, Cursors: res.Cursors, More: res.More, Read: res.Read})
}

// reject sends rep, a rejection, and returns its code for sync, history
// and conversations to return.
func (s *session) reject(rep *protocol.Reply) (protocol.Code, bool) {
	s.send(rep)
	return rep.Code, true
}

// history answers a page of a conversation's events within the user's
// membership periods (returns as sync).
func (s *session) history(ctx context.Context, req *protocol.Request) (protocol.Code, bool) {
	if s.g.cfg.Reads == nil {
		return s.reject(unavailable(req.ID, "this gateway has no read model configured", 1000))
	}
	if rep := s.awaitWrites(ctx, req.ID, req.ConversationID); rep != nil {
		return s.reject(rep)
	}
	limit := s.g.pageSize(req.Limit)
	events, err := s.g.cfg.Reads.History(ctx, s.user, req.ConversationID, req.BeforeSeq, limit)
	switch {
	case errors.Is(err, delivery.ErrForbidden):
		return s.reject(protocol.Rejected(req.ID, protocol.Errorf(protocol.CodeForbidden, "%s is not a member of %s", s.user, req.ConversationID)))
	case err != nil:
		if ctx.Err() != nil {
			return "", false
		}
		s.g.cfg.Log.Warn("history failed", "user", s.user, "err", err)
		return s.reject(unavailable(req.ID, "the read model is unavailable; retry", 500))
	}
	return "", s.queue(ctx, &protocol.HistoryPage{Op: protocol.OpHistory, ID: req.ID, ConversationID: req.ConversationID, Events: events})
}

// checkConvCap refuses a create or join that would put someone in more
// than MaxConvsPerUser conversations. If the read model cannot be asked,
// the command goes on: the cap is against abuse, not an invariant.
func (g *Gateway) checkConvCap(ctx context.Context, user string, req *protocol.Request) *protocol.Error {
	if g.cfg.Reads == nil || g.cfg.MaxConvsPerUser < 0 {
		return nil
	}
	who := []string{req.UserID}
	if req.Op == protocol.OpCreate {
		who = append([]string{user}, req.Members...)
	}
	counts, err := g.cfg.Reads.OpenMemberships(ctx, who, req.ConversationID)
	if err != nil {
		g.cfg.Log.Warn("conversation cap not checked", "err", err)
		return nil
	}
	for _, u := range who {
		if n := counts[u]; n >= g.cfg.MaxConvsPerUser {
			return protocol.Errorf(protocol.CodeTooLarge, "%s is in %d conversations (limit %d)", u, n, g.cfg.MaxConvsPerUser)
		}
	}
	return nil
}

// conversations answers the user's current conversations, most recently
// active first (returns as sync).
func (s *session) conversations(ctx context.Context, req *protocol.Request) (protocol.Code, bool) {
	if s.g.cfg.Reads == nil {
		return s.reject(unavailable(req.ID, "this gateway has no read model configured", 1000))
	}
	if rep := s.awaitWrites(ctx, req.ID, ""); rep != nil {
		return s.reject(rep)
	}
	limit := s.g.pageSize(req.Limit)
	list, err := s.g.cfg.Reads.Conversations(ctx, s.user, limit)
	if err != nil {
		if ctx.Err() != nil {
			return "", false
		}
		s.g.cfg.Log.Warn("conversations failed", "user", s.user, "err", err)
		return s.reject(unavailable(req.ID, "the read model is unavailable; retry", 500))
	}
	s.send(&protocol.ConversationList{Op: protocol.OpConversations, ID: req.ID, Conversations: list})
	return "", true
}

// pageSize is a request's limit: 50 if absent, at most MaxHistory.
func (g *Gateway) pageSize(limit int) int {
	if limit == 0 {
		limit = 50
	}
	return min(limit, g.cfg.Limits.MaxHistory)
}
