package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"

	chatclient "github.com/chatpipe/chatpipe/client"
	"github.com/chatpipe/chatpipe/internal/auth/authtest"
	"github.com/chatpipe/chatpipe/protocol"
)

// dialToken opens a websocket of `chatpipe dev` with tok; it fails the
// test unless the upgrade succeeds.
func (p *devProc) dialToken(t *testing.T, user, tok string) *client {
	t.Helper()
	cl, err := p.DialWith(t, user, tok)
	if err != nil {
		t.Fatalf("dial as %s: %v", user, err)
	}
	return cl
}

// upgrade tries a websocket upgrade with tok; status is the HTTP status of
// a refused one.
func (p *devProc) upgrade(tok string) (*websocket.Conn, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, p.EP.WebSocket, &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}}})
	status := 0
	if resp != nil {
		status = resp.StatusCode
	}
	return c, status, err
}

func signed(t *testing.T, k *authtest.Key, user string, ttl time.Duration) string {
	t.Helper()
	tok, err := k.Sign(authtest.Claims{Subject: user, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestJWKSTokens runs `chatpipe dev --jwks-url` against a JWK Set served by
// the test: JWKS-signed tokens (RS256, EdDSA, ES256) open connections and
// send; refresh keeps a connection alive past its first token's expiry
// while one without it is answered unauthorized; a refresh with another
// user's token is forbidden; the Go client refreshes by itself; and after
// the set rotates, the new key works and the rotated-out one is refused at
// the upgrade (HTTP 401), all without restarting the gateway. HS256 tokens
// of the dev secret keep working beside the JWK Set.
func TestJWKSTokens(t *testing.T) {
	sharing(t, 10, 13)
	newKey := func(kid, alg string) *authtest.Key {
		k, err := authtest.NewKey(kid, alg)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	rs, ed, es := newKey("rs-2026-1", "RS256"), newKey("ed-2026-1", "EdDSA"), newKey("es-2026-2", "ES256")
	jwks := authtest.NewServer(rs, ed)
	defer jwks.Close()
	dev := startDev(t, t.TempDir(), "--jwks-url", jwks.URL(), "--jwt-leeway", "1s")

	// A JWKS-signed token opens a connection that writes.
	alice := dev.dialToken(t, "alice", signed(t, rs, "alice", time.Hour))
	alice.Must(map[string]any{"op": "create", "conversation_id": "jw1", "members": []string{"bob"}, "client_message_id": "k-create"})
	if r, err := alice.SendRetrying("jw1", "m-1", "signed by the identity provider"); err != nil || r.Op != protocol.OpAccepted {
		t.Fatalf("send with a JWKS token: %+v %v", r, err)
	}
	// The dev secret's HS256 tokens work beside the JWK Set.
	bobHS := dev.Dial(t, "bob")
	if r, err := bobHS.SendRetrying("jw1", "m-2", "signed with the shared secret"); err != nil || r.Op != protocol.OpAccepted {
		t.Fatalf("send with an HS256 token: %+v %v", r, err)
	}

	// Two connections on a token of about 3 s (exp is in whole seconds,
	// so 2–3 s; the gateway allows 1 s of skew): one refreshes at ~1 s.
	start := time.Now()
	short := signed(t, rs, "alice", 3*time.Second)
	refreshed := dev.dialToken(t, "alice", short)
	plain := dev.dialToken(t, "alice", short)
	time.Sleep(time.Until(start.Add(time.Second)))
	r, err := refreshed.Do(map[string]any{"op": "refresh", "token": signed(t, ed, "alice", time.Hour)})
	if err != nil || r.Op != protocol.OpAccepted || r.ExpiresAt == "" {
		t.Fatalf("refresh: %+v %v", r, err)
	}
	if exp, err := time.Parse(time.RFC3339Nano, r.ExpiresAt); err != nil || time.Until(exp) < 50*time.Minute {
		t.Fatalf("refresh answered expires_at %q (%v), want the new token's exp, an hour away", r.ExpiresAt, err)
	}
	// Another user's token: forbidden, and the connection keeps its own.
	r, err = plain.Do(map[string]any{"op": "refresh", "token": signed(t, rs, "bob", time.Hour)})
	if err != nil || r.Code != protocol.CodeForbidden {
		t.Fatalf("refresh with bob's token on alice's connection: %+v %v, want forbidden", r, err)
	}
	r, err = plain.Do(map[string]any{"op": "refresh", "token": "not-a-token"})
	if err != nil || r.Code != protocol.CodeUnauthorized {
		t.Fatalf("refresh with a bad token: %+v %v, want unauthorized", r, err)
	}
	time.Sleep(time.Until(start.Add(5 * time.Second)))
	if r, err := refreshed.SendRetrying("jw1", "m-3", "still here at 5 s"); err != nil || r.Op != protocol.OpAccepted {
		t.Fatalf("send at 5 s after a refresh: %+v %v, want accepted", r, err)
	}
	r, err = plain.Do(map[string]any{"op": "send", "conversation_id": "jw1", "client_message_id": "m-4", "body": "expired"})
	if err != nil || r.Code != protocol.CodeUnauthorized {
		t.Fatalf("send at 5 s without a refresh: %+v %v, want unauthorized", r, err)
	}
	// A refresh brings the expired connection back.
	r, err = plain.Do(map[string]any{"op": "refresh", "token": signed(t, rs, "alice", time.Hour)})
	if err != nil || r.Op != protocol.OpAccepted {
		t.Fatalf("refresh after the expiry: %+v %v", r, err)
	}
	if r, err := plain.SendRetrying("jw1", "m-4", "back"); err != nil || r.Op != protocol.OpAccepted {
		t.Fatalf("send after a late refresh: %+v %v", r, err)
	}

	// The Go client refreshes its connection's 3 s tokens by itself: a
	// send at 5 s is accepted on its first connection.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src := func(context.Context) (string, error) {
		return rs.Sign(authtest.Claims{Subject: "bob", TTL: 3 * time.Second})
	}
	gc, err := chatclient.Dial(ctx, dev.EP.WebSocket, src, chatclient.Options{RefreshBefore: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	if err := gc.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	if _, err := gc.Send(ctx, "jw1", "the Go client, 5 s in"); err != nil {
		t.Fatalf("Go client send at 5 s: %v", err)
	}
	if n := gc.Connects(); n != 1 {
		t.Fatalf("the Go client opened %d connections, want 1 (refreshed in place)", n)
	}

	// Rotation: the set now holds only a new key. A token of the new key
	// works at once (its unknown kid fetches the set again), and from then
	// on the rotated-out keys are refused at the upgrade.
	jwks.SetKeys(es)
	carol := dev.dialToken(t, "carol", signed(t, es, "carol", time.Hour))
	carol.Must(map[string]any{"op": "create", "conversation_id": "jw2", "client_message_id": "k-jw2"})
	for _, k := range []*authtest.Key{rs, ed} {
		if c, status, err := dev.upgrade(signed(t, k, "alice", time.Hour)); err == nil || status != http.StatusUnauthorized {
			if c != nil {
				c.CloseNow()
			}
			t.Fatalf("upgrade with a rotated-out %s key: HTTP %d, %v; want 401", k.Alg, status, err)
		}
	}
	// A refresh with a rotated-out key's token is unauthorized too.
	r, err = carol.Do(map[string]any{"op": "refresh", "token": signed(t, rs, "carol", time.Hour)})
	if err != nil || r.Code != protocol.CodeUnauthorized {
		t.Fatalf("refresh with a rotated-out key: %+v %v, want unauthorized", r, err)
	}
}
