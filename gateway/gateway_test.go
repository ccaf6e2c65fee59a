package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/link"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// fakeGateway is a gateway over fake owners and workers; edit tunes its
// config.
func fakeGateway(t testing.TB, owners *fakeOwners, n *fakeNet, edit func(*Config)) *Gateway {
	t.Helper()
	cfg := Config{Owners: owners, VShards: 1, Secret: []byte("secret"), Dial: n.dial,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if edit != nil {
		edit(&cfg)
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Shutdown(context.Background()) })
	return g
}

func send(id, conv string) *protocol.Request {
	return &protocol.Request{Op: protocol.OpSend, ID: id, ConversationID: conv, ClientMessageID: "m-" + id, Body: "hi"}
}

// Each command goes to the owner of its conversation's vshard, over one
// link per worker.
func TestCommandsGoToTheOwnerOfTheirVShard(t *testing.T) {
	const vshards = 8
	owners, n := newFakeOwners(), newFakeNet()
	addr := func(v int) string { return "w" + strconv.Itoa(v%3) }
	for v := range vshards {
		owners.set(v, addr(v), 1)
	}
	for _, w := range []string{"w0", "w1", "w2"} {
		n.worker(w, acceptAs(w, 1))
	}
	g := fakeGateway(t, owners, n, func(c *Config) { c.VShards = vshards })
	for i := range 32 {
		conv := "c" + strconv.Itoa(i)
		want := addr(logrecord.VShard(conv, vshards))
		rep := g.handle(context.Background(), "u1", send(strconv.Itoa(i), conv))
		if rep.Op != protocol.OpAccepted || rep.MessageID != want {
			t.Fatalf("%s (vshard %d): reply %+v, want accepted by %s", conv, logrecord.VShard(conv, vshards), rep, want)
		}
	}
	for _, w := range []string{"w0", "w1", "w2"} {
		calls := n.calls(w)
		if len(calls) == 0 {
			t.Fatalf("%s got no command: pick conversations that hash to every worker", w)
		}
		for _, r := range calls {
			if got := addr(logrecord.VShard(r.ConversationID, vshards)); got != w {
				t.Fatalf("%s got a command for %s, owned by %s", w, r.ConversationID, got)
			}
		}
		if d := n.dials(w); d != 1 {
			t.Fatalf("%d links dialled to %s, want 1 reused", d, w)
		}
	}
	if a := g.Stats().Accepted.Load(); a != 32 {
		t.Fatalf("accepted counter %d, want 32", a)
	}
}

// A vshard nobody owns is answered unavailable with retry_after_ms once
// the route budget is spent, without dialling anyone.
func TestUnownedVShardIsUnavailable(t *testing.T) {
	owners, n := newFakeOwners(), newFakeNet()
	g := fakeGateway(t, owners, n, func(c *Config) { c.RouteTimeout = 150 * time.Millisecond })
	start := time.Now()
	rep := g.handle(context.Background(), "u1", send("r1", "c1"))
	took := time.Since(start)
	if rep.Op != protocol.OpRejected || rep.Code != protocol.CodeUnavailable || rep.RetryAfterMS != 1000 || rep.ID != "r1" {
		t.Fatalf("reply %+v, want unavailable for r1 with retry_after_ms 1000", rep)
	}
	if !strings.Contains(rep.Message, "vshard 0 has no live owner") {
		t.Fatalf("message %q does not name the ownerless vshard", rep.Message)
	}
	if took < 150*time.Millisecond {
		t.Fatalf("answered after %v, before the route budget (150ms) was spent", took)
	}
	if u := g.Stats().Unavailable.Load(); u != 1 {
		t.Fatalf("unavailable counter %d, want 1", u)
	}
}

// A command waiting for an owner goes out as soon as one appears.
func TestCommandWaitsForAnOwner(t *testing.T) {
	owners, n := newFakeOwners(), newFakeNet()
	n.worker("w1", acceptAs("w1", 3))
	g := fakeGateway(t, owners, n, func(c *Config) { c.RouteTimeout = 5 * time.Second })
	time.AfterFunc(100*time.Millisecond, func() { owners.set(0, "w1", 1) })
	start := time.Now()
	rep := g.handle(context.Background(), "u1", send("r1", "c1"))
	if rep.Op != protocol.OpAccepted || rep.MessageID != "w1" {
		t.Fatalf("reply %+v, want accepted by w1", rep)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("took %v after the owner appeared at 100ms", took)
	}
}

// A worker that answers retry (it no longer owns the vshard) has the
// gateway ask the new owner, within the same command.
func TestRetryGoesToTheNewOwner(t *testing.T) {
	owners, n := newFakeOwners(), newFakeNet()
	owners.set(0, "old", 1)
	n.worker("old", func(_ context.Context, _ string, req *protocol.Request) (*link.Response, error) {
		owners.set(0, "new", 2) // handed off while the command was on its way
		return retryAnswer(req, "not the owner"), nil
	})
	n.worker("new", acceptAs("new", 9))
	g := fakeGateway(t, owners, n, nil)
	rep := g.handle(context.Background(), "u1", &protocol.Request{Op: protocol.OpJoin, ID: "r1", ConversationID: "c1", UserID: "u2"})
	if rep.Op != protocol.OpAccepted || rep.MessageID != "new" || rep.Seq != 9 {
		t.Fatalf("reply %+v, want accepted by the new owner", rep)
	}
	if o, nw := len(n.calls("old")), len(n.calls("new")); o != 1 || nw != 1 {
		t.Fatalf("old owner got %d attempts, new owner %d; want 1 each", o, nw)
	}
}

// A worker that keeps answering retry runs out the route budget: the
// client is told unavailable, with what the worker said.
func TestRetriesStopAtTheRouteBudget(t *testing.T) {
	owners, n := newFakeOwners(), newFakeNet()
	owners.set(0, "w1", 1)
	n.worker("w1", func(_ context.Context, _ string, req *protocol.Request) (*link.Response, error) {
		return retryAnswer(req, "not accepting yet"), nil
	})
	g := fakeGateway(t, owners, n, func(c *Config) { c.RouteTimeout = 200 * time.Millisecond })
	start := time.Now()
	rep := g.handle(context.Background(), "u1", send("r1", "c1"))
	took := time.Since(start)
	if rep.Code != protocol.CodeUnavailable || rep.RetryAfterMS <= 0 || !strings.Contains(rep.Message, "answered: not accepting yet") {
		t.Fatalf("reply %+v, want unavailable quoting the worker", rep)
	}
	if a := len(n.calls("w1")); a < 2 {
		t.Fatalf("%d attempts, want the command retried within the budget", a)
	}
	if took < 200*time.Millisecond || took > 2*time.Second {
		t.Fatalf("gave up after %v, route budget 200ms", took)
	}
}

// A keyed command at an owner that never answers is asked of the new
// owner as soon as the vshard moves, well before the call timeout.
func TestFrozenOwnerIsLeftWhenTheShardMoves(t *testing.T) {
	owners, n := newFakeOwners(), newFakeNet()
	owners.set(0, "frozen", 1)
	asked := make(chan struct{}, 1)
	n.worker("frozen", func(ctx context.Context, _ string, _ *protocol.Request) (*link.Response, error) {
		asked <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	n.worker("new", acceptAs("new", 4))
	g := fakeGateway(t, owners, n, func(c *Config) { c.CallTimeout = 10 * time.Second })
	go func() { <-asked; owners.set(0, "new", 2) }()
	start := time.Now()
	rep := g.handle(context.Background(), "u1", send("r1", "c1"))
	if rep.Op != protocol.OpAccepted || rep.MessageID != "new" {
		t.Fatalf("reply %+v, want accepted by the new owner", rep)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("took %v: the call waited for its timeout instead of the move", took)
	}
	l := n.links["frozen"][0]
	if err := l.ctxs[0].Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("the frozen owner's call ended with %v, want cancelled by the move", err)
	}
}

// A command without a key is not taken from a frozen owner when the
// vshard moves: the first attempt may yet take effect. It ends at the
// call timeout as an unknown outcome, and the new owner never sees it.
func TestUnkeyedCommandStaysWithItsOwnerWhenTheShardMoves(t *testing.T) {
	owners, n := newFakeOwners(), newFakeNet()
	owners.set(0, "frozen", 1)
	asked := make(chan struct{}, 1)
	n.worker("frozen", func(ctx context.Context, _ string, _ *protocol.Request) (*link.Response, error) {
		asked <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	n.worker("new", acceptAs("new", 4))
	g := fakeGateway(t, owners, n, func(c *Config) { c.CallTimeout = 300 * time.Millisecond })
	go func() { <-asked; owners.set(0, "new", 2) }()
	rep := g.handle(context.Background(), "u1", &protocol.Request{Op: protocol.OpKick, ID: "r1", ConversationID: "c1", UserID: "u2"})
	if rep.Code != protocol.CodeUnavailable || !strings.Contains(rep.Message, "unknown") {
		t.Fatalf("reply %+v, want unavailable with an unknown outcome", rep)
	}
	if c := len(n.calls("new")); c != 0 {
		t.Fatalf("the new owner got the unkeyed kick %d times", c)
	}
	if err := n.links["frozen"][0].ctxs[0].Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the call ended with %v, want its own timeout", err)
	}
}

// Every attempt runs under CallTimeout, which is what the link sends on
// as the command's budget.
func TestAttemptRunsUnderTheCallTimeout(t *testing.T) {
	owners, n := newFakeOwners(), newFakeNet()
	owners.set(0, "w1", 1)
	n.worker("w1", acceptAs("w1", 1))
	g := fakeGateway(t, owners, n, func(c *Config) { c.CallTimeout = 700 * time.Millisecond })
	start := time.Now()
	g.handle(context.Background(), "u1", send("r1", "c1"))
	d, ok := n.links["w1"][0].ctxs[0].Deadline()
	if !ok {
		t.Fatal("the call's context has no deadline")
	}
	if left := d.Sub(start); left <= 0 || left > 700*time.Millisecond+50*time.Millisecond {
		t.Fatalf("call deadline %v after the command, want about the call timeout (700ms)", left)
	}
}

// A worker's final answer (not a retry) is the client's answer, after one
// attempt; unavailable without retry is taken as final only for a command
// that could not be safely sent again.
func TestWorkerAnswersArePassedOn(t *testing.T) {
	owners, n := newFakeOwners(), newFakeNet()
	owners.set(0, "w1", 1)
	n.worker("w1", func(_ context.Context, _ string, req *protocol.Request) (*link.Response, error) {
		switch {
		case req.Op == protocol.OpKick:
			return &link.Response{Reply: protocol.Rejected(req.ID, protocol.Errorf(protocol.CodeForbidden, "not the owner of c1"))}, nil
		case req.Op == protocol.OpLeave:
			return &link.Response{Reply: protocol.Rejected(req.ID, protocol.Errorf(protocol.CodeUnavailable, "busy"))}, nil
		case req.Op == protocol.OpSend && req.ID == "r3":
			return &link.Response{Reply: protocol.Rejected(req.ID, protocol.Errorf(protocol.CodeUnavailable, "busy"))}, nil
		}
		return acceptAs("w1", 2)(context.Background(), "", req)
	})
	g := fakeGateway(t, owners, n, func(c *Config) { c.RouteTimeout = 300 * time.Millisecond })

	rep := g.handle(context.Background(), "u1", &protocol.Request{Op: protocol.OpKick, ID: "r1", ConversationID: "c1", UserID: "u2"})
	if rep.Code != protocol.CodeForbidden || rep.Message != "not the owner of c1" || len(n.calls("w1")) != 1 {
		t.Fatalf("kick: reply %+v after %d attempts, want the worker's forbidden after 1", rep, len(n.calls("w1")))
	}
	rep = g.handle(context.Background(), "u1", &protocol.Request{Op: protocol.OpLeave, ID: "r2", ConversationID: "c1"})
	if rep.Code != protocol.CodeUnavailable || rep.Message != "busy" || len(n.calls("w1")) != 2 {
		t.Fatalf("unkeyed leave: reply %+v after %d attempts in all, want the worker's unavailable after 1", rep, len(n.calls("w1")))
	}
	rep = g.handle(context.Background(), "u1", send("r3", "c1"))
	if rep.Code != protocol.CodeUnavailable || !strings.Contains(rep.Message, "answered: busy") || len(n.calls("w1")) < 4 {
		t.Fatalf("keyed send: reply %+v after %d attempts in all, want retried until the budget ran out", rep, len(n.calls("w1")))
	}
	if r := g.Stats().Rejected.Load(); r != 1 {
		t.Fatalf("rejected counter %d, want 1 (the forbidden kick)", r)
	}
}

// A worker that cannot be dialled is answered unavailable; a link that
// went away is replaced by a fresh one on the next command.
func TestLinksAreDialledAgain(t *testing.T) {
	owners, n := newFakeOwners(), newFakeNet()
	owners.set(0, "w1", 1)
	g := fakeGateway(t, owners, n, func(c *Config) { c.RouteTimeout = 100 * time.Millisecond })
	rep := g.handle(context.Background(), "u1", send("r1", "c1"))
	if rep.Code != protocol.CodeUnavailable || !strings.Contains(rep.Message, "cannot reach its owner") {
		t.Fatalf("reply %+v, want unavailable: cannot reach its owner", rep)
	}
	n.worker("w1", acceptAs("w1", 1))
	if rep := g.handle(context.Background(), "u1", send("r2", "c1")); rep.Op != protocol.OpAccepted {
		t.Fatalf("reply %+v once the worker listens", rep)
	}
	n.links["w1"][0].Close()
	if rep := g.handle(context.Background(), "u1", send("r3", "c1")); rep.Op != protocol.OpAccepted {
		t.Fatalf("reply %+v after the link closed", rep)
	}
	if d := n.dials("w1"); d != 2 {
		t.Fatalf("%d links dialled, want 2 (the first closed)", d)
	}
	if c := len(n.links["w1"][1].calls); c != 1 {
		t.Fatalf("the fresh link carried %d commands, want 1", c)
	}
}

// Shutdown closes the pooled links.
func TestShutdownClosesLinks(t *testing.T) {
	owners, n := newFakeOwners(), newFakeNet()
	owners.set(0, "w1", 1)
	n.worker("w1", acceptAs("w1", 1))
	g := fakeGateway(t, owners, n, nil)
	g.handle(context.Background(), "u1", send("r1", "c1"))
	g.Shutdown(context.Background())
	select {
	case <-n.links["w1"][0].Done():
	default:
		t.Fatal("the link is still open after Shutdown")
	}
}

// A create or join that would put someone past MaxConvsPerUser is
// refused too_large before it reaches a worker; a read model that cannot
// be asked lets it through.
func TestConversationCap(t *testing.T) {
	owners, n := newFakeOwners(), newFakeNet()
	owners.set(0, "w1", 1)
	n.worker("w1", acceptAs("w1", 1))
	reads := &fakeReads{open: map[string]int{"u1": 2, "u3": 3}}
	g := fakeGateway(t, owners, n, func(c *Config) { c.Reads, c.MaxConvsPerUser = reads, 3 })

	rep := g.handle(context.Background(), "u1", &protocol.Request{Op: protocol.OpCreate, ID: "r1", ConversationID: "c9", Members: []string{"u2", "u3"}})
	if rep.Code != protocol.CodeTooLarge || !strings.Contains(rep.Message, "u3 is in 3 conversations") {
		t.Fatalf("create: reply %+v, want too_large naming u3", rep)
	}
	if who, except := reads.openArgs[0].([]string), reads.openArgs[1]; !slices.Equal(who, []string{"u1", "u2", "u3"}) || except != "c9" {
		t.Fatalf("counted %v except %v, want the creator and members except c9", who, except)
	}
	rep = g.handle(context.Background(), "u3", &protocol.Request{Op: protocol.OpJoin, ID: "r2", ConversationID: "c9", UserID: "u1"})
	if rep.Op != protocol.OpAccepted {
		t.Fatalf("join of u1 (in 2 of 3): reply %+v", rep)
	}
	if who := reads.openArgs[0].([]string); !slices.Equal(who, []string{"u1"}) {
		t.Fatalf("join counted %v, want only the joining user", who)
	}
	if c := len(n.calls("w1")); c != 1 {
		t.Fatalf("worker got %d commands, want only the join", c)
	}
	reads.openErr = errors.New("db down")
	rep = g.handle(context.Background(), "u1", &protocol.Request{Op: protocol.OpCreate, ID: "r3", ConversationID: "c10", Members: []string{"u3"}})
	if rep.Op != protocol.OpAccepted {
		t.Fatalf("create with the read model down: reply %+v, want it let through", rep)
	}
}

// Ready, and /readyz, say whether any vshard has a live owner.
func TestReady(t *testing.T) {
	owners, n := newFakeOwners(), newFakeNet()
	g := fakeGateway(t, owners, n, func(c *Config) { c.VShards = 4 })
	srv := httptest.NewServer(g.Handler())
	defer srv.Close()
	status := func() int {
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if err := g.Ready(); err == nil || status() != http.StatusServiceUnavailable {
		t.Fatalf("Ready with no owner: %v, /readyz %d", err, status())
	}
	owners.set(3, "w1", 1)
	if err := g.Ready(); err != nil || status() != http.StatusOK {
		t.Fatalf("Ready with vshard 3 owned: %v, /readyz %d", err, status())
	}
}
