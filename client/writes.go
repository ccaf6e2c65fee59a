package client

import (
	"context"

	"github.com/chatpipe/chatpipe/protocol"
)

// The write commands: each carries a client_message_id chosen once and
// kept across its retries (writeCmd), so it takes effect once.

// Send posts body to conv and returns its accepted reply (seq and
// message_id are final). It retries until ctx ends, always with the same
// client_message_id, so the message is stored at most once.
func (c *Client) Send(ctx context.Context, conv, body string) (*protocol.Reply, error) {
	return c.SendID(ctx, conv, c.opts.NewID(), body)
}

// SendID is Send with a client_message_id chosen by the caller (an app
// that keeps unsent messages across restarts passes the stored id again).
func (c *Client) SendID(ctx context.Context, conv, clientMessageID, body string) (*protocol.Reply, error) {
	return c.writeCmd(ctx, protocol.Request{Op: protocol.OpSend, ConversationID: conv, ClientMessageID: clientMessageID, Body: body})
}

// Create creates conv with members (the caller is added and becomes the
// owner). A retry that finds it created by this call answers accepted.
func (c *Client) Create(ctx context.Context, conv string, members ...string) (*protocol.Reply, error) {
	return c.writeCmd(ctx, protocol.Request{Op: protocol.OpCreate, ConversationID: conv, Members: members, ClientMessageID: c.opts.NewID()})
}

// Join adds user to conv.
func (c *Client) Join(ctx context.Context, conv, user string) (*protocol.Reply, error) {
	return c.writeCmd(ctx, protocol.Request{Op: protocol.OpJoin, ConversationID: conv, UserID: user, ClientMessageID: c.opts.NewID()})
}

// Kick removes user from conv (the owner only).
func (c *Client) Kick(ctx context.Context, conv, user string) (*protocol.Reply, error) {
	return c.writeCmd(ctx, protocol.Request{Op: protocol.OpKick, ConversationID: conv, UserID: user, ClientMessageID: c.opts.NewID()})
}

// Leave removes the caller from conv.
func (c *Client) Leave(ctx context.Context, conv string) (*protocol.Reply, error) {
	return c.writeCmd(ctx, protocol.Request{Op: protocol.OpLeave, ConversationID: conv, ClientMessageID: c.opts.NewID()})
}
