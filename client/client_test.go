package client

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/protocol"
)

func dialFake(t *testing.T, f *fakeServer, opts Options) *Client {
	t.Helper()
	if opts.BaseBackoff == 0 {
		opts.BaseBackoff = 20 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, f.url(), StaticToken("tok-u1"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func seqs(es []Event) []int64 {
	var out []int64
	for _, e := range es {
		out = append(out, e.Seq)
	}
	return out
}

func TestSendAndView(t *testing.T) {
	for _, batch := range []bool{false, true} {
		f := newFake(t)
		c := dialFake(t, f, Options{Batch: batch})
		ctx := testCtx(t)
		if _, err := c.Create(ctx, "c1", "u2"); err != nil {
			t.Fatal(err)
		}
		for i, body := range []string{"a", "b", "c"} {
			r, err := c.Send(ctx, "c1", body)
			if err != nil {
				t.Fatal(err)
			}
			if r.Seq != int64(i+2) {
				t.Fatalf("batch=%v: send %d got seq %d", batch, i, r.Seq)
			}
		}
		var got []Event
		for len(got) < 4 {
			select {
			case e := <-c.Events():
				got = append(got, e)
			case <-ctx.Done():
				t.Fatalf("batch=%v: events: got %d of 4", batch, len(got))
			}
		}
		if s := seqs(c.Messages("c1")); len(s) != 4 || s[0] != 1 || s[3] != 4 {
			t.Fatalf("batch=%v: view %v", batch, s)
		}
		if got[3].Body != "c" || got[3].Op != "" {
			t.Fatalf("batch=%v: last event %+v", batch, got[3])
		}
	}
}

func TestRejectedIsAnError(t *testing.T) {
	f := newFake(t)
	c := dialFake(t, f, Options{})
	ctx := testCtx(t)
	if _, err := c.Create(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	_, err := c.Create(ctx, "c1")
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeConflict {
		t.Fatalf("second create: %v, want conflict", err)
	}
}

func TestDialUnauthorized(t *testing.T) {
	f := newFake(t)
	_, err := Dial(testCtx(t), f.url(), StaticToken("wrong"), Options{})
	if err == nil {
		t.Fatal("dial with a bad token succeeded")
	}
}

// A send whose answer is lost with the connection is sent again on the
// next connection with the same client_message_id, and stored once.
func TestResendAfterDisconnect(t *testing.T) {
	f := newFake(t)
	var once sync.Once
	f.hook = func(conn int, req *protocol.Request) string {
		action := ""
		if req.Op == protocol.OpSend {
			once.Do(func() { action = "drop" })
		}
		return action
	}
	c := dialFake(t, f, Options{})
	ctx := testCtx(t)
	if _, err := c.Create(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	r, err := c.Send(ctx, "c1", "hello")
	if err != nil {
		t.Fatal(err)
	}
	sends := f.requests(protocol.OpSend)
	if len(sends) != 2 || sends[0].req.ClientMessageID != sends[1].req.ClientMessageID || sends[0].conn == sends[1].conn {
		t.Fatalf("sends seen: %+v", sends)
	}
	if m := f.messages("c1"); len(m) != 1 || m[0].Seq != r.Seq || m[0].MessageID != r.MessageID {
		t.Fatalf("stored %v, accepted %+v", m, r)
	}
	if c.Connects() != 2 {
		t.Fatalf("connects = %d", c.Connects())
	}
	waitUntil(t, "sync on the new connection", func() bool {
		for _, s := range f.requests(protocol.OpSync) {
			if s.conn == 1 {
				return true
			}
		}
		return false
	})
}

// Only commands without an answer are sent again after a reconnect.
func TestAnsweredNotResent(t *testing.T) {
	f := newFake(t)
	c := dialFake(t, f, Options{})
	ctx := testCtx(t)
	if _, err := c.Create(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := c.Send(ctx, "c1", "x"); err != nil {
			t.Fatal(err)
		}
	}
	f.closeAll()
	waitUntil(t, "reconnect", func() bool { return c.Connects() == 2 })
	if err := c.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(f.requests(protocol.OpSend)); n != 3 {
		t.Fatalf("%d sends seen, want 3", n)
	}
}

// A command with no answer in time is sent again with the same id.
func TestTimeoutRetriesSameID(t *testing.T) {
	f := newFake(t)
	var once sync.Once
	f.hook = func(conn int, req *protocol.Request) string {
		action := ""
		if req.Op == protocol.OpSend {
			once.Do(func() { action = "ignore" })
		}
		return action
	}
	c := dialFake(t, f, Options{RequestTimeout: 200 * time.Millisecond})
	ctx := testCtx(t)
	if _, err := c.Create(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Send(ctx, "c1", "x"); err != nil {
		t.Fatal(err)
	}
	sends := f.requests(protocol.OpSend)
	if len(sends) != 2 || sends[0].req.ClientMessageID != sends[1].req.ClientMessageID {
		t.Fatalf("sends %+v", sends)
	}
	if m := f.messages("c1"); len(m) != 1 {
		t.Fatalf("%d messages stored", len(m))
	}
}

func TestRetryAfterHonoured(t *testing.T) {
	for _, code := range []protocol.Code{protocol.CodeRateLimited, protocol.CodeUnavailable} {
		f := newFake(t)
		var once sync.Once
		f.hook = func(conn int, req *protocol.Request) string {
			action := ""
			if req.Op == protocol.OpSend {
				once.Do(func() {
					action = `{"op":"rejected","id":"` + req.ID + `","code":"` + string(code) + `","message":"slow down","retry_after_ms":300}`
				})
			}
			return action
		}
		c := dialFake(t, f, Options{})
		ctx := testCtx(t)
		if _, err := c.Create(ctx, "c1"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Send(ctx, "c1", "x"); err != nil {
			t.Fatal(err)
		}
		s := f.requests(protocol.OpSend)
		if len(s) != 2 || s[0].req.ClientMessageID != s[1].req.ClientMessageID {
			t.Fatalf("%s: sends %+v", code, s)
		}
		if gap := s[1].at.Sub(s[0].at); gap < 300*time.Millisecond {
			t.Fatalf("%s: retried after %v, want ≥ 300ms", code, gap)
		}
	}
}

// Pushed twice, synced and fetched again: each event is delivered once
// and the view is in seq order whatever the arrival order.
func TestDedupeAndOrder(t *testing.T) {
	f := newFake(t)
	f.dupPush = true
	var mu sync.Mutex
	var got []Event
	c := dialFake(t, f, Options{OnEvent: func(e Event) { mu.Lock(); got = append(got, e); mu.Unlock() }})
	ctx := testCtx(t)
	if _, err := c.Create(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	e2 := f.add("c1", "two")
	e3 := f.add("c1", "three")
	f.pushAll(ctx, e3)
	f.pushAll(ctx, e2)
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.HistoryAll(ctx, "c1", 2); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "3 events", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= 3 })
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	n := len(got)
	mu.Unlock()
	if n != 3 {
		t.Fatalf("%d events delivered, want 3", n)
	}
	if s := seqs(c.Messages("c1")); len(s) != 3 || s[0] != 1 || s[1] != 2 || s[2] != 3 {
		t.Fatalf("view %v", s)
	}
}

// Sync pages while the server says more, and the next connection syncs
// from the cursors reached.
func TestSyncPagingAndCursors(t *testing.T) {
	f := newFake(t)
	f.syncPage = 2
	for i := range 5 {
		f.add("c1", string(rune('a'+i)))
	}
	c := dialFake(t, f, Options{})
	ctx := testCtx(t)
	if err := c.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	if s := seqs(c.Messages("c1")); len(s) != 5 {
		t.Fatalf("view after sync %v", s)
	}
	if n := len(f.requests(protocol.OpSync)); n != 3 {
		t.Fatalf("%d syncs, want 3 pages", n)
	}
	if cur := c.Cursors(); cur["c1"] != 5 {
		t.Fatalf("cursors %v", cur)
	}
	f.closeAll()
	f.add("c1", "while away")
	waitUntil(t, "reconnect", func() bool { return c.Connects() == 2 })
	if err := c.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	syncs := f.requests(protocol.OpSync)
	if last := syncs[3].req; last.Cursors["c1"] != 5 {
		t.Fatalf("sync after reconnect from %v, want c1:5", last.Cursors)
	}
	if s := seqs(c.Messages("c1")); len(s) != 6 {
		t.Fatalf("view after reconnect %v", s)
	}
}

func TestHistoryAndConversations(t *testing.T) {
	f := newFake(t)
	for range 7 {
		f.add("c1", "x")
	}
	c := dialFake(t, f, Options{})
	ctx := testCtx(t)
	all, err := c.HistoryAll(ctx, "c1", 3)
	if err != nil {
		t.Fatal(err)
	}
	if s := seqs(all); len(s) != 7 || s[0] != 1 || s[6] != 7 {
		t.Fatalf("history %v", s)
	}
	list, err := c.ListConversations(ctx, 0)
	if err != nil || len(list) != 1 || list[0].LastSeq != 7 {
		t.Fatalf("conversations %v %v", list, err)
	}
}

func TestCloseEndsCalls(t *testing.T) {
	f := newFake(t)
	f.hook = func(int, *protocol.Request) string { return "ignore" }
	c := dialFake(t, f, Options{})
	errc := make(chan error, 1)
	go func() { _, err := c.Send(context.Background(), "c1", "x"); errc <- err }()
	waitUntil(t, "send seen", func() bool { return len(f.requests(protocol.OpSend)) > 0 })
	c.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("send after close: %v", err)
	}
	if _, ok := <-c.Events(); ok {
		t.Fatal("events channel open after Close")
	}
}

// unauthorized on an open connection (its token expired) dials again with
// a fresh token and sends the command again.
func TestUnauthorizedRedials(t *testing.T) {
	f := newFake(t)
	f.hook = func(conn int, req *protocol.Request) string {
		if conn == 0 && req.Op == protocol.OpSend {
			return `{"op":"rejected","id":"` + req.ID + `","code":"unauthorized","message":"token expired"}`
		}
		return ""
	}
	var mu sync.Mutex
	tokens := 0
	ts := func(context.Context) (string, error) { mu.Lock(); tokens++; mu.Unlock(); return "tok-u1", nil }
	c, err := Dial(testCtx(t), f.url(), ts, Options{BaseBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := testCtx(t)
	if _, err := c.Create(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Send(ctx, "c1", "x"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if tokens < 2 || len(f.messages("c1")) != 1 {
		t.Fatalf("%d tokens asked, %d messages stored", tokens, len(f.messages("c1")))
	}
}

func TestBackoff(t *testing.T) {
	base, maxB := 250*time.Millisecond, 30*time.Second
	for n := range 100 {
		ceiling := min(maxB, base<<min(n, 20))
		for range 20 {
			if d := Backoff(n, base, maxB); d < 0 || d > ceiling {
				t.Fatalf("Backoff(%d) = %v, want within [0, %v]", n, d, ceiling)
			}
		}
	}
}
