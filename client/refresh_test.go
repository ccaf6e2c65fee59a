package client

import (
	"context"
	"encoding/base64"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/protocol"
)

// testToken is an (unsigned) JWT of u1 expiring at exp: the fake server
// reads exp without verifying, as the client does.
func testToken(exp time.Time, n int) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." +
		enc([]byte(fmt.Sprintf(`{"sub":"u1","exp":%.3f,"jti":"t%d"}`, float64(exp.UnixMilli())/1000, n))) + ".c2ln"
}

// mintingSource hands out tokens valid for ttl, counting them.
type mintingSource struct {
	ttl time.Duration
	mu  sync.Mutex
	n   int
}

func (m *mintingSource) token(context.Context) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.n++
	return testToken(time.Now().Add(m.ttl), m.n), nil
}

func (m *mintingSource) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}

func TestTokenExpiry(t *testing.T) {
	at := time.UnixMilli(1_800_000_000_500)
	if exp, ok := tokenExpiry(testToken(at, 1)); !ok || !exp.Equal(at) {
		t.Fatalf("exp %v %v, want %v", exp, ok, at)
	}
	enc := base64.RawURLEncoding.EncodeToString
	for _, bad := range []string{"tok-u1", "a.b.c", "a." + enc([]byte(`{"sub":"u1"}`)) + ".c", "a." + enc([]byte(`{"exp":"soon"}`)) + ".c"} {
		if _, ok := tokenExpiry(bad); ok {
			t.Errorf("tokenExpiry(%q) read an exp", bad)
		}
	}
}

// The client refreshes the connection's token before it expires: a send
// past the first token's exp is accepted on the same connection, with no
// unauthorized answer and no new dial.
func TestRefreshKeepsTheConnection(t *testing.T) {
	f := newFake(t)
	f.tokens = true
	src := &mintingSource{ttl: 2 * time.Second}
	c, err := Dial(testCtx(t), f.url(), src.token, Options{RefreshBefore: time.Second, BaseBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := testCtx(t)
	if _, err := c.Create(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3500 * time.Millisecond) // past the first token's exp, and the second's
	if _, err := c.Send(ctx, "c1", "late"); err != nil {
		t.Fatal(err)
	}
	if n := c.Connects(); n != 1 {
		t.Fatalf("%d connections, want 1 (refreshed in place)", n)
	}
	refreshes := f.requests(protocol.OpRefresh)
	if len(refreshes) < 2 {
		t.Fatalf("%d refreshes in 3.5 s of 2 s tokens, want at least 2", len(refreshes))
	}
	if first := refreshes[0].at.Sub(f.requests(protocol.OpSync)[0].at); first > 1500*time.Millisecond {
		t.Fatalf("first refresh %v after the first sync, want about 1 s after the connect", first)
	}
	if src.count() != len(refreshes)+1 {
		t.Fatalf("%d tokens asked for %d refreshes and one dial", src.count(), len(refreshes))
	}
}

// A server that refuses the refresh (here: one without the op) leaves the
// client to its fallback: the command answered unauthorized after the
// token's expiry makes it dial again with a fresh token.
func TestRefreshRefusedFallsBackToRedial(t *testing.T) {
	f := newFake(t)
	f.tokens = true
	f.hook = func(conn int, req *protocol.Request) string {
		if req.Op == protocol.OpRefresh {
			return `{"op":"rejected","id":"` + req.ID + `","code":"bad_request","message":"unknown op \"refresh\""}`
		}
		return ""
	}
	src := &mintingSource{ttl: 2 * time.Second}
	c, err := Dial(testCtx(t), f.url(), src.token, Options{RefreshBefore: time.Second, BaseBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := testCtx(t)
	if _, err := c.Create(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond)
	if _, err := c.Send(ctx, "c1", "late"); err != nil {
		t.Fatal(err)
	}
	if n := c.Connects(); n != 2 {
		t.Fatalf("%d connections, want 2 (a redial after unauthorized)", n)
	}
	if n := len(f.requests(protocol.OpRefresh)); n != 1 {
		t.Fatalf("%d refreshes, want 1 (a refused refresh is not tried again)", n)
	}
}
