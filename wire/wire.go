// Package wire is the gateway↔worker connection: one persistent TCP
// connection per worker, newline-delimited JSON, pipelined (many requests in
// flight, answered in any order, matched by request id).
package wire

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/chatpipe/chatpipe/protocol"
)

// Request is one client command forwarded to a worker. User is the
// authenticated sender.
type Request struct {
	RID  uint64            `json:"rid"`
	User string            `json:"user"`
	Req  *protocol.Request `json:"req"`
}

// Response answers a Request. Retry means nothing was written and the
// gateway may send the command again, to whoever owns the shard then (the
// worker does not own the shard, or is not accepting yet).
type Response struct {
	RID   uint64          `json:"rid"`
	Reply *protocol.Reply `json:"reply"`
	Retry bool            `json:"retry,omitempty"`
}

// ErrClosed is returned by Client.Do when the connection is gone: the
// outcome of the command is unknown.
var ErrClosed = errors.New("wire: connection closed")

const maxLine = 1 << 20

// Handler handles a request; it must call reply exactly once, from any
// goroutine.
type Handler func(req *Request, reply func(*Response))

// Serve accepts connections on ln until ctx ends, then closes ln and every
// connection and waits for their goroutines.
func Serve(ctx context.Context, ln net.Listener, h Handler, log *slog.Logger) error {
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
			return fmt.Errorf("wire: accept: %w", err)
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			serveConn(ctx, c, h, log)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
		}()
	}
}

func serveConn(ctx context.Context, c net.Conn, h Handler, log *slog.Logger) {
	defer c.Close()
	out := make(chan *Response, 4096)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // writer
		defer wg.Done()
		bw := bufio.NewWriterSize(c, 64<<10)
		enc := json.NewEncoder(bw)
		for {
			select {
			case r := <-out:
				if err := enc.Encode(r); err != nil {
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
		case out <- r:
		case <-done:
		}
	}
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	for sc.Scan() {
		var req Request
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil || req.Req == nil {
			log.Warn("wire: bad request line", "remote", c.RemoteAddr().String(), "err", err)
			break
		}
		h(&req, reply)
	}
	close(done)
	wg.Wait()
}

// Client is a pipelined connection to one worker.
type Client struct {
	conn net.Conn

	wmu sync.Mutex
	bw  *bufio.Writer

	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan *Response
	err     error
	closed  chan struct{}
}

// Dial connects to a worker.
func Dial(ctx context.Context, addr string) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("wire: dial %s: %w", addr, err)
	}
	cl := &Client{conn: conn, bw: bufio.NewWriterSize(conn, 64<<10), pending: map[uint64]chan *Response{}, closed: make(chan struct{})}
	go cl.readLoop()
	return cl, nil
}

// Done is closed when the connection is gone.
func (cl *Client) Done() <-chan struct{} { return cl.closed }

func (cl *Client) readLoop() {
	sc := bufio.NewScanner(cl.conn)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	for sc.Scan() {
		var r Response
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			break
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

// Do sends req and waits for its response. ErrClosed means the outcome is
// unknown.
func (cl *Client) Do(ctx context.Context, user string, req *protocol.Request) (*Response, error) {
	ch := make(chan *Response, 1)
	cl.mu.Lock()
	if cl.err != nil {
		cl.mu.Unlock()
		return nil, cl.err
	}
	cl.next++
	rid := cl.next
	cl.pending[rid] = ch
	cl.mu.Unlock()

	b, err := json.Marshal(&Request{RID: rid, User: user, Req: req})
	if err != nil {
		return nil, fmt.Errorf("wire: encode: %w", err)
	}
	cl.wmu.Lock()
	_, err = cl.bw.Write(append(b, '\n'))
	if err == nil {
		err = cl.bw.Flush()
	}
	cl.wmu.Unlock()
	if err != nil {
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
		cl.mu.Lock()
		delete(cl.pending, rid)
		cl.mu.Unlock()
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
