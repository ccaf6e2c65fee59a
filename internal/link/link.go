// Package link is the gateway↔worker connection: one persistent TCP
// connection per worker, newline-delimited JSON, pipelined (many requests in
// flight, answered in any order, matched by request id). With Config.TLS the
// connection is mutual TLS 1.3 from the link's CA (tls.go): a worker serves
// only gateways, a gateway talks only to workers.
//
// A link never makes its caller wait for the peer: a worker's reply is
// queued without blocking, and a link whose queue is full is closed (its
// peer is too slow or gone). Every write has a deadline; the client pings
// an idle link, and either side closes a link it has read nothing from for
// Config.ReadTimeout.
package link

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	jsonv2 "github.com/go-json-experiment/json"
	"log/slog"
	"net"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/chatpipe/chatpipe/protocol"
)

// Request is one client command forwarded to a worker. User is the
// authenticated sender.
//
// Budget is how long the gateway will wait for the answer, measured when
// it sent the request (0: no limit). The worker turns it into Deadline on
// its own clock when the request arrives, so the two machines' clocks need
// not agree; a command still undecided at Deadline is not decided at all
// (the gateway has already told its client the outcome is unknown).
//
// A request with Ping set is the client's health check of its link: the
// worker answers it with a Response with Pong set and does not handle its
// command.
type Request struct {
	RID    uint64            `json:"rid"`
	User   string            `json:"user,omitempty"`
	Req    *protocol.Request `json:"req,omitempty"`
	Budget time.Duration     `json:"budget_ns,omitempty,format:nano"`
	Ping   bool              `json:"ping,omitempty"`

	// Deadline is set by the worker's side on receipt from Budget (zero:
	// none). It is not sent.
	Deadline time.Time `json:"-"`
}

// Response answers a Request. Retry means nothing was written and the
// gateway may send the command again, to whoever owns the shard then (the
// worker does not own the shard, is not accepting yet, or dropped the
// command because its deadline passed before it was decided).
type Response struct {
	RID   uint64          `json:"rid"`
	Reply *protocol.Reply `json:"reply,omitempty"`
	Retry bool            `json:"retry,omitempty"`
	Pong  bool            `json:"pong,omitempty"`
}

// ErrClosed is returned by Client.Do when the connection went away after
// the request was written (or while it was being written): the outcome of
// the command is unknown.
var ErrClosed = errors.New("link: connection closed")

// ErrNotSent is returned (wrapped) by Client.Do when the request was not
// written at all: the link was already closed, or the caller's context
// ended first. Nothing can have been decided.
var ErrNotSent = errors.New("link: request not sent")

const maxLine = 1 << 20

// Defaults of Config.
const (
	DefaultWriteTimeout = 10 * time.Second
	DefaultPingInterval = 5 * time.Second
	DefaultReadTimeout  = 15 * time.Second
	DefaultQueueLen     = 4096
)

// Config tunes a link; zero fields get the defaults.
type Config struct {
	// WriteTimeout bounds every write on the link, both directions; a
	// write that does not finish in time closes the link (default 10 s).
	WriteTimeout time.Duration
	// PingInterval is how often a client pings its link (default 5 s).
	PingInterval time.Duration
	// ReadTimeout closes a link on which nothing (answer, pong, request or
	// ping) was read for this long (default 15 s). Keep it a few
	// PingIntervals: the worker side counts the client's pings.
	ReadTimeout time.Duration
	// QueueLen is the responses a worker queues on one link; a reply that
	// finds the queue full closes the link (default 4096).
	QueueLen int
	// MaxInFlight caps the requests a client has outstanding on one link,
	// timed-out ones included until answered (default QueueLen - 64, the
	// rest left for pongs): a healthy gateway then never fills a worker's
	// queue, however many answers a batch sends at once. Keep the
	// gateway's QueueLen no larger than the workers'.
	MaxInFlight int
	// TLS, when set, makes the link mutual TLS (see TLS): Serve requires
	// a gateway's client certificate, Dial a worker's certificate. nil is
	// plaintext.
	TLS *TLS
	// AllowPlaintext, with TLS, lets Serve also take plaintext links (any
	// whose first byte does not start a TLS handshake): for turning TLS
	// on in a running deployment, workers first, then gateways.
	AllowPlaintext bool
}

func (c Config) withDefaults() Config {
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.PingInterval <= 0 {
		c.PingInterval = DefaultPingInterval
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.QueueLen <= 0 {
		c.QueueLen = DefaultQueueLen
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = max(c.QueueLen-64, 1)
	}
	return c
}

// deadlineConn extends the read or write deadline before every read and
// write of the connection.
type deadlineConn struct {
	net.Conn
	read, write time.Duration
}

func (c deadlineConn) Read(p []byte) (int, error) {
	if err := c.Conn.SetReadDeadline(time.Now().Add(c.read)); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

func (c deadlineConn) Write(p []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.write)); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

// Handler handles a request; it must call reply exactly once, from any
// goroutine. reply never blocks: on a link whose queue is full it closes
// the link and drops the response (the gateway then answers the command's
// client as an unknown outcome).
type Handler func(req *Request, reply func(*Response))

// Serve accepts connections on ln until ctx ends, then closes ln and every
// connection and waits for their goroutines.
func Serve(ctx context.Context, ln net.Listener, h Handler, cfg Config, log *slog.Logger) error {
	cfg = cfg.withDefaults()
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	go func() {
		<-ctx.Done()
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("link: accept: %w", err)
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
			link := c
			if cfg.TLS != nil && cfg.AllowPlaintext {
				pc, isTLS, err := sniffTLS(c, cfg.ReadTimeout)
				if err != nil {
					c.Close()
					return
				}
				if link = pc; !isTLS {
					serveConn(link, h, cfg, log)
					return
				}
			}
			if cfg.TLS != nil {
				tc, reloadErr, err := handshakeServer(ctx, link, cfg.TLS, cfg.ReadTimeout)
				if reloadErr != nil {
					log.Warn("link: the link certificates changed but cannot be loaded; serving with the previous ones", "err", reloadErr)
				}
				if err != nil {
					log.Warn("link: refused a link that did not authenticate as a gateway", "remote", c.RemoteAddr().String(), "err", err)
					c.Close()
					return
				}
				link = tc
			}
			serveConn(link, h, cfg, log)
		}()
	}
}

func serveConn(c net.Conn, h Handler, cfg Config, log *slog.Logger) {
	dc := deadlineConn{Conn: c, read: cfg.ReadTimeout, write: cfg.WriteTimeout}
	out := make(chan *Response, cfg.QueueLen)
	done := make(chan struct{})
	var once sync.Once
	closeLink := func() {
		once.Do(func() {
			close(done)
			c.Close()
		})
	}
	defer closeLink()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // writer
		defer wg.Done()
		defer closeLink()
		bw := bufio.NewWriterSize(dc, 64<<10)
		var line []byte
		for {
			select {
			case r := <-out:
				line = append(appendResponse(line[:0], r), '\n')
				if _, err := bw.Write(line); err != nil {
					return
				}
				if len(out) == 0 {
					if err := bw.Flush(); err != nil {
						return
					}
				}
			case <-done:
				return
			}
		}
	}()
	reply := func(r *Response) {
		select {
		case <-done:
			return
		default:
		}
		select {
		case out <- r:
		default:
			log.Warn("link: closing a link whose peer does not read its answers", "remote", c.RemoteAddr().String(), "queued", cap(out))
			closeLink()
		}
	}
	sc := bufio.NewScanner(dc)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	for sc.Scan() {
		var req Request
		if err := decode(sc.Bytes(), &req); err != nil {
			log.Warn("link: bad request line", "remote", c.RemoteAddr().String(), "err", err)
			break
		}
		if req.Ping {
			reply(&Response{RID: req.RID, Pong: true})
			continue
		}
		if req.Req == nil {
			log.Warn("link: request line without a command", "remote", c.RemoteAddr().String())
			break
		}
		if req.Budget > 0 {
			req.Deadline = time.Now().Add(req.Budget)
		}
		h(&req, reply)
	}
	closeLink()
	wg.Wait()
}

// Client is a pipelined connection to one worker.
type Client struct {
	conn net.Conn
	cfg  Config

	// Writes are combined: a caller appends its line to wbuf and, unless a
	// write is under way, writes everything queued until wbuf stays empty;
	// callers that arrive meanwhile wait for the write that carries their
	// line. Under load, many requests share one write(2).
	wmu      sync.Mutex
	wcond    *sync.Cond
	wbuf     []byte // lines waiting for the next write
	wspare   []byte // the buffer being written (reused)
	writing  bool
	wstarted uint64 // writes started
	wdone    uint64 // writes finished without error
	werr     error

	// slots holds a token per request written and not answered yet.
	slots chan struct{}

	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan *Response
	err     error
	closed  chan struct{}
}

// Dial connects to a worker.
func Dial(ctx context.Context, addr string, cfg Config) (*Client, error) {
	cfg = cfg.withDefaults()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("link: dial %s: %w", addr, err)
	}
	if cfg.TLS != nil {
		tc, err := handshakeClient(ctx, conn, cfg.TLS, cfg.WriteTimeout)
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("link: dial %s: %w", addr, err)
		}
		conn = tc
	}
	dc := deadlineConn{Conn: conn, read: cfg.ReadTimeout, write: cfg.WriteTimeout}
	cl := &Client{conn: dc, cfg: cfg, pending: map[uint64]chan *Response{}, closed: make(chan struct{}),
		slots: make(chan struct{}, cfg.MaxInFlight)}
	cl.wcond = sync.NewCond(&cl.wmu)
	go cl.readLoop()
	go cl.pingLoop()
	return cl, nil
}

// Done is closed when the connection is gone: closed, broken, or silent
// for longer than the read timeout. A pool should dial a new one.
func (cl *Client) Done() <-chan struct{} { return cl.closed }

func (cl *Client) readLoop() {
	sc := bufio.NewScanner(cl.conn)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	for sc.Scan() {
		var r Response
		if err := decode(sc.Bytes(), &r); err != nil {
			break
		}
		if r.Pong || r.RID == 0 {
			continue // a pong (or an older worker's answer to a ping): reading it extended the deadline
		}
		select { // an answer frees its request's slot, waited for or not
		case <-cl.slots:
		default:
		}
		cl.mu.Lock()
		ch := cl.pending[r.RID]
		delete(cl.pending, r.RID)
		cl.mu.Unlock()
		if ch != nil {
			ch <- &r
		}
	}
	cl.Close()
}

// pingLoop pings the worker every PingInterval, so that a link whose peer
// is gone without a word (a half-open connection) reads nothing and is
// closed by the read deadline.
func (cl *Client) pingLoop() {
	t := time.NewTicker(cl.cfg.PingInterval)
	defer t.Stop()
	line := pingLine()
	for {
		select {
		case <-t.C:
			if err := cl.write(line); err != nil {
				cl.Close()
				return
			}
		case <-cl.closed:
			return
		}
	}
}

// pingLine is a ping request. It also carries a command an older worker
// rejects (an unknown op, answered bad_request with rid 0, which no call
// uses): its answer keeps the link alive through a rolling upgrade.
func pingLine() []byte {
	return append(appendRequest(nil, &Request{Ping: true, Req: &protocol.Request{Op: "ping"}}), '\n')
}

// write sends line, combined with the lines of concurrent callers into as
// few writes as possible; it returns once the write carrying line is done.
func (cl *Client) write(line []byte) error {
	cl.wmu.Lock()
	defer cl.wmu.Unlock()
	if cl.werr != nil {
		return cl.werr
	}
	cl.wbuf = append(cl.wbuf, line...)
	mine := cl.wstarted + 1 // the next write to start carries line
	if cl.writing {
		for cl.wdone < mine && cl.werr == nil {
			cl.wcond.Wait()
		}
		if cl.wdone >= mine {
			return nil
		}
		return cl.werr
	}
	cl.writing = true
	for len(cl.wbuf) > 0 && cl.werr == nil {
		b := cl.wbuf
		cl.wbuf, cl.wspare = cl.wspare[:0], nil
		cl.wstarted++
		cl.wmu.Unlock()
		_, err := cl.conn.Write(b)
		cl.wmu.Lock()
		cl.wspare = b
		if err != nil {
			cl.werr = err
		} else {
			cl.wdone = cl.wstarted
		}
		cl.wcond.Broadcast()
	}
	cl.writing = false
	if cl.wdone >= mine {
		return nil
	}
	return cl.werr
}

// Do sends req and waits for its response. An error wrapping ErrNotSent
// means the request was not written; any other error (ErrClosed, the
// context's) means the outcome is unknown. The context's deadline, if
// any, travels with the request: the worker does not decide the command
// after it.
func (cl *Client) Do(ctx context.Context, user string, req *protocol.Request) (*Response, error) {
	select {
	case cl.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %d requests in flight on the link: %w", ErrNotSent, cap(cl.slots), ctx.Err())
	case <-cl.closed:
		return nil, fmt.Errorf("%w: %w", ErrNotSent, ErrClosed)
	}
	sent := false
	defer func() {
		if !sent {
			<-cl.slots
		}
	}()
	var budget time.Duration
	if d, ok := ctx.Deadline(); ok {
		if budget = time.Until(d); budget <= 0 {
			return nil, fmt.Errorf("%w: %w", ErrNotSent, context.DeadlineExceeded)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotSent, err)
	}
	ch := make(chan *Response, 1)
	cl.mu.Lock()
	if cl.err != nil {
		cl.mu.Unlock()
		return nil, fmt.Errorf("%w: %w", ErrNotSent, cl.err)
	}
	cl.next++
	rid := cl.next
	cl.pending[rid] = ch
	cl.mu.Unlock()
	forget := func() {
		cl.mu.Lock()
		delete(cl.pending, rid)
		cl.mu.Unlock()
	}

	b := appendRequest(make([]byte, 0, 128+len(req.Body)), &Request{RID: rid, User: user, Req: req, Budget: budget})
	sent = true // from here on the answer, or the link's end, frees the slot
	if err := cl.write(append(b, '\n')); err != nil {
		cl.Close()
		return nil, ErrClosed
	}
	select {
	case r := <-ch:
		return r, nil
	case <-cl.closed:
		select {
		case r := <-ch:
			return r, nil
		default:
		}
		return nil, ErrClosed
	case <-ctx.Done():
		forget()
		return nil, ctx.Err()
	}
}

// Close closes the connection; pending calls get ErrClosed. Safe twice.
func (cl *Client) Close() {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.err != nil {
		return
	}
	cl.err = ErrClosed
	cl.conn.Close()
	close(cl.closed)
}

// appendRequest appends r's line (without the newline): what
// json.Marshal(r) writes, without its reflection.
func appendRequest(b []byte, r *Request) []byte {
	b = append(b, `{"rid":`...)
	b = strconv.AppendUint(b, r.RID, 10)
	if r.User != "" {
		b = protocol.AppendString(append(b, `,"user":`...), r.User)
	}
	if r.Req != nil {
		b = protocol.AppendRequest(append(b, `,"req":`...), r.Req)
	}
	if r.Budget != 0 {
		b = strconv.AppendInt(append(b, `,"budget_ns":`...), int64(r.Budget), 10)
	}
	if r.Ping {
		b = append(b, `,"ping":true`...)
	}
	return append(b, '}')
}

// appendResponse appends r's line (without the newline): what
// json.Marshal(r) writes, without its reflection.
func appendResponse(b []byte, r *Response) []byte {
	b = append(b, `{"rid":`...)
	b = strconv.AppendUint(b, r.RID, 10)
	if r.Reply != nil {
		b = protocol.AppendReply(append(b, `,"reply":`...), r.Reply)
	}
	if r.Retry {
		b = append(b, `,"retry":true`...)
	}
	if r.Pong {
		b = append(b, `,"pong":true`...)
	}
	return append(b, '}')
}

// decode reads one line: in one strict parse (exact names, no unknown or
// repeated member) when it can, else as encoding/json reads it, so a peer
// of another version that adds a field is still understood.
func decode(line []byte, v any) error {
	if jsonv2.Unmarshal(line, v, jsonv2.RejectUnknownMembers(true)) == nil {
		return nil
	}
	reflect.ValueOf(v).Elem().SetZero() // nothing the strict parse left behind
	return json.Unmarshal(line, v)
}
