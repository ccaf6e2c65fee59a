package client

import (
	"context"

	"github.com/chatpipe/chatpipe/protocol"
)

// Read markers: the user's, shared by all their devices, as far as this
// device knows, and MarkRead.

// MarkRead records that the user has read conv up to seq (a read marker,
// shared by all the user's devices; docs/protocol.md). It returns at once
// when the marker is at seq or beyond already, or a MarkRead of conv up to
// seq or beyond is in flight; otherwise it sends the marker, retrying
// like every write, and returns once it is committed. A marker never
// moves back.
func (c *Client) MarkRead(ctx context.Context, conv string, seq int64) error {
	c.mu.Lock()
	if seq <= c.markers[conv] || seq <= c.reading[conv] {
		c.mu.Unlock()
		return nil
	}
	c.reading[conv] = seq
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.reading[conv] == seq {
			delete(c.reading, conv)
		}
		c.mu.Unlock()
	}()
	if _, err := c.writeCmd(ctx, protocol.Request{Op: protocol.OpRead, ConversationID: conv, Seq: seq}); err != nil {
		return err
	}
	c.noteRead(conv, seq)
	return nil
}

// ReadSeq is the user's read marker of conv as far as this device knows
// (0: none).
func (c *Client) ReadSeq(conv string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.markers[conv]
}

// noteRead raises the known marker of conv to seq, queueing it for OnRead
// when it moved forward.
func (c *Client) noteRead(conv string, seq int64) {
	c.mu.Lock()
	if conv == "" || seq <= c.markers[conv] {
		c.mu.Unlock()
		return
	}
	c.markers[conv] = seq
	if c.opts.OnRead != nil {
		c.queue = append(c.queue, notice{ev: Event{ConversationID: conv, Seq: seq}, marker: true})
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}
