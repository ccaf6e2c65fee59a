package web

import (
	"embed"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/chatpipe/chatpipe/internal/auth"
)

//go:embed static
var staticFS embed.FS

// DefaultTokenTTL is the validity of a token minted by POST /dev/token.
const DefaultTokenTTL = 12 * time.Hour

// Config is what the pages need.
type Config struct {
	// Dev turns on the dev-only endpoints (POST /dev/token). Never set it
	// on a deployment: anyone could act as any user.
	Dev bool
	// Secret is the JWT secret tokens are minted with (Dev only).
	Secret []byte
	// TokenTTL is the validity of minted tokens (default DefaultTokenTTL).
	TokenTTL time.Duration
	// Issuer and Audience, when set, are the iss and aud of minted tokens
	// (a gateway that checks them: --jwt-issuer, --jwt-audience).
	Issuer, Audience string
	// Ops is the source of /ops/state; nil serves the pages without it
	// (/ops/state answers 503).
	Ops *Ops
	Log *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (c *Config) validate() error {
	if c.Dev && len(c.Secret) == 0 {
		return errors.New("web: dev mode needs the JWT secret")
	}
	if c.TokenTTL <= 0 {
		c.TokenTTL = DefaultTokenTTL
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Mount adds both pages and their endpoints to mux (MountChat and
// MountOps):
//
//	GET  /            the chat page
//	GET  /ops         the pipeline page
//	GET  /ops/state   the pipeline's state (JSON, see State)
//	GET  /web/…       the pages' scripts and styles
//	GET  /web/config  {"dev":bool}: what the chat page may offer
//	POST /dev/token   user=U → {"token":…,"user":U,"expires_at":…} (dev only; 404 otherwise)
//
// Other paths stay with whatever mux already routes them to.
func Mount(mux *http.ServeMux, cfg Config) error { return mount(mux, cfg, true, true) }

// MountChat adds the chat page (/, /web/…, /web/config and, in dev,
// /dev/token) to mux: what a public gateway address serves.
func MountChat(mux *http.ServeMux, cfg Config) error { return mount(mux, cfg, true, false) }

// MountOps adds the pipeline page (/ops, /ops/state, /web/… and
// /web/config) to mux: it shows the deployment's workers and their
// addresses, so it belongs on an admin address.
func MountOps(mux *http.ServeMux, cfg Config) error { return mount(mux, cfg, false, true) }

func mount(mux *http.ServeMux, cfg Config, chat, ops bool) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		return err
	}
	page := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			noStore(w)
			http.ServeFileFS(w, r, sub, name)
		}
	}
	if chat {
		mux.HandleFunc("GET /{$}", page("index.html"))
		if cfg.Dev { // only chatpipe dev mints tokens; elsewhere the route does not exist
			mux.HandleFunc("POST /dev/token", cfg.devToken)
		}
	}
	if ops {
		mux.HandleFunc("GET /ops", page("ops.html"))
		mux.HandleFunc("GET /ops/state", func(w http.ResponseWriter, r *http.Request) {
			if cfg.Ops == nil {
				http.Error(w, "no pipeline state on this server", http.StatusServiceUnavailable)
				return
			}
			writeJSON(w, http.StatusOK, cfg.Ops.State(r.Context()))
		})
	}
	assets := http.StripPrefix("/web/", http.FileServerFS(sub))
	mux.Handle("GET /web/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, ".html") || strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r) // the pages have their own paths; no listings
			return
		}
		noStore(w)
		assets.ServeHTTP(w, r)
	}))
	mux.HandleFunc("GET /web/config", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]bool{"dev": cfg.Dev})
	})
	return nil
}

// devToken mints a token for the form value (or JSON field) "user".
func (c *Config) devToken(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	user := ""
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		var req struct {
			User string `json:"user"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "bad JSON: " + err.Error()})
			return
		}
		user = req.User
	} else {
		user = r.FormValue("user")
	}
	now := c.Now()
	tok, err := auth.MintFor(c.Secret, user, c.TokenTTL, now, c.Issuer, c.Audience)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	c.Log.Debug("minted a dev token", "user", user)
	writeJSON(w, http.StatusOK, map[string]any{"token": tok, "user": user, "expires_at": now.Add(c.TokenTTL).UTC()})
}

func noStore(w http.ResponseWriter) {
	// The pages change with the binary; a stale cached script against a new
	// server is not worth the saved bytes.
	w.Header().Set("Cache-Control", "no-store")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	noStore(w)
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	_ = enc.Encode(v)
}
