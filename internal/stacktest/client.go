package stacktest

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	chatclient "github.com/chatpipe/chatpipe/client"
	"github.com/chatpipe/chatpipe/protocol"
)

// Client is one websocket device of a user that speaks the protocol as
// raw request frames (tests send malformed, retried and hostile frames on
// purpose), on the client package's connection multiplexer.
type Client struct {
	User string
	Conn *chatclient.Conn

	t testing.TB
}

// Dial opens a websocket of p's stack as user with a token of p's secret;
// a failure fails t, whose clean-up closes it.
func (p *Dev) Dial(t testing.TB, user string) *Client {
	t.Helper()
	cl, err := p.DialWith(t, user, p.Token(t, user))
	if err != nil {
		t.Fatalf("dial as %s: %v", user, err)
	}
	return cl
}

// DialWith opens a websocket of p's stack as user with the bearer token
// tok; t's clean-up closes it. A frame that is not JSON fails t.
func (p *Dev) DialWith(t testing.TB, user, tok string) (*Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := chatclient.DialConn(ctx, p.EP.WebSocket, chatclient.ConnOptions{Token: tok, ReadLimit: 1 << 20,
		OnFrame: func(b []byte) {
			if !json.Valid(b) {
				t.Errorf("bad frame from server: %s", b)
			}
		}})
	if err != nil {
		return nil, err
	}
	cl := &Client{t: t, User: user, Conn: c}
	t.Cleanup(cl.Close)
	return cl, nil
}

// Close closes the websocket at once.
func (cl *Client) Close() { cl.Conn.CloseNow() }

// Do sends a request (fields as a map; "id" is set here) and waits for its
// reply.
func (cl *Client) Do(req map[string]any) (*protocol.Reply, error) {
	id := cl.Conn.NewID()
	req["id"] = id
	b, _ := json.Marshal(req)
	return cl.DoFrame(id, string(b))
}

// DoFrame writes a raw frame whose id is id and waits for its reply, at
// most 30 s.
func (cl *Client) DoFrame(id, frame string) (*protocol.Reply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := cl.Conn.Call(ctx, id, []byte(frame))
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("no reply to %s within 30 s", frame)
		}
		return nil, err
	}
	var r protocol.Reply
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("bad frame from server: %s", b)
	}
	if r.Op != protocol.OpAccepted && r.Op != protocol.OpRejected {
		return nil, fmt.Errorf("%s answered %s, not accepted or rejected", id, b)
	}
	return &r, nil
}

// Must is Do for requests that have to succeed; it waits out
// rate_limited and unavailable as a client should.
func (cl *Client) Must(req map[string]any) *protocol.Reply {
	cl.t.Helper()
	var r *protocol.Reply
	var err error
	for start := time.Now(); ; {
		r, err = cl.Do(req)
		if err != nil {
			cl.t.Fatalf("%s: %v", cl.User, err)
		}
		if (r.Code != protocol.CodeUnavailable && r.Code != protocol.CodeRateLimited) || time.Since(start) > 90*time.Second {
			break
		}
		time.Sleep(time.Duration(r.RetryAfterMS) * time.Millisecond)
	}
	if r.Op != protocol.OpAccepted {
		cl.t.Fatalf("%s %v: %+v", cl.User, req, r)
	}
	return r
}

// SendRetrying sends until the answer is neither `unavailable` nor
// `rate_limited` (for at most 90 s), as a client should.
func (cl *Client) SendRetrying(conv, cmid, body string) (*protocol.Reply, error) {
	r, _, err := cl.sendRetrying(conv, cmid, body)
	return r, err
}

// SendAccepted sends as SendRetrying does and returns the send as
// accepted, with when it was first sent, when the attempt that was
// accepted was sent (no worker can have taken it before) and when the
// answer came; any other final answer is an error.
func (cl *Client) SendAccepted(conv, cmid, body string) (Accepted, error) {
	sent := time.Now()
	r, at, err := cl.sendRetrying(conv, cmid, body)
	if err != nil {
		return Accepted{}, err
	}
	if r.Op != protocol.OpAccepted {
		return Accepted{}, fmt.Errorf("send %s to %s: %+v", cmid, conv, r)
	}
	return Accepted{Conv: conv, ClientMessageID: cmid, MessageID: r.MessageID, Sender: cl.User, Seq: r.Seq,
		SentAt: sent, AttemptAt: at, AcceptedAt: time.Now()}, nil
}

// sendRetrying is SendRetrying, and also returns when the attempt that got
// the last answer was sent.
func (cl *Client) sendRetrying(conv, cmid, body string) (*protocol.Reply, time.Time, error) {
	start := time.Now()
	for {
		at := time.Now()
		r, err := cl.Do(map[string]any{"op": "send", "conversation_id": conv, "client_message_id": cmid, "body": body})
		if err != nil {
			return nil, at, err
		}
		if (r.Code != protocol.CodeUnavailable && r.Code != protocol.CodeRateLimited) || time.Since(start) > 90*time.Second {
			return r, at, nil
		}
		time.Sleep(time.Duration(r.RetryAfterMS) * time.Millisecond)
	}
}
