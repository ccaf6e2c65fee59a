package client

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/internal/jitter"
)

// The connection's life: a dial with a token from the TokenSource, serving
// the connection (commands sent again, the sync, the token's refresher),
// and a new dial with full-jitter backoff once it is lost.

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
			if !jitter.Sleep(c.ctx, Backoff(attempt, c.opts.BaseBackoff, c.opts.MaxBackoff)) {
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
