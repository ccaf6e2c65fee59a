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
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/internal/jitter"
	"github.com/chatpipe/chatpipe/protocol"
)

// Event is an event of a conversation as the server sends it.
type Event = protocol.Event

// TokenSource returns the bearer token to present at the next dial. It is
// called before every (re)connect, so it may refresh an expiring token.
type TokenSource func(ctx context.Context) (string, error)

// StaticToken is a TokenSource that always returns tok.
func StaticToken(tok string) TokenSource {
	return func(context.Context) (string, error) { return tok, nil }
}

// Options tune a Client. The zero value is usable.
type Options struct {
	// Batch asks for the chatpipe.v1.batch subprotocol: the server may send
	// several frames in one websocket message.
	Batch bool
	// OnEvent, when set, is called with every event new to the client's
	// view (a duplicate by conversation and seq is not passed again), one
	// call at a time from a goroutine of the client, in the order the
	// events arrived. When nil, events go to the Events channel instead.
	OnEvent func(Event)
	// OnRead, when set, is called when the user's read marker of a
	// conversation moves forward (by this device's MarkRead, a marker
	// another device recorded, or a sync), with the new marker, from the
	// same goroutine as OnEvent and in order with it.
	OnRead func(conv string, seq int64)
	// OnFrame, when set, is called with every server frame received,
	// before the client handles it, from the connection's reader; it must
	// not keep b. Meant for logging and tests.
	OnFrame func(b []byte)
	// Cursors are the cursors of a previous complete sync (for example
	// kept on disk by the app); the first sync starts from them.
	Cursors map[string]int64
	// RequestTimeout is how long a command waits for its answer before it
	// is sent again with the same ids (default 20 s, above the gateway's
	// 15 s call timeout).
	RequestTimeout time.Duration
	// BaseBackoff and MaxBackoff bound the reconnect wait: before attempt n
	// the client waits random(0, min(MaxBackoff, BaseBackoff × 2^n))
	// (defaults 250 ms and 30 s).
	BaseBackoff, MaxBackoff time.Duration
	// StableAfter is how long a connection must live for the backoff to
	// start again from attempt 0 (default 1 min).
	StableAfter time.Duration
	// DialTimeout bounds one websocket dial (default 10 s).
	DialTimeout time.Duration
	// ReadLimit is the largest websocket message accepted (default 4 MiB;
	// batched messages and history pages can be large).
	ReadLimit int64
	// HTTPClient dials the websocket (default http.DefaultClient).
	HTTPClient *http.Client
	// Logger receives connection changes at debug and info level (default:
	// discarded).
	Logger *slog.Logger
	// NewID returns a fresh client_message_id (default: 16 random bytes,
	// hex). It must return ids of [A-Za-z0-9._:-] of at most 128 bytes.
	NewID func() string
	// RefreshBefore is how long before the connection's token expires the
	// client replaces it with a fresh one from the TokenSource (the
	// refresh op): at RefreshBefore before its exp, or halfway through
	// its life when that is later (default 1 min; negative: never, and an
	// expired token makes the client dial again instead).
	RefreshBefore time.Duration
}

func (o *Options) fill() {
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 20 * time.Second
	}
	if o.BaseBackoff <= 0 {
		o.BaseBackoff = 250 * time.Millisecond
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 30 * time.Second
	}
	if o.StableAfter <= 0 {
		o.StableAfter = time.Minute
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.ReadLimit <= 0 {
		o.ReadLimit = 4 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.NewID == nil {
		o.NewID = randomID
	}
	if o.RefreshBefore == 0 {
		o.RefreshBefore = time.Minute
	}
}

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

// call is a request waiting for its answer.
type call struct {
	req    protocol.Request
	gen    int  // generation it was last written on
	resend bool // send again on a new connection
	reply  chan *frame
}

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

// notice is an event or a read marker queued for delivery.
type notice struct {
	ev     Event
	marker bool // a read marker: ev.ConversationID and ev.Seq
}

func (f *frame) event() *Event {
	return &Event{Op: f.Op, ConversationID: f.ConversationID, Seq: f.Seq, Kind: f.Kind, MessageID: f.MessageID,
		ClientMessageID: f.ClientMessageID, Sender: f.Sender, Body: f.Body, UserID: f.UserID, Members: f.Members, CreatedAt: f.CreatedAt}
}

func (f *frame) reply() *protocol.Reply {
	return &protocol.Reply{Op: f.Op, ID: f.ID, ConversationID: f.ConversationID, Seq: f.Seq, MessageID: f.MessageID,
		ClientMessageID: f.ClientMessageID, Code: f.Code, Message: f.Message, RetryAfterMS: f.RetryAfterMS}
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

// Events is the channel of new events when Options.OnEvent is nil. It is
// buffered, and the client keeps an unbounded queue behind it, so a slow
// reader never stalls the connection. It is closed by Close.
func (c *Client) Events() <-chan Event { return c.events }

// Connects is how many connections the client has opened so far.
func (c *Client) Connects() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.connects
}

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

// dial opens a connection with a token from the TokenSource and returns
// both. Every frame of the connection goes to handle: the answers routed
// to the requests waiting for them, and the rest.
func (c *Client) dial(ctx context.Context) (*Conn, string, error) {
	tok, err := c.ts(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("client: token: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, c.opts.DialTimeout)
	defer cancel()
	conn, err := DialConn(dctx, c.url, ConnOptions{Token: tok, Batch: c.opts.Batch, ReadLimit: c.opts.ReadLimit,
		HTTPClient: c.opts.HTTPClient, OnFrame: c.handle})
	if err != nil {
		return nil, "", err
	}
	return conn, tok, nil
}

// Backoff is the full-jitter wait before reconnect attempt n:
// random(0, min(max, base × 2^n)).
func Backoff(n int, base, max time.Duration) time.Duration {
	return jitter.Backoff(n, base, max)
}

// run owns the connection: it serves conn until it is lost, then dials
// again with backoff, until Close.
func (c *Client) run(conn *Conn, tok string) {
	attempt := 0
	for {
		start := time.Now()
		err := c.serve(conn, tok)
		if c.ctx.Err() != nil {
			return
		}
		if time.Since(start) >= c.opts.StableAfter {
			attempt = 0
		}
		c.opts.Logger.Info("client: connection lost", "err", err, "close_code", websocket.CloseStatus(err))
		for conn = nil; conn == nil; attempt++ {
			if !sleep(c.ctx, Backoff(attempt, c.opts.BaseBackoff, c.opts.MaxBackoff)) {
				return
			}
			conn, tok, err = c.dial(c.ctx)
			if err != nil {
				if c.ctx.Err() != nil {
					return
				}
				c.opts.Logger.Debug("client: dial failed", "attempt", attempt, "err", err)
			}
		}
	}
}

// serve waits until conn fails or the client closes (conn's reader hands
// every frame to handle). On entry it sends again every command that had
// no answer on an earlier connection and starts the sync and the
// refresher of tok, the connection's token.
func (c *Client) serve(conn *Conn, tok string) error {
	defer conn.CloseNow()
	cctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	c.mu.Lock()
	c.conn = conn
	c.gen++
	c.connects++
	gen := c.gen
	var again []*call
	for _, cl := range c.pending {
		if cl.gen != gen && cl.resend {
			cl.gen = gen
			again = append(again, cl)
		}
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.gen == gen {
			c.conn = nil
		}
		c.mu.Unlock()
	}()
	// In request-id order, so commands go out again in the order they
	// were first sent.
	sort.Slice(again, func(i, j int) bool { return idLess(again[i].req.ID, again[j].req.ID) })
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	lost := false // the reader saw the connection fail (guarded by c.mu)
	if c.opts.RefreshBefore > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); c.keepToken(cctx, tok) }()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, cl := range again {
			if err := c.write(cctx, conn, &cl.req); err != nil {
				return
			}
		}
		err := c.syncAll(cctx)
		if err != nil && cctx.Err() == nil {
			c.opts.Logger.Info("client: sync failed", "err", err)
		}
		if err == nil {
			c.mu.Lock()
			// Not once the reader has seen the connection fail: it
			// may have reset c.synced for the next connection already.
			if c.gen == gen && !lost {
				close(c.synced)
			}
			c.mu.Unlock()
		}
	}()
	select {
	case <-cctx.Done():
		return cctx.Err()
	case <-conn.Done():
	}
	c.mu.Lock()
	lost = true
	if c.gen == gen {
		select {
		case <-c.synced:
			c.synced = make(chan struct{})
		default:
		}
	}
	c.mu.Unlock()
	return conn.Err()
}

func idLess(a, b string) bool {
	x, _ := strconv.ParseUint(a[1:], 10, 64)
	y, _ := strconv.ParseUint(b[1:], 10, 64)
	return x < y
}

// write sends req on conn, its answer routed to handle.
func (c *Client) write(ctx context.Context, conn *Conn, req *protocol.Request) error {
	if err := conn.Go(ctx, req.ID, protocol.AppendRequest(nil, req), c.handle); err != nil {
		return fmt.Errorf("client: %s: %w", req.Op, err)
	}
	return nil
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
		if !sleep(ctx, wait) {
			if c.ctx.Err() != nil {
				return nil, ErrClosed
			}
			return nil, fmt.Errorf("client: %s: %w", req.Op, ctx.Err())
		}
	}
}

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
		if !sleep(ctx, wait) {
			return nil, fmt.Errorf("client: %s: %w", req.Op, ctx.Err())
		}
	}
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

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "m-" + hex.EncodeToString(b[:])
}
