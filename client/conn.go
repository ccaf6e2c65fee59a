package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/protocol"
)

// ConnOptions tune a Conn. The zero value is usable.
type ConnOptions struct {
	// Token, when set, is sent as the bearer token of the upgrade request
	// (Authorization header). Leave it empty when the URL carries the
	// token (?token=) or the gateway needs none.
	Token string
	// Batch asks for the chatpipe.v1.batch subprotocol: the server may
	// send several frames, separated by '\n', in one websocket message.
	// The Conn splits them either way.
	Batch bool
	// ReadLimit is the largest websocket message accepted (default 4 MiB).
	ReadLimit int64
	// HTTPClient dials the websocket (default http.DefaultClient).
	HTTPClient *http.Client
	// OnFrame is called with every server frame that answers no request
	// waiting on this Conn (events, read markers, answers to forgotten
	// ids), one at a time from the Conn's reader goroutine, in the order
	// received. It must not keep frame (its bytes are reused), and must not
	// call Close or CloseNow of its Conn.
	OnFrame func(frame []byte)
}

// ErrConnLost is returned by Call when the connection ends before the
// answer comes.
var ErrConnLost = errors.New("client: connection lost")

// Conn is one websocket connection to a chatpipe gateway, multiplexed by
// request id: it writes request frames and hands each answer (a frame
// whose top-level "id" is the request's) to whoever waits for it; every
// other frame goes to ConnOptions.OnFrame. A Conn does not reconnect and
// does not retry: Client does both on top of it, and so do tools with
// retry rules of their own (loadgen). It is safe for concurrent use.
type Conn struct {
	ws   *websocket.Conn
	opts ConnOptions

	mu      sync.Mutex
	waiting map[string]func(frame []byte)
	next    atomic.Uint64

	done chan struct{} // the reader ended
	err  error         // why (set before done closes)
}

// DialConn opens a websocket to the gateway at url (e.g.
// ws://127.0.0.1:8080/v1/ws) and starts its reader.
func DialConn(ctx context.Context, url string, opts ConnOptions) (*Conn, error) {
	if opts.ReadLimit <= 0 {
		opts.ReadLimit = 4 << 20
	}
	do := &websocket.DialOptions{HTTPClient: opts.HTTPClient}
	if opts.Token != "" {
		do.HTTPHeader = http.Header{"Authorization": {"Bearer " + opts.Token}}
	}
	if opts.Batch {
		do.Subprotocols = []string{protocol.SubprotocolBatch}
	}
	ws, resp, err := websocket.Dial(ctx, url, do)
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("client: dial %s: HTTP %d: %w", redact(url), resp.StatusCode, err)
		}
		return nil, fmt.Errorf("client: dial %s: %w", redact(url), err)
	}
	ws.SetReadLimit(opts.ReadLimit)
	c := &Conn{ws: ws, opts: opts, waiting: map[string]func([]byte){}, done: make(chan struct{})}
	go c.read()
	return c, nil
}

// redact drops the query of url (it may hold a token) for error messages.
func redact(url string) string {
	if base, _, ok := strings.Cut(url, "?"); ok {
		return base + "?…"
	}
	return url
}

// NewID returns a request id not used before on this Conn ("c1", "c2", …).
func (c *Conn) NewID() string { return "c" + strconv.FormatUint(c.next.Add(1), 10) }

// Go registers reply as the handler of the answer to id, then writes
// frame (a request whose "id" is id). reply is called at most once, from
// the reader goroutine, with the answer; not at all if the connection ends
// first (see Done) or id is forgotten. reply must not keep the frame it
// is given. A failed write forgets id and returns the error: the
// connection is then failing, and Done will close.
func (c *Conn) Go(ctx context.Context, id string, frame []byte, reply func(frame []byte)) error {
	c.mu.Lock()
	c.waiting[id] = reply
	c.mu.Unlock()
	if err := c.Write(ctx, frame); err != nil {
		c.Forget(id)
		return err
	}
	return nil
}

// Call writes frame (a request whose "id" is id) and waits for its answer,
// which it returns (the caller may keep it). It fails with ErrConnLost
// when the connection ends first, and with ctx's error when ctx ends
// first.
func (c *Conn) Call(ctx context.Context, id string, frame []byte) ([]byte, error) {
	ch := make(chan []byte, 1)
	if err := c.Go(ctx, id, frame, func(b []byte) { ch <- bytes.Clone(b) }); err != nil {
		return nil, err
	}
	select {
	case b := <-ch:
		return b, nil
	case <-c.done:
		select { // answered just before the end
		case b := <-ch:
			return b, nil
		default:
		}
		return nil, fmt.Errorf("%w: %w", ErrConnLost, c.err)
	case <-ctx.Done():
		c.Forget(id)
		return nil, fmt.Errorf("client: no answer to %s: %w", id, ctx.Err())
	}
}

// Forget drops the handler of id: its answer, should it still come, goes
// to OnFrame.
func (c *Conn) Forget(id string) {
	c.mu.Lock()
	delete(c.waiting, id)
	c.mu.Unlock()
}

// Write writes one frame and awaits no answer.
func (c *Conn) Write(ctx context.Context, frame []byte) error {
	if err := c.ws.Write(ctx, websocket.MessageText, frame); err != nil {
		return fmt.Errorf("client: write: %w", err)
	}
	return nil
}

// Subprotocol is the subprotocol the server chose ("" or
// protocol.SubprotocolBatch).
func (c *Conn) Subprotocol() string { return c.ws.Subprotocol() }

// Done is closed when the connection has ended and its reader has
// stopped; Err then says why.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err is why the connection ended (nil while it is open).
func (c *Conn) Err() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// Close closes the connection with a close handshake (code and reason go
// to the server) and waits for the reader to stop.
func (c *Conn) Close(code websocket.StatusCode, reason string) error {
	err := c.ws.Close(code, reason)
	<-c.done
	return err
}

// CloseNow closes the connection without a handshake and waits for the
// reader to stop.
func (c *Conn) CloseNow() error {
	err := c.ws.CloseNow()
	<-c.done
	return err
}

// read dispatches every frame until the connection fails. One buffer
// holds each message in turn.
func (c *Conn) read() {
	var buf bytes.Buffer
	for {
		err := c.readMessage(&buf)
		if err != nil {
			c.err = err
			c.mu.Lock()
			clear(c.waiting)
			c.mu.Unlock()
			close(c.done)
			return
		}
		b := buf.Bytes()
		// A batching connection's message holds frames separated by '\n'
		// (docs/protocol.md); a plain one holds exactly one.
		for len(b) > 0 {
			f := b
			if i := bytes.IndexByte(b, '\n'); i >= 0 {
				f, b = b[:i], b[i+1:]
			} else {
				b = nil
			}
			if len(f) > 0 {
				c.dispatch(f)
			}
		}
		// Once its frames are handled: a buffer grown by a large message
		// (a history page) is not kept for the small ones after it.
		if buf.Cap() > 256<<10 && buf.Len() < 16<<10 {
			buf = bytes.Buffer{}
		}
	}
}

func (c *Conn) readMessage(buf *bytes.Buffer) error {
	_, r, err := c.ws.Reader(context.Background())
	if err != nil {
		return fmt.Errorf("client: read: %w", err)
	}
	buf.Reset()
	if _, err := buf.ReadFrom(r); err != nil {
		return fmt.Errorf("client: read: %w", err)
	}
	return nil
}

// dispatch hands f to the handler waiting for its id, or to OnFrame.
func (c *Conn) dispatch(f []byte) {
	if id, ok := ReplyID(f); ok {
		c.mu.Lock()
		h := c.waiting[string(id)]
		if h != nil {
			delete(c.waiting, string(id))
		}
		c.mu.Unlock()
		if h != nil {
			h(f)
			return
		}
	}
	if c.opts.OnFrame != nil {
		c.opts.OnFrame(f)
	}
}

// ReplyID returns the value of frame's top-level "id" member when it is a
// string without escapes (request ids are [A-Za-z0-9._:-]), without
// decoding the rest of frame. Frames with no such member (events, read
// markers pushed to other devices) report false, as does anything that is
// not a JSON object.
func ReplyID(frame []byte) ([]byte, bool) {
	i := skipSpace(frame, 0)
	if i >= len(frame) || frame[i] != '{' {
		return nil, false
	}
	i++
	for {
		i = skipSpace(frame, i)
		if i >= len(frame) || frame[i] != '"' {
			return nil, false // '}' (no id) or malformed
		}
		ks, ke, next, ok := skipString(frame, i)
		if !ok {
			return nil, false
		}
		i = skipSpace(frame, next)
		if i >= len(frame) || frame[i] != ':' {
			return nil, false
		}
		i = skipSpace(frame, i+1)
		if i >= len(frame) {
			return nil, false
		}
		if string(frame[ks:ke]) == "id" && frame[i] == '"' {
			vs, ve, _, ok := skipString(frame, i)
			if !ok || bytes.IndexByte(frame[vs:ve], '\\') >= 0 {
				return nil, false
			}
			return frame[vs:ve], true
		}
		if i, ok = skipValue(frame, i); !ok {
			return nil, false
		}
		i = skipSpace(frame, i)
		if i >= len(frame) || frame[i] != ',' {
			return nil, false // '}' (no id) or malformed
		}
		i++
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString reads the string starting at b[i] == '"': its contents are
// b[start:end], and next is the index after its closing quote.
func skipString(b []byte, i int) (start, end, next int, ok bool) {
	start = i + 1
	for j := start; ; {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return 0, 0, 0, false
		}
		j += k
		// The quote is escaped when an odd run of backslashes precedes it.
		n := 0
		for p := j - 1; p >= start && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return start, j, j + 1, true
		}
		j++
	}
}

// skipValue returns the index after the JSON value starting at b[i].
func skipValue(b []byte, i int) (int, bool) {
	switch b[i] {
	case '"':
		_, _, next, ok := skipString(b, i)
		return next, ok
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				_, _, next, ok := skipString(b, i)
				if !ok {
					return 0, false
				}
				i = next
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1, true
				}
			}
			i++
		}
		return 0, false
	default: // number, true, false, null
		for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
			i++
		}
		return i, true
	}
}
