package client

import (
	"sort"

	"github.com/chatpipe/chatpipe/protocol"
)

// The client's view of the events it has seen, each once by conversation
// and seq, and their delivery to OnEvent, OnRead or the Events channel.

// Event is an event of a conversation as the server sends it.
type Event = protocol.Event

// notice is an event or a read marker queued for delivery.
type notice struct {
	ev     Event
	marker bool // a read marker: ev.ConversationID and ev.Seq
}

// Events is the channel of new events when Options.OnEvent is nil. It is
// buffered, and the client keeps an unbounded queue behind it, so a slow
// reader never stalls the connection. It is closed by Close.
func (c *Client) Events() <-chan Event { return c.events }

// Messages returns the events of conv the client has seen, pushed, synced
// or fetched with History, each once, in ascending seq.
func (c *Client) Messages(conv string) []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Event, 0, len(c.view[conv]))
	for _, e := range c.view[conv] {
		out = append(out, *e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out
}

// ConversationIDs returns the ids of the conversations in the client's view,
// sorted.
func (c *Client) ConversationIDs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.view))
	for k := range c.view {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// record adds events to the view; those new to it are queued for delivery
// when emit is set.
func (c *Client) record(es []*Event, emit bool) {
	c.mu.Lock()
	n := 0
	for _, e := range es {
		m := c.view[e.ConversationID]
		if m == nil {
			m = map[int64]*Event{}
			c.view[e.ConversationID] = m
		}
		if _, dup := m[e.Seq]; dup {
			continue
		}
		cp := *e
		cp.Op = ""
		m[e.Seq] = &cp
		if emit {
			c.queue = append(c.queue, notice{ev: cp})
			n++
		}
	}
	c.mu.Unlock()
	if n > 0 {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// deliver hands queued events to OnEvent or the Events channel until
// Close.
func (c *Client) deliver() {
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-c.wake:
		}
		for {
			c.mu.Lock()
			q := c.queue
			c.queue = nil
			c.mu.Unlock()
			if len(q) == 0 {
				break
			}
			for _, n := range q {
				if n.marker {
					if c.opts.OnRead != nil {
						c.opts.OnRead(n.ev.ConversationID, n.ev.Seq)
					}
					continue
				}
				if c.opts.OnEvent != nil {
					c.opts.OnEvent(n.ev)
					continue
				}
				select {
				case c.events <- n.ev:
				case <-c.ctx.Done():
					return
				}
			}
		}
	}
}
