package gateway

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/internal/auth"
	"github.com/chatpipe/chatpipe/internal/auth/authtest"
	"github.com/chatpipe/chatpipe/protocol"
)

// refreshGateway is a gateway whose tokens are HS256 with "secret" or
// signed by key (served as a JWK Set), with no leeway.
func refreshGateway(t *testing.T, key *authtest.Key) (*Gateway, string) {
	t.Helper()
	jwks := authtest.NewServer(key)
	t.Cleanup(jwks.Close)
	v, err := auth.NewVerifier(context.Background(), auth.Options{Secret: []byte("secret"), JWKSURL: jwks.URL(), Leeway: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	g, srv := readGateway(t, nil, func(c *Config) { c.Tokens = v })
	return g, srv.URL
}

func dialToken(t *testing.T, base, tok string) *wsClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/v1/ws",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return &wsClient{t: t, c: c}
}

func mint(t *testing.T, user string, ttl time.Duration) string {
	t.Helper()
	tok, err := auth.Mint([]byte("secret"), user, ttl, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// expect reads the next frame and checks its op, id and code.
func (w *wsClient) expect(op, id string, code protocol.Code) serverFrame {
	w.t.Helper()
	f := w.read()
	if f.Op != op || f.ID != id || f.Code != string(code) {
		w.t.Fatalf("got %+v, want %s %s %s", f, op, id, code)
	}
	return f
}

func sendFrame(id string) string {
	return `{"op":"send","id":"` + id + `","conversation_id":"c1","client_message_id":"m-` + id + `","body":"hi"}`
}

func refreshFrame(id, tok string) string {
	return `{"op":"refresh","id":"` + id + `","token":"` + tok + `"}`
}

// refresh replaces the connection's token: past the first token's expiry
// the connection still takes commands; without it they answer
// unauthorized. A token of another user is forbidden and a bad one
// unauthorized, and neither changes the connection's token.
func TestRefreshReplacesTheToken(t *testing.T) {
	key, err := authtest.NewKey("k1", "ES256")
	if err != nil {
		t.Fatal(err)
	}
	g, base := refreshGateway(t, key)
	first := mint(t, "u1", 2*time.Second)
	refreshed := dialToken(t, base, first)
	plain := dialToken(t, base, first)
	other := dialToken(t, base, first)

	jwksTok, err := key.Sign(authtest.Claims{Subject: "u1", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	refreshed.write(refreshFrame("f1", jwksTok))
	f := refreshed.read()
	if f.Op != protocol.OpAccepted || f.ID != "f1" {
		t.Fatalf("refresh: %+v", f)
	}

	u2, err := key.Sign(authtest.Claims{Subject: "u2"})
	if err != nil {
		t.Fatal(err)
	}
	other.write(refreshFrame("f2", u2))
	other.expect(protocol.OpRejected, "f2", protocol.CodeForbidden)
	other.write(refreshFrame("f3", "garbage"))
	other.expect(protocol.OpRejected, "f3", protocol.CodeUnauthorized)
	other.write(sendFrame("s0")) // the first token still works
	other.expect(protocol.OpAccepted, "s0", "")

	_, exp, err := auth.Verify([]byte("secret"), first)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(exp) + 300*time.Millisecond)
	refreshed.write(sendFrame("s1"))
	refreshed.expect(protocol.OpAccepted, "s1", "")
	plain.write(sendFrame("s2"))
	plain.expect(protocol.OpRejected, "s2", protocol.CodeUnauthorized)
	other.write(sendFrame("s3"))
	other.expect(protocol.OpRejected, "s3", protocol.CodeUnauthorized)

	// A refresh after the expiry brings the connection back.
	plain.write(refreshFrame("f4", mint(t, "u1", time.Hour)))
	plain.expect(protocol.OpAccepted, "f4", "")
	plain.write(sendFrame("s4"))
	plain.expect(protocol.OpAccepted, "s4", "")

	if n := g.Stats().Accepted.Load(); n != 5 {
		t.Fatalf("accepted counter %d, want 5 (2 refreshes, 3 sends)", n)
	}
}

// The answer to refresh carries the new token's exp.
func TestRefreshAnswerCarriesTheExpiry(t *testing.T) {
	key, err := authtest.NewKey("k1", "RS256")
	if err != nil {
		t.Fatal(err)
	}
	_, base := refreshGateway(t, key)
	w := dialToken(t, base, mint(t, "u1", time.Hour))
	exp := time.Now().Add(3 * time.Hour).Truncate(time.Second)
	tok, err := auth.Mint([]byte("secret"), "u1", time.Until(exp), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	w.write(refreshFrame("f1", tok))
	raw, err := w.readRaw(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"op":"accepted","id":"f1","expires_at":"` + protocol.FormatTime(exp) + `"}`
	if raw != want {
		t.Fatalf("answer %s, want %s", raw, want)
	}
	w.write(`{"op":"refresh","id":"f2"}`)
	w.expect(protocol.OpRejected, "f2", protocol.CodeBadRequest)
}

// An upgrade with a token of a key outside the set is refused with 401.
func TestUpgradeWithAForeignKeyIsRefused(t *testing.T) {
	key, err := authtest.NewKey("k1", "EdDSA")
	if err != nil {
		t.Fatal(err)
	}
	_, base := refreshGateway(t, key)
	stranger, err := authtest.NewKey("k1", "EdDSA")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := stranger.Sign(authtest.Claims{Subject: "u1"})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(base + "/v1/ws?token=" + tok)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401", resp.StatusCode)
	}
	good, err := key.Sign(authtest.Claims{Subject: "u1"})
	if err != nil {
		t.Fatal(err)
	}
	w := dialToken(t, base, good)
	w.write(sendFrame("s1"))
	w.expect(protocol.OpAccepted, "s1", "")
}
