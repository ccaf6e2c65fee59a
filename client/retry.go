package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/chatpipe/chatpipe/internal/jitter"
	"github.com/chatpipe/chatpipe/protocol"
)

// Requests and their retries: a call waits for the answer with its request
// id and, unanswered, goes out again on the next connection; writes and
// reads are sent again on unavailable and rate_limited, and on unauthorized
// after a dial with a fresh token.

// call is a request waiting for its answer.
type call struct {
	req    protocol.Request
	gen    int  // generation it was last written on
	resend bool // send again on a new connection
	reply  chan *frame
}

// write sends req on conn, its answer routed to handle.
func (c *Client) write(ctx context.Context, conn *Conn, req *protocol.Request) error {
	if err := conn.Go(ctx, req.ID, protocol.AppendRequest(nil, req), c.handle); err != nil {
		return fmt.Errorf("client: %s: %w", req.Op, err)
	}
	return nil
}

// roundTrip sends req (its ID set here) and waits for the answer, at most
// RequestTimeout. With resend, a connection lost before the answer sends
// req again, same ids, on the next one.
func (c *Client) roundTrip(ctx context.Context, req protocol.Request, resend bool) (*frame, error) {
	cl := &call{req: req, resend: resend, reply: make(chan *frame, 1)}
	c.mu.Lock()
	if c.ctx.Err() != nil {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	c.nextID++
	cl.req.ID = "r" + strconv.FormatUint(c.nextID, 10)
	id := cl.req.ID
	c.pending[id] = cl
	conn := c.conn
	if conn != nil {
		cl.gen = c.gen
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		if conn != nil {
			conn.Forget(id)
		}
	}()
	tctx, cancel := context.WithTimeout(ctx, c.opts.RequestTimeout)
	defer cancel()
	if conn != nil {
		// A failed write is the connection failing: the reader notices,
		// and the request goes out again on the next connection.
		_ = c.write(tctx, conn, &cl.req)
	}
	select {
	case f := <-cl.reply:
		return f, nil
	case <-c.ctx.Done():
		return nil, ErrClosed
	case <-tctx.Done():
		if ctx.Err() != nil {
			return nil, fmt.Errorf("client: %s: %w", req.Op, ctx.Err())
		}
		return nil, errTimeout
	}
}

var errTimeout = errors.New("client: no answer in time")

// maxRefreshes is how many times one command answered unauthorized makes
// the client dial again with a fresh token before it gives up.
const maxRefreshes = 2

// redial drops the current connection so that the next one is dialled
// with a token fresh from the TokenSource (the gateway answers
// unauthorized once the connection's token has expired).
func (c *Client) redial() {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn != nil {
		conn.CloseNow()
	}
}

// writeCmd is the retry loop of every write: the request is sent until
// it gets an answer other than unavailable or rate_limited, with the same
// client_message_id each time, waiting retry_after_ms (at least a jittered
// backoff) between tries.
func (c *Client) writeCmd(ctx context.Context, req protocol.Request) (*protocol.Reply, error) {
	refreshes := 0
	for attempt := 0; ; attempt++ {
		f, err := c.roundTrip(ctx, req, true)
		if errors.Is(err, errTimeout) {
			c.opts.Logger.Debug("client: no answer, sending again", "op", req.Op, "client_message_id", req.ClientMessageID)
			continue
		}
		if err != nil {
			return nil, err
		}
		r := f.reply()
		if r.Op == protocol.OpAccepted {
			return r, nil
		}
		if r.Op != protocol.OpRejected {
			return nil, fmt.Errorf("client: %s answered with %q", req.Op, r.Op)
		}
		if r.Code == protocol.CodeUnauthorized && refreshes < maxRefreshes {
			refreshes++
			c.redial()
			continue
		}
		if r.Code != protocol.CodeUnavailable && r.Code != protocol.CodeRateLimited {
			return nil, fmt.Errorf("client: %s %s: %w", req.Op, req.ConversationID, &protocol.Error{Code: r.Code, Message: r.Message, RetryAfterMS: r.RetryAfterMS})
		}
		wait := max(time.Duration(r.RetryAfterMS)*time.Millisecond, Backoff(min(attempt, 4), c.opts.BaseBackoff, c.opts.MaxBackoff))
		if !jitter.Sleep(ctx, wait) {
			if c.ctx.Err() != nil {
				return nil, ErrClosed
			}
			return nil, fmt.Errorf("client: %s: %w", req.Op, ctx.Err())
		}
	}
}

// read sends a read request (sync, history, conversations) until it gets
// an answer other than unavailable or rate_limited.
func (c *Client) read(ctx context.Context, req protocol.Request) (*frame, error) {
	refreshes := 0
	for attempt := 0; ; attempt++ {
		f, err := c.roundTrip(ctx, req, true)
		if errors.Is(err, errTimeout) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if f.Op != protocol.OpRejected {
			return f, nil
		}
		if f.Code == protocol.CodeUnauthorized && refreshes < maxRefreshes {
			refreshes++
			c.redial()
			continue
		}
		if f.Code != protocol.CodeUnavailable && f.Code != protocol.CodeRateLimited {
			return nil, fmt.Errorf("client: %s: %w", req.Op, &protocol.Error{Code: f.Code, Message: f.Message, RetryAfterMS: f.RetryAfterMS})
		}
		wait := max(time.Duration(f.RetryAfterMS)*time.Millisecond, Backoff(min(attempt, 4), c.opts.BaseBackoff, c.opts.MaxBackoff))
		if !jitter.Sleep(ctx, wait) {
			return nil, fmt.Errorf("client: %s: %w", req.Op, ctx.Err())
		}
	}
}
