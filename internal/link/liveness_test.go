package link

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/protocol"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func serve(t *testing.T, h Handler, cfg Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); Serve(ctx, ln, h, cfg, quiet()) }()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

// A worker's reply must never wait for a gateway that does not read: the
// shard loop calling it would freeze. The link is closed instead.
func TestReplyToPeerThatDoesNotReadDoesNotBlock(t *testing.T) {
	replies := make(chan func(*Response), 1)
	addr := serve(t, func(req *Request, reply func(*Response)) {
		select {
		case replies <- reply:
		default:
		}
	}, Config{})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, _ := json.Marshal(&Request{RID: 1, User: "u1", Req: &protocol.Request{Op: protocol.OpSend, ID: "r1"}})
	c.Write(append(b, '\n'))
	reply := <-replies
	big := strings.Repeat("x", 16<<10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// more than the queue and the socket buffers hold; the peer reads nothing
		for i := 0; i < 8000; i++ {
			reply(&Response{RID: 1, Reply: &protocol.Reply{Op: protocol.OpRejected, ID: "r1", Message: big}})
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("reply blocked on a peer that does not read")
	}
	// The link is closed: reading drains what was sent, then ends.
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, bufio.NewReader(c)); err != nil {
		t.Fatalf("link not closed: %v", err)
	}
}

// A write that the peer never takes fails at the write deadline and closes
// the link, even with room left in the queue.
func TestStalledWriteClosesTheLink(t *testing.T) {
	replies := make(chan func(*Response), 1)
	addr := serve(t, func(req *Request, reply func(*Response)) {
		select {
		case replies <- reply:
		default:
		}
	}, Config{WriteTimeout: 200 * time.Millisecond, QueueLen: 1 << 20})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, _ := json.Marshal(&Request{RID: 1, User: "u1", Req: &protocol.Request{Op: protocol.OpSend, ID: "r1"}})
	c.Write(append(b, '\n'))
	reply := <-replies
	big := strings.Repeat("x", 16<<10)
	for i := 0; i < 2000; i++ { // ~32 MB: more than the socket buffers
		reply(&Response{RID: 1, Reply: &protocol.Reply{Op: protocol.OpRejected, ID: "r1", Message: big}})
	}
	time.Sleep(time.Second) // past the write deadline
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, bufio.NewReader(c)); err != nil {
		t.Fatalf("link not closed after its write deadline: %v", err)
	}
}

// A pooled link whose peer accepted the connection and then went silent
// (half-open) is detected by the missing pongs: Done closes within the read
// timeout, and a call waiting on it ends as an unknown outcome.
func TestHalfOpenLinkIsDetected(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // never read, never answered
		}
	}()
	cfg := Config{PingInterval: 50 * time.Millisecond, ReadTimeout: 300 * time.Millisecond}
	cl, err := Dial(context.Background(), ln.Addr().String(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	start := time.Now()
	errc := make(chan error, 1)
	go func() {
		_, err := cl.Do(context.Background(), "u1", &protocol.Request{Op: protocol.OpSend, ID: "r1"})
		errc <- err
	}()
	select {
	case <-cl.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("half-open link not detected")
	}
	if took := time.Since(start); took > cfg.ReadTimeout+time.Second {
		t.Fatalf("detected after %v, read timeout %v", took, cfg.ReadTimeout)
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("pending call: %v, want ErrClosed", err)
	}
	if _, err := cl.Do(context.Background(), "u1", &protocol.Request{Op: protocol.OpSend, ID: "r2"}); !errors.Is(err, ErrNotSent) {
		t.Fatalf("call on a closed link: %v, want ErrNotSent", err)
	}
}

// A live but idle link stays up: pings are answered with pongs.
func TestIdleLinkStaysUp(t *testing.T) {
	cfg := Config{PingInterval: 50 * time.Millisecond, ReadTimeout: time.Second}
	addr := serve(t, func(req *Request, reply func(*Response)) {
		reply(&Response{RID: req.RID, Reply: &protocol.Reply{Op: protocol.OpAccepted, ID: req.Req.ID}})
	}, cfg)
	cl, err := Dial(context.Background(), addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	select {
	case <-cl.Done():
		t.Fatal("an idle, healthy link was closed")
	case <-time.After(3 * time.Second):
	}
	resp, err := cl.Do(context.Background(), "u1", &protocol.Request{Op: protocol.OpSend, ID: "r1"})
	if err != nil || resp.Reply.ID != "r1" {
		t.Fatalf("call after idling: %v %+v", err, resp)
	}
}

// The call's context deadline travels as a budget; the worker's side turns
// it into a deadline on its own clock at receipt.
func TestDeadlineRoundTrips(t *testing.T) {
	got := make(chan *Request, 2)
	addr := serve(t, func(req *Request, reply func(*Response)) {
		got <- req
		reply(&Response{RID: req.RID, Reply: &protocol.Reply{Op: protocol.OpAccepted, ID: req.Req.ID}})
	}, Config{})
	cl, err := Dial(context.Background(), addr, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	sent := time.Now()
	if _, err := cl.Do(ctx, "u1", &protocol.Request{Op: protocol.OpSend, ID: "r1"}); err != nil {
		t.Fatal(err)
	}
	req := <-got
	if req.Budget <= 2*time.Second || req.Budget > 3*time.Second {
		t.Fatalf("budget %v, want just under 3s", req.Budget)
	}
	if req.Deadline.Before(sent.Add(2*time.Second)) || req.Deadline.After(time.Now().Add(3*time.Second)) {
		t.Fatalf("deadline %v is not about 3s after %v", req.Deadline, sent)
	}

	if _, err := cl.Do(context.Background(), "u1", &protocol.Request{Op: protocol.OpSend, ID: "r2"}); err != nil {
		t.Fatal(err)
	}
	if req := <-got; req.Budget != 0 || !req.Deadline.IsZero() {
		t.Fatalf("no deadline: got budget %v deadline %v", req.Budget, req.Deadline)
	}

	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	if _, err := cl.Do(expired, "u1", &protocol.Request{Op: protocol.OpSend, ID: "r3"}); !errors.Is(err, ErrNotSent) {
		t.Fatalf("expired context: %v, want ErrNotSent", err)
	}
	select {
	case req := <-got:
		t.Fatalf("a request past its deadline was sent: %+v", req)
	case <-time.After(100 * time.Millisecond):
	}
}

// A worker of the version before pings rejects a line without a command
// and answers every command; the ping's dummy command keeps the link up.
func TestPingKeepsLinkToOlderWorkerUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // the older serveConn: every line is a command
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					var req struct {
						RID uint64            `json:"rid"`
						Req *protocol.Request `json:"req"`
					}
					if json.Unmarshal(sc.Bytes(), &req) != nil || req.Req == nil {
						return
					}
					rep := protocol.Rejected(req.Req.ID, protocol.Errorf(protocol.CodeBadRequest, "unknown op"))
					if req.Req.Op == protocol.OpSend {
						rep = &protocol.Reply{Op: protocol.OpAccepted, ID: req.Req.ID}
					}
					b, _ := json.Marshal(&Response{RID: req.RID, Reply: rep})
					c.Write(append(b, '\n'))
				}
			}()
		}
	}()
	cl, err := Dial(context.Background(), ln.Addr().String(), Config{PingInterval: 50 * time.Millisecond, ReadTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	select {
	case <-cl.Done():
		t.Fatal("the link to an older worker was closed")
	case <-time.After(3 * time.Second):
	}
	if resp, err := cl.Do(context.Background(), "u1", &protocol.Request{Op: protocol.OpSend, ID: "r1"}); err != nil || resp.Reply.Op != protocol.OpAccepted {
		t.Fatalf("call: %v %+v", err, resp)
	}
}

// TestDecodeLines: what encoding/json writes is read the same by the
// one-parse decoder, and a line with a field this build does not know
// (a newer peer) is still read.
func TestDecodeLines(t *testing.T) {
	in := &Request{RID: 7, User: "u1", Budget: 1500 * time.Millisecond,
		Req: &protocol.Request{Op: protocol.OpSync, ID: "r1", Cursors: map[string]int64{"c1": 4, "c2": 9}}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out Request
	if err := decode(b, &out); err != nil || !reflect.DeepEqual(in, &out) {
		t.Fatalf("decode(%s) = %+v %v", b, out, err)
	}
	var newer Request
	line := []byte(`{"rid":8,"user":"u1","budget_ns":2000000000,"req":{"op":"sync","id":"r2","cursors":{"c1":1}},"priority":3}`)
	if err := decode(line, &newer); err != nil || newer.RID != 8 || newer.Budget != 2*time.Second || newer.Req.Cursors["c1"] != 1 || len(newer.Req.Cursors) != 1 {
		t.Fatalf("decode of a line with an unknown field: %+v %v", newer, err)
	}
}

// TestBurstOfAnswersKeepsAHealthyLink: a worker answers a whole batch at
// once (a vshard's group commit answers up to a thousand commands in a
// row, and many vshards share one link). A gateway that reads normally
// must never see its link closed for that: it keeps fewer requests in
// flight than the worker's queue holds.
func TestBurstOfAnswersKeepsAHealthyLink(t *testing.T) {
	var mu sync.Mutex
	var held []func()
	addr := serve(t, func(req *Request, reply func(*Response)) {
		mu.Lock()
		defer mu.Unlock()
		r := &Response{RID: req.RID, Reply: &protocol.Reply{Op: protocol.OpAccepted, ID: req.Req.ID}}
		held = append(held, func() { reply(r) })
	}, Config{QueueLen: 256})
	stop := make(chan struct{})
	defer close(stop)
	go func() { // answer everything held, all at once, every 20 ms
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			mu.Lock()
			batch := held
			held = nil
			mu.Unlock()
			for _, f := range batch {
				f()
			}
		}
	}()
	cl, err := Dial(context.Background(), addr, Config{QueueLen: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := 0; i < 3000; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := cl.Do(ctx, "u1", &protocol.Request{Op: protocol.OpSend, ID: "r"}); err != nil {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of 3000 calls failed on a healthy link answered in bursts", n)
	}
}

// TestLinesMatchMarshal checks the hand-written line encoders against
// json.Marshal, which older peers' lines were made with.
func TestLinesMatchMarshal(t *testing.T) {
	reqs := []*Request{
		{RID: 1},
		{RID: 1 << 63, User: "alice<>", Budget: 15 * time.Second,
			Req: &protocol.Request{Op: protocol.OpSend, ID: "r1", ConversationID: "c", ClientMessageID: "m", Body: "é \"x\""}},
		{Ping: true, Req: &protocol.Request{Op: "ping"}},
		{RID: 9, Budget: -1, Req: &protocol.Request{Op: protocol.OpSync, ID: "r2", Cursors: map[string]int64{"b": 1, "a": 2}}},
	}
	for _, r := range reqs {
		want, _ := json.Marshal(r)
		if got := appendRequest(nil, r); string(got) != string(want) {
			t.Errorf("appendRequest\n got %s\nwant %s", got, want)
		}
	}
	resps := []*Response{
		{RID: 1},
		{RID: 2, Retry: true},
		{Pong: true},
		{RID: 3, Reply: &protocol.Reply{Op: protocol.OpAccepted, ID: "r1", ConversationID: "c", Seq: 4, MessageID: "01K", ClientMessageID: "m"}},
		{RID: 5, Reply: &protocol.Reply{Op: protocol.OpRejected, ID: "r2", Code: protocol.CodeForbidden, Message: "not a <member>"}, Retry: true, Pong: true},
	}
	for _, r := range resps {
		want, _ := json.Marshal(r)
		if got := appendResponse(nil, r); string(got) != string(want) {
			t.Errorf("appendResponse\n got %s\nwant %s", got, want)
		}
	}
}
