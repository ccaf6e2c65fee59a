package client

import (
	"encoding/json"

	"github.com/chatpipe/chatpipe/protocol"
)

// The server's frames as the client decodes them, and their dispatch: an
// answer to the call waiting for it, an event to the view, a read marker
// to the markers.

// frame is any server frame (a superset of their fields).
type frame struct {
	Op              string                       `json:"op"`
	ID              string                       `json:"id"`
	Code            protocol.Code                `json:"code"`
	Message         string                       `json:"message"`
	RetryAfterMS    int64                        `json:"retry_after_ms"`
	ConversationID  string                       `json:"conversation_id"`
	Seq             int64                        `json:"seq"`
	MessageID       string                       `json:"message_id"`
	ClientMessageID string                       `json:"client_message_id"`
	Kind            string                       `json:"kind"`
	Sender          string                       `json:"sender"`
	Body            string                       `json:"body"`
	UserID          string                       `json:"user_id"`
	Members         []string                     `json:"members"`
	CreatedAt       string                       `json:"created_at"`
	Cursors         map[string]int64             `json:"cursors"`
	More            bool                         `json:"more"`
	Events          []*Event                     `json:"events"`
	Conversations   []*protocol.ConversationInfo `json:"conversations"`
	Read            map[string]int64             `json:"read"`
}

func (f *frame) event() *Event {
	return &Event{Op: f.Op, ConversationID: f.ConversationID, Seq: f.Seq, Kind: f.Kind, MessageID: f.MessageID,
		ClientMessageID: f.ClientMessageID, Sender: f.Sender, Body: f.Body, UserID: f.UserID, Members: f.Members, CreatedAt: f.CreatedAt}
}

func (f *frame) reply() *protocol.Reply {
	return &protocol.Reply{Op: f.Op, ID: f.ID, ConversationID: f.ConversationID, Seq: f.Seq, MessageID: f.MessageID,
		ClientMessageID: f.ClientMessageID, Code: f.Code, Message: f.Message, RetryAfterMS: f.RetryAfterMS}
}

// handle dispatches one server frame: an answer to its waiting call, an
// event to the view, a read marker to the markers. It runs on the
// connection's reader goroutine.
func (c *Client) handle(b []byte) {
	if c.opts.OnFrame != nil {
		c.opts.OnFrame(b)
	}
	var f frame
	if err := json.Unmarshal(b, &f); err != nil {
		c.opts.Logger.Info("client: undecodable frame", "err", err)
		return
	}
	if f.Op == protocol.OpEvent {
		c.record([]*Event{f.event()}, true)
		return
	}
	if f.Op == protocol.OpRead && f.ID == "" {
		c.noteRead(f.ConversationID, f.Seq)
		return
	}
	if f.ID == "" {
		return
	}
	c.mu.Lock()
	cl := c.pending[f.ID]
	delete(c.pending, f.ID)
	c.mu.Unlock()
	if cl != nil {
		cl.reply <- &f
	}
}
