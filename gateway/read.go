package gateway

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/delivery"
	"github.com/chatpipe/chatpipe/protocol"
)

// The gateway is the delivery feed's sink: it knows which users have
// devices connected here.
var _ delivery.Sink = (*Gateway)(nil)

// Local reports whether user has a device connected to this gateway.
func (g *Gateway) Local(user string) bool { return g.users.local(user) }

// Deliver queues an event frame to every device of user on this gateway. A
// device whose send buffer is full is closed with 1008; it catches up with
// sync.
func (g *Gateway) Deliver(user string, frame []byte) {
	g.users.each(user, func(s *session) { s.sendRaw(frame) })
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
// cursors, then `synced`.
func (s *session) sync(ctx context.Context, req *protocol.Request) {
	s.g.syncs.Add(1)
	if s.g.cfg.Reads == nil {
		s.send(unavailable(req.ID, "this gateway has no read model configured", 1000))
		return
	}
	res, err := s.g.cfg.Reads.Sync(ctx, s.user, req.Cursors, s.g.cfg.SyncMax)
	if err != nil {
		if ctx.Err() == nil {
			s.g.cfg.Log.Warn("sync failed", "user", s.user, "err", err)
			s.send(unavailable(req.ID, "the read model is unavailable; retry", 500))
		}
		return
	}
	for _, e := range res.Events {
		if !s.queue(ctx, e) {
			return
		}
	}
	s.queue(ctx, &protocol.Synced{Op: protocol.OpSynced, ID: req.ID, Cursors: res.Cursors, More: res.More})
}

// history answers a page of a conversation's events within the user's
// membership periods.
func (s *session) history(ctx context.Context, req *protocol.Request) {
	s.g.histories.Add(1)
	if s.g.cfg.Reads == nil {
		s.send(unavailable(req.ID, "this gateway has no read model configured", 1000))
		return
	}
	limit := req.Limit
	if limit == 0 {
		limit = 50
	}
	limit = min(limit, s.g.cfg.Limits.MaxHistory)
	events, err := s.g.cfg.Reads.History(ctx, s.user, req.ConversationID, req.BeforeSeq, limit)
	switch {
	case errors.Is(err, delivery.ErrForbidden):
		s.send(protocol.Rejected(req.ID, protocol.Errorf(protocol.CodeForbidden, "%s is not a member of %s", s.user, req.ConversationID)))
		return
	case err != nil:
		if ctx.Err() == nil {
			s.g.cfg.Log.Warn("history failed", "user", s.user, "err", err)
			s.send(unavailable(req.ID, "the read model is unavailable; retry", 500))
		}
		return
	}
	s.queue(ctx, &protocol.HistoryPage{Op: protocol.OpHistory, ID: req.ID, ConversationID: req.ConversationID, Events: events})
}
