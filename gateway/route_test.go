package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/link"
	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/protocol"
)

// fakeWorker speaks the wire protocol by hand; answer decides, for each
// command it reads (n counts that op's requests so far), whether to answer
// it (nil: the connection is dropped without an answer, as by a worker
// that died after committing).
type fakeWorker struct {
	ln     net.Listener
	mu     sync.Mutex
	counts map[string]int
	answer func(op string, n int, req *link.Request) *link.Response
}

func newFakeWorker(t *testing.T, answer func(op string, n int, req *link.Request) *link.Response) *fakeWorker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeWorker{ln: ln, counts: map[string]int{}, answer: answer}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go f.serve(c)
		}
	}()
	return f
}

func (f *fakeWorker) serve(c net.Conn) {
	defer c.Close()
	sc := bufio.NewScanner(c)
	enc := json.NewEncoder(c)
	for sc.Scan() {
		var req link.Request
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			return
		}
		if req.Ping {
			enc.Encode(&link.Response{RID: req.RID, Pong: true})
			continue
		}
		f.mu.Lock()
		f.counts[req.Req.Op]++
		n := f.counts[req.Req.Op]
		f.mu.Unlock()
		resp := f.answer(req.Req.Op, n, &req)
		if resp == nil {
			return
		}
		resp.RID = req.RID
		enc.Encode(resp)
	}
}

func (f *fakeWorker) count(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts[op]
}

func testGateway(t *testing.T, addr string) *Gateway {
	t.Helper()
	owners := lease.Static(lease.View{
		Shards:  map[int]lease.Row{0: {Owner: lease.Owner{Worker: "w1", Gen: 1, Epoch: 1}}},
		Workers: map[string]lease.WorkerInfo{"w1": {Addr: addr, Gen: 1}},
	})
	g, err := New(Config{Owners: owners, VShards: 1, Secret: []byte("s"), RouteTimeout: 2 * time.Second,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Shutdown(context.Background()) })
	return g
}

func accept(req *link.Request, seq int64) *link.Response {
	return &link.Response{Reply: &protocol.Reply{Op: protocol.OpAccepted, ID: req.Req.ID, ConversationID: req.Req.ConversationID, Seq: seq}}
}

// A join whose first attempt has an unknown outcome must not be sent
// again by the gateway: the first attempt may have added the user, who may
// have been kicked since; a second attempt would add them back (one
// command, two effects). The client gets unavailable and decides.
func TestJoinWithUnknownOutcomeIsNotRetried(t *testing.T) {
	var mu sync.Mutex
	member := false
	var seq int64 = 1
	f := newFakeWorker(t, func(op string, n int, req *link.Request) *link.Response {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case op == protocol.OpJoin && n == 1:
			seq++ // the join is committed ...
			member = true
			seq++ // ... the owner kicks the user right after ...
			member = false
			return nil // ... and the join's answer is lost with the connection
		case op == protocol.OpJoin:
			if !member {
				seq++
				member = true
			}
			return accept(req, seq)
		}
		return nil
	})
	g := testGateway(t, f.ln.Addr().String())
	rep := g.handle(context.Background(), "u1", &protocol.Request{Op: protocol.OpJoin, ID: "r1", ConversationID: "c1", UserID: "u2"})
	mu.Lock()
	defer mu.Unlock()
	if n := f.count(protocol.OpJoin); n != 1 {
		t.Fatalf("the worker got the join %d times (member again: %v)", n, member)
	}
	if rep.Op != protocol.OpRejected || rep.Code != protocol.CodeUnavailable || rep.RetryAfterMS <= 0 {
		t.Fatalf("reply %+v, want unavailable with retry_after_ms", rep)
	}
	if !strings.Contains(rep.Message, "unknown") {
		t.Fatalf("reply %q does not say the outcome is unknown", rep.Message)
	}
}

// A join the worker answered with a retry (nothing was written: it does not
// own the vshard yet) is sent again by the gateway.
func TestJoinNotWrittenIsRetried(t *testing.T) {
	f := newFakeWorker(t, func(op string, n int, req *link.Request) *link.Response {
		if n == 1 {
			return &link.Response{Retry: true, Reply: protocol.Rejected(req.Req.ID, protocol.Errorf(protocol.CodeUnavailable, "not the owner"))}
		}
		return accept(req, 7)
	})
	g := testGateway(t, f.ln.Addr().String())
	rep := g.handle(context.Background(), "u1", &protocol.Request{Op: protocol.OpJoin, ID: "r1", ConversationID: "c1", UserID: "u2"})
	if rep.Op != protocol.OpAccepted || rep.Seq != 7 || f.count(protocol.OpJoin) != 2 {
		t.Fatalf("reply %+v after %d attempts, want accepted after 2", rep, f.count(protocol.OpJoin))
	}
}

// A send with an unknown outcome is still retried by the gateway: dedupe
// by client_message_id returns the first result.
func TestSendWithUnknownOutcomeIsRetried(t *testing.T) {
	f := newFakeWorker(t, func(op string, n int, req *link.Request) *link.Response {
		if n == 1 {
			return nil
		}
		return accept(req, 3)
	})
	g := testGateway(t, f.ln.Addr().String())
	rep := g.handle(context.Background(), "u1", &protocol.Request{Op: protocol.OpSend, ID: "r1", ConversationID: "c1", ClientMessageID: "m1", Body: "hi"})
	if rep.Op != protocol.OpAccepted || f.count(protocol.OpSend) != 2 {
		t.Fatalf("reply %+v after %d attempts, want accepted after 2", rep, f.count(protocol.OpSend))
	}
}

// A keyed join with an unknown outcome is resent: the writer dedupes it by
// its client_message_id, so the second attempt answers the first result.
func TestKeyedJoinWithUnknownOutcomeIsRetried(t *testing.T) {
	f := newFakeWorker(t, func(op string, n int, req *link.Request) *link.Response {
		if n == 1 {
			return nil
		}
		return accept(req, 4)
	})
	g := testGateway(t, f.ln.Addr().String())
	rep := g.handle(context.Background(), "u1", &protocol.Request{Op: protocol.OpJoin, ID: "r1", ConversationID: "c1", UserID: "u2", ClientMessageID: "j1"})
	if rep.Op != protocol.OpAccepted || f.count(protocol.OpJoin) != 2 {
		t.Fatalf("reply %+v after %d attempts, want accepted after 2", rep, f.count(protocol.OpJoin))
	}
}

// kick, leave and create without a key with an unknown outcome answer
// unavailable after one attempt.
func TestMembershipOpsWithUnknownOutcomeAreNotRetried(t *testing.T) {
	f := newFakeWorker(t, func(op string, n int, req *link.Request) *link.Response { return nil })
	g := testGateway(t, f.ln.Addr().String())
	for _, req := range []*protocol.Request{
		{Op: protocol.OpCreate, ID: "r1", ConversationID: "c1"},
		{Op: protocol.OpKick, ID: "r2", ConversationID: "c1", UserID: "u2"},
		{Op: protocol.OpLeave, ID: "r3", ConversationID: "c1"},
	} {
		rep := g.handle(context.Background(), "u1", req)
		if rep.Code != protocol.CodeUnavailable || f.count(req.Op) != 1 {
			t.Fatalf("%s: reply %+v after %d attempts, want unavailable after 1", req.Op, rep, f.count(req.Op))
		}
	}
}

// Every call carries the gateway's remaining budget for it.
func TestCallsCarryTheirBudget(t *testing.T) {
	got := make(chan time.Duration, 1)
	f := newFakeWorker(t, func(op string, n int, req *link.Request) *link.Response {
		got <- req.Budget
		return accept(req, 1)
	})
	g := testGateway(t, f.ln.Addr().String())
	g.handle(context.Background(), "u1", &protocol.Request{Op: protocol.OpSend, ID: "r1", ConversationID: "c1", ClientMessageID: "m1", Body: "hi"})
	if b := <-got; b <= 0 || b > g.cfg.CallTimeout {
		t.Fatalf("budget %v, want in (0, %v]", b, g.cfg.CallTimeout)
	}
}

// A pooled link whose worker went silent (half-open: accepted, then
// nothing, not even pongs) is dropped by its health check well before the
// call timeout, and the next attempt dials a fresh link.
func TestHalfOpenPooledLinkIsReplaced(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	live := &fakeWorker{counts: map[string]int{}, answer: func(op string, n int, req *link.Request) *link.Response { return accept(req, 5) }}
	conns := make(chan int, 10)
	go func() {
		for i := 1; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- i
			if i == 1 {
				defer c.Close() // the first link: never read, never answered
				continue
			}
			go live.serve(c)
		}
	}()
	owners := lease.Static(lease.View{
		Shards:  map[int]lease.Row{0: {Owner: lease.Owner{Worker: "w1", Gen: 1, Epoch: 1}}},
		Workers: map[string]lease.WorkerInfo{"w1": {Addr: ln.Addr().String(), Gen: 1}},
	})
	g, err := New(Config{Owners: owners, VShards: 1, Secret: []byte("s"),
		Wire: link.Config{PingInterval: 50 * time.Millisecond, ReadTimeout: 300 * time.Millisecond},
		Log:  slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Shutdown(context.Background())
	start := time.Now()
	rep := g.handle(context.Background(), "u1", &protocol.Request{Op: protocol.OpSend, ID: "r1", ConversationID: "c1", ClientMessageID: "m1", Body: "hi"})
	if rep.Op != protocol.OpAccepted || rep.Seq != 5 {
		t.Fatalf("reply %+v", rep)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("took %v: the silent link was not dropped by its health check", took)
	}
	if n := len(conns); n != 2 {
		t.Fatalf("%d links dialled, want 2 (the silent one, then a fresh one)", n)
	}
}
