package web

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/auth"
)

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// server mounts the pages on a mux whose other paths answer "gateway", as
// the gateway's own handler would.
func server(t *testing.T, cfg Config) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "gateway", http.StatusNotFound)
	})
	cfg.Log = testLog(t)
	if err := Mount(mux, cfg); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, u string) (int, string, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
}

func TestPages(t *testing.T) {
	srv := server(t, Config{})
	for _, tc := range []struct {
		path     string
		status   int
		ctype    string
		contains string
	}{
		{"/", 200, "text/html", "chatpipe · chat"},
		{"/?user=alice", 200, "text/html", `<script type="module" src="/web/chat.js">`},
		{"/ops", 200, "text/html", `src="/web/ops.js"`},
		{"/ops", 200, "text/html", `id="dedicated"`},
		{"/web/chat.js", 200, "text/javascript", "'/dev/token'"},
		{"/web/chat.js", 200, "text/javascript", "from './client/index.js'"},
		{"/web/client/index.js", 200, "text/javascript", "Client"},
		{"/web/client/client.js", 200, "text/javascript", "markRead"},
		{"/web/ops.js", 200, "text/javascript", "/ops/state"},
		{"/web/ops.js", 200, "text/javascript", "renderDedicated"},
		{"/web/style.css", 200, "text/css", "#grid"},
		{"/web/config", 200, "application/json", `"dev": false`},
		{"/web/index.html", 404, "", ""},
		{"/web/", 404, "", ""},
		{"/ops/state", 503, "", "no pipeline state"},
		{"/v1/ws", 404, "", "gateway"}, // still the gateway's
		{"/metrics", 404, "", "gateway"},
	} {
		code, ctype, body := get(t, srv.URL+tc.path)
		if code != tc.status {
			t.Errorf("GET %s: %d, want %d", tc.path, code, tc.status)
		}
		if !strings.HasPrefix(ctype, tc.ctype) {
			t.Errorf("GET %s: Content-Type %q, want %s…", tc.path, ctype, tc.ctype)
		}
		if !strings.Contains(body, tc.contains) {
			t.Errorf("GET %s: body does not contain %q:\n%.300s", tc.path, tc.contains, body)
		}
	}
}

func TestDevTokenOnlyInDev(t *testing.T) {
	srv := server(t, Config{})
	resp, err := http.PostForm(srv.URL+"/dev/token", url.Values{"user": {"alice"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("POST /dev/token outside dev: %s, want 404", resp.Status)
	}
	if err := Mount(http.NewServeMux(), Config{Dev: true}); err == nil {
		t.Fatal("Mount in dev mode without a secret: no error")
	}
}

func TestDevToken(t *testing.T) {
	secret := []byte("test-secret")
	srv := server(t, Config{Dev: true, Secret: secret, TokenTTL: time.Hour})
	mint := func(ctype, body string) (int, map[string]any) {
		t.Helper()
		resp, err := http.Post(srv.URL+"/dev/token", ctype, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, out
	}
	for user, req := range map[string][2]string{
		"alice": {"application/json", `{"user":"alice"}`},
		"bob":   {"application/x-www-form-urlencoded", "user=bob"},
	} {
		code, out := mint(req[0], req[1])
		if code != http.StatusOK {
			t.Fatalf("mint for %s: %d %v", user, code, out)
		}
		tok, _ := out["token"].(string)
		sub, exp, err := auth.Verify(secret, tok)
		if err != nil {
			t.Fatalf("token for %s: %v", user, err)
		}
		if sub != user || out["user"] != user {
			t.Fatalf("token for %s: sub %q, answer %v", user, sub, out)
		}
		if left := time.Until(exp); left < 59*time.Minute || left > time.Hour+time.Second {
			t.Fatalf("token for %s expires in %v, want an hour", user, left)
		}
	}
	for _, body := range []string{"user=not+an+id", "user="} {
		if code, out := mint("application/x-www-form-urlencoded", body); code != http.StatusBadRequest {
			t.Fatalf("mint with %q: %d %v", body, code, out)
		}
	}
	if code, out := mint("application/json", "{"); code != http.StatusBadRequest {
		t.Fatalf("mint with bad JSON: %d %v", code, out)
	}
}

// MountChat serves the chat page without the pipeline page, MountOps the
// pipeline page without the chat page; both serve the scripts.
func TestMountChatAndOpsApart(t *testing.T) {
	serve := func(mount func(*http.ServeMux, Config) error) *httptest.Server {
		mux := http.NewServeMux()
		if err := mount(mux, Config{Log: testLog(t)}); err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		return srv
	}
	chat, ops := serve(MountChat), serve(MountOps)
	for _, c := range []struct {
		srv    *httptest.Server
		path   string
		status int
	}{
		{chat, "/", 200}, {chat, "/web/chat.js", 200}, {chat, "/web/config", 200}, {chat, "/ops", 404}, {chat, "/ops/state", 404},
		{ops, "/ops", 200}, {ops, "/ops/state", 503}, {ops, "/web/ops.js", 200}, {ops, "/web/config", 200}, {ops, "/", 404},
	} {
		if status, _, _ := get(t, c.srv.URL+c.path); status != c.status {
			t.Errorf("%s: %d, want %d", c.path, status, c.status)
		}
	}
}

// A dev token carries the issuer and audience the gateway checks.
func TestDevTokenIssuerAudience(t *testing.T) {
	srv := server(t, Config{Dev: true, Secret: []byte("test-secret"), Issuer: "iss-1", Audience: "aud-1"})
	resp, err := http.PostForm(srv.URL+"/dev/token", url.Values{"user": {"alice"}})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ Token string }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(out.Token, ".")
	if len(parts) != 3 {
		t.Fatalf("token %q", out.Token)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct {
		Iss string `json:"iss"`
		Aud any    `json:"aud"`
		Sub string `json:"sub"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	if claims.Iss != "iss-1" || fmt.Sprint(claims.Aud) != "aud-1" && fmt.Sprint(claims.Aud) != "[aud-1]" || claims.Sub != "alice" {
		t.Fatalf("claims %+v", claims)
	}
}
