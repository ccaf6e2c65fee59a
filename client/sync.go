package client

import (
	"context"
	"fmt"

	"github.com/chatpipe/chatpipe/protocol"
)

// Catching up: the sync from the cursors of the last complete sync, pages
// of history and the list of conversations.

// WaitSynced blocks until the sync that follows the current connection
// has paged to its end (or ctx ends).
func (c *Client) WaitSynced(ctx context.Context) error {
	c.mu.Lock()
	ch := c.synced
	c.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for sync: %w", ctx.Err())
	case <-c.done:
		return ErrClosed
	}
}

// Cursors returns the cursors of the last complete sync: for each
// conversation, the last seq the client is sure to have seen.
func (c *Client) Cursors() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, len(c.cursors))
	for k, v := range c.cursors {
		out[k] = v
	}
	return out
}

// Sync asks for every event after the cursors of the last complete sync,
// paging while the server answers more, and records them (new ones are
// delivered as events). The client syncs by itself after every
// (re)connect; call Sync to catch up at another moment.
func (c *Client) Sync(ctx context.Context) error { return c.syncAll(ctx) }

func (c *Client) syncAll(ctx context.Context) error {
	for {
		cur := c.Cursors()
		f, err := c.read(ctx, protocol.Request{Op: protocol.OpSync, Cursors: cur})
		if err != nil {
			return err
		}
		if f.Op != protocol.OpSynced {
			return fmt.Errorf("client: sync answered with %q", f.Op)
		}
		// The sync's event frames came before synced, on the same
		// connection: everything up to these cursors is in the view.
		c.mu.Lock()
		for k, v := range f.Cursors {
			if v > c.cursors[k] {
				c.cursors[k] = v
			}
		}
		c.mu.Unlock()
		for k, v := range f.Read {
			c.noteRead(k, v)
		}
		if !f.More {
			return nil
		}
	}
}

// History returns one page of conv's events before beforeSeq (0: the
// newest), at most limit (0: the server's default), in ascending seq. A
// page shorter than limit means nothing older is left. The events are
// added to the view but not delivered as events.
func (c *Client) History(ctx context.Context, conv string, beforeSeq int64, limit int) ([]Event, error) {
	f, err := c.read(ctx, protocol.Request{Op: protocol.OpHistory, ConversationID: conv, BeforeSeq: beforeSeq, Limit: limit})
	if err != nil {
		return nil, err
	}
	if f.Op != protocol.OpHistory {
		return nil, fmt.Errorf("client: history answered with %q", f.Op)
	}
	c.record(f.Events, false)
	out := make([]Event, len(f.Events))
	for i, e := range f.Events {
		out[i] = *e
	}
	return out, nil
}

// HistoryAll pages History backwards from the newest event with pages of
// pageSize (0: 50) and returns everything the caller may see of conv, in
// ascending seq.
func (c *Client) HistoryAll(ctx context.Context, conv string, pageSize int) ([]Event, error) {
	if pageSize <= 0 {
		pageSize = 50
	}
	var pages [][]Event
	var before int64
	for {
		p, err := c.History(ctx, conv, before, pageSize)
		if err != nil {
			return nil, err
		}
		pages = append(pages, p)
		if len(p) < pageSize || p[0].Seq <= 1 {
			break
		}
		before = p[0].Seq
	}
	var out []Event
	for i := len(pages) - 1; i >= 0; i-- {
		out = append(out, pages[i]...)
	}
	return out, nil
}

// ListConversations returns the caller's current conversations, most
// recently active first, at most limit (0: the server's default).
func (c *Client) ListConversations(ctx context.Context, limit int) ([]protocol.ConversationInfo, error) {
	f, err := c.read(ctx, protocol.Request{Op: protocol.OpConversations, Limit: limit})
	if err != nil {
		return nil, err
	}
	if f.Op != protocol.OpConversations {
		return nil, fmt.Errorf("client: conversations answered with %q", f.Op)
	}
	out := make([]protocol.ConversationInfo, len(f.Conversations))
	for i, x := range f.Conversations {
		out[i] = *x
		c.noteRead(x.ConversationID, x.ReadSeq)
	}
	return out, nil
}
