// Package client is a Go client of the chatpipe websocket protocol
// (docs/protocol.md) that follows the contract's rules for client authors:
//
//   - every write carries a client_message_id chosen once, kept across
//     retries and reconnects, so a retried command takes effect once;
//   - a lost connection is dialled again with full-jitter exponential
//     backoff, and every command that had no answer is sent again with the
//     same ids;
//   - after each (re)connect the client syncs from the cursors of its last
//     complete `synced` reply, paging while the server says `more`;
//   - `unavailable`, `rate_limited` and unanswered commands are retried,
//     honouring `retry_after_ms`;
//   - some time before the connection's token expires (its `exp`, read
//     without verifying it) the client sends `refresh` with a fresh token
//     from its TokenSource, so a long-lived connection is never answered
//     `unauthorized`; should that happen anyway (a token whose exp cannot
//     be read, a refused refresh, a server without the op), the client
//     dials again with a fresh token and retries;
//   - events are de-duplicated by (conversation_id, seq) and kept ordered
//     by seq per conversation.
//
// A Client is safe for concurrent use.
package client

import (
	"context"
	"errors"
	"sync"
)

// ErrClosed is returned by calls on a closed Client.
var ErrClosed = errors.New("client: closed")

// Client is one device of a user: a websocket kept open until Close, and
// the ordered, de-duplicated view of the events it has seen.
type Client struct {
	url  string
	ts   TokenSource
	opts Options

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	done   chan struct{} // run ended
	events chan Event

	mu      sync.Mutex
	conn    *Conn // nil while disconnected
	gen     int   // connection generation, bumped on each connect
	nextID  uint64
	pending map[string]*call
	cursors map[string]int64 // of the last complete synced reply only
	view    map[string]map[int64]*Event
	markers map[string]int64 // the user's read markers, the highest seen
	reading map[string]int64 // MarkRead calls in flight: the highest marker each
	queue   []notice         // events and markers to hand to OnEvent / Events / OnRead
	wake    chan struct{}    // signals the deliverer, capacity 1
	synced  chan struct{}    // closed when the current connection's sync ends

	connects int
}

// Dial connects to the gateway at url (ws:// or wss://, e.g.
// ws://127.0.0.1:8080/v1/ws) as the user of ts's tokens. The first dial
// must succeed; later connection losses are dialled again in the
// background until Close. The first sync runs in the background too: see
// WaitSynced.
func Dial(ctx context.Context, url string, ts TokenSource, opts Options) (*Client, error) {
	opts.fill()
	c := &Client{url: url, ts: ts, opts: opts, done: make(chan struct{}), events: make(chan Event, 256),
		pending: map[string]*call{}, cursors: map[string]int64{}, view: map[string]map[int64]*Event{},
		markers: map[string]int64{}, reading: map[string]int64{},
		wake: make(chan struct{}, 1), synced: make(chan struct{})}
	for k, v := range opts.Cursors {
		c.cursors[k] = v
	}
	conn, tok, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); c.deliver() }()
	go func() {
		defer close(c.done)
		c.run(conn, tok)
		wg.Wait()
		close(c.events)
	}()
	return c, nil
}

// Close ends the connection and every goroutine of the client. Calls in
// flight return ErrClosed. The Events channel is closed.
func (c *Client) Close() error {
	c.cancel()
	<-c.done
	return nil
}

// Connects is how many connections the client has opened so far.
func (c *Client) Connects() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.connects
}
