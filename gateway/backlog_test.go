package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/internal/auth"
	"github.com/chatpipe/chatpipe/internal/delivery"
	"github.com/chatpipe/chatpipe/protocol"
)

// smallSocket is the kernel buffer size asked for on both ends of a slow
// device's TCP connection: with the default (autotuned to megabytes on
// loopback) the kernel takes a whole burst at once, the gateway's writer
// never waits, and a slow reader is not slow for the gateway.
const smallSocket = 64 << 10

// smallBufListener gives every accepted connection small kernel buffers.
type smallBufListener struct{ net.Listener }

func (l smallBufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(smallSocket)
		tc.SetReadBuffer(smallSocket)
	}
	return c, err
}

// serveSmallSockets serves g over HTTP on connections with small kernel
// buffers.
func serveSmallSockets(t testing.TB, g *Gateway) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(g.Handler())
	srv.Listener = smallBufListener{srv.Listener}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// dialSmallSocket connects a device of user whose socket has a small
// receive buffer (see smallSocket).
func dialSmallSocket(t testing.TB, srv *httptest.Server, user string, subprotocols ...string) *wsClient {
	t.Helper()
	tok, err := auth.Mint([]byte("secret"), user, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetReadBuffer(smallSocket)
			tc.SetWriteBuffer(smallSocket)
		}
		return c, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/ws?token="+tok,
		&websocket.DialOptions{Subprotocols: subprotocols, HTTPClient: &http.Client{Transport: &http.Transport{DialContext: dial}}})
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadLimit(1 << 20) // a batched message may be up to maxBatchBytes
	t.Cleanup(func() { c.CloseNow() })
	return &wsClient{t: t, c: c}
}

// backlogActive reports whether a device of user is reading a backlog back.
func backlogActive(g *Gateway, user string) bool {
	active := false
	g.users.each(user, func(s *session) {
		s.backlog.mu.Lock()
		active = active || s.backlog.active
		s.backlog.mu.Unlock()
	})
	return active
}

// seqOrder checks, for one device, what a device may rely on: per
// conversation, every event arrives for the first time in seq order (a
// repeat of one that already arrived is a duplicate, which clients drop),
// and pushed read markers never go back.
type seqOrder struct {
	device  string
	high    map[string]int64 // per conversation, the highest seq so far (all below it arrived too)
	markers map[string]int64 // the highest marker so far
	dups    int
}

func newSeqOrder(device string) *seqOrder {
	return &seqOrder{device: device, high: map[string]int64{}, markers: map[string]int64{}}
}

// frame checks one frame the device received.
func (o *seqOrder) frame(f serverFrame) error {
	switch f.Op {
	case protocol.OpEvent:
		h := o.high[f.ConversationID]
		switch {
		case f.Seq <= h:
			o.dups++
		case f.Seq == h+1:
			o.high[f.ConversationID] = f.Seq
		default:
			return fmt.Errorf("%s device, conversation %s: seq %d arrived while the highest so far was %d (seqs %d..%d come later or never)",
				o.device, f.ConversationID, f.Seq, h, h+1, f.Seq-1)
		}
	case protocol.OpRead:
		if m := o.markers[f.ConversationID]; f.Seq < m {
			return fmt.Errorf("%s device, conversation %s: read marker %d arrived after marker %d", o.device, f.ConversationID, f.Seq, m)
		}
		o.markers[f.ConversationID] = f.Seq
	default:
		return fmt.Errorf("%s device: unexpected frame %+v", o.device, f)
	}
	return nil
}

// complete reports whether every conversation of convs reached seq last
// and marker last; if not, it says where the device stands.
func (o *seqOrder) complete(convs []string, last int64) (bool, string) {
	for _, c := range convs {
		if o.high[c] < last || o.markers[c] < last {
			return false, fmt.Sprintf("%s device, conversation %s: events up to seq %d and marker %d of %d", o.device, c, o.high[c], o.markers[c], last)
		}
	}
	return true, ""
}

// readSlowly reads d's frames, pausing every few messages, and checks each
// with o until o is complete for convs at last or ctx ends.
func readSlowly(ctx context.Context, d *wsClient, o *seqOrder, convs []string, last int64) error {
	for n := 1; ; n++ {
		if done, _ := o.complete(convs, last); done {
			return nil
		}
		_, msg, err := d.c.Read(ctx)
		if err != nil {
			_, where := o.complete(convs, last)
			return fmt.Errorf("%s device: %w; waiting for %s", o.device, err, where)
		}
		for _, b := range bytes.Split(msg, newline) {
			var f serverFrame
			if err := json.Unmarshal(b, &f); err != nil {
				return fmt.Errorf("%s device: frame %q: %w", o.device, b, err)
			}
			if err := o.frame(f); err != nil {
				return err
			}
		}
		if n%4 == 0 {
			time.Sleep(time.Millisecond) // a slow reader: a message at a time, with pauses
		}
	}
}

// A device that reads slowly while pushes keep coming uses the backlog
// over and over: pushes that find its send buffer full are read back from
// the read model as it drains, while more are pushed. Per conversation,
// each event still arrives for the first time in seq order — never a
// higher seq before a lower one — and none is lost; read markers never go
// back and the last one arrives; the device is not closed. Both kinds of
// device: one message per frame, and batching.
func TestSlowReaderGetsEachConversationInSeqOrder(t *testing.T) {
	const perConv = 500
	convs := []string{"c1", "c2", "c3"}
	pad := strings.Repeat("x", 2048) // a few frames fill the small socket buffers
	reads := &fakeReads{marks: map[string]int64{}}
	g, _ := readGateway(t, reads, func(c *Config) { c.SendBuffer, c.SyncMax = 16, 25 })
	srv := serveSmallSockets(t, g)
	plain := dialSmallSocket(t, srv, "u1")
	batch := dialSmallSocket(t, srv, "u1", protocol.SubprotocolBatch)
	if !waitFor(5*time.Second, func() bool { return devices(g, "u1") == 2 }) {
		t.Fatal("the devices were not attached")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The feed, in rounds: each round stores a few events of each
	// conversation (and now and then moves a read marker) in the read
	// model, and pushes what was stored two rounds before: the read model
	// is ahead of the feed, as the projection is ahead of delivery.Feed. It
	// pushes in bursts: until a device's send buffer is full and some
	// rounds more while that device reads the backlog back, then it lets
	// the devices drain.
	var duringBacklog atomic.Int64 // rounds pushed while a device was reading a backlog back
	var feed sync.WaitGroup
	feed.Add(1)
	go func() {
		defer feed.Done()
		rng := rand.New(rand.NewPCG(1, 2))
		next := map[string]int64{}
		marker := func(c string, seq int64) delivery.Push {
			reads.marks[c] = seq
			return delivery.Push{Conv: c, Seq: seq, Read: true,
				Frame: protocol.EncodeReadMarker(&protocol.ReadMarker{Op: protocol.OpRead, ConversationID: c, Seq: seq})}
		}
		var lag [][]delivery.Push // stored, not pushed yet
		for round, extra := 0, 0; ; round++ {
			var pushes []delivery.Push
			reads.mu.Lock()
			for _, c := range convs {
				for k := rng.IntN(4); k > 0 && next[c] < perConv; k-- {
					next[c]++
					e := &protocol.Event{Op: protocol.OpEvent, ConversationID: c, Seq: next[c], Kind: "message", Sender: "u2", Body: fmt.Sprint("m", next[c], pad)}
					reads.stored = append(reads.stored, e)
					pushes = append(pushes, delivery.Push{Conv: c, Seq: e.Seq, Frame: protocol.EncodeEvent(e)})
				}
			}
			if c := convs[round%len(convs)]; round%2 == 0 && next[c] > reads.marks[c] {
				pushes = append(pushes, marker(c, next[c]))
			}
			last := true
			for _, c := range convs {
				last = last && next[c] == perConv
			}
			if last { // every conversation read to its end
				for _, c := range convs {
					pushes = append(pushes, marker(c, perConv))
				}
			}
			reads.mu.Unlock()
			lag = append(lag, pushes)
			for len(lag) > 2 || last && len(lag) > 0 {
				if backlogActive(g, "u1") {
					duringBacklog.Add(1)
					extra++
				}
				g.Deliver("u1", lag[0])
				lag = lag[1:]
			}
			if last {
				return
			}
			if extra < 10 {
				time.Sleep(100 * time.Microsecond) // pushes go on while the backlog is read back
				continue
			}
			extra = 0
			for backlogActive(g, "u1") {
				select {
				case <-ctx.Done(): // the devices stopped reading: their readers say why
					return
				case <-time.After(time.Millisecond):
				}
			}
		}
	}()
	defer feed.Wait()

	errs := make(chan error, 2)
	for name, d := range map[string]*wsClient{"plain": plain, "batching": batch} {
		go func() {
			err := readSlowly(ctx, d, newSeqOrder(name), convs, perConv)
			if err != nil {
				cancel() // the first failure ends the test
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	}
	feed.Wait()
	if g.backlogged.Load() == 0 || duringBacklog.Load() == 0 {
		t.Errorf("backlogs %d, rounds pushed during one %d: the test did not exercise the read-back", g.backlogged.Load(), duringBacklog.Load())
	}
	if n := g.slowClosed.Load(); n != 0 {
		t.Errorf("slow readers closed %d, want 0", n)
	}
}
