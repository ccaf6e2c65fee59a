package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"time"
)

// What Dial takes: the source of the connection's tokens and the options,
// with their defaults.

// TokenSource returns the bearer token to present at the next dial. It is
// called before every (re)connect, so it may refresh an expiring token.
type TokenSource func(ctx context.Context) (string, error)

// StaticToken is a TokenSource that always returns tok.
func StaticToken(tok string) TokenSource {
	return func(context.Context) (string, error) { return tok, nil }
}

// Options tune a Client. The zero value is usable.
type Options struct {
	// Batch asks for the chatpipe.v1.batch subprotocol: the server may send
	// several frames in one websocket message.
	Batch bool
	// OnEvent, when set, is called with every event new to the client's
	// view (a duplicate by conversation and seq is not passed again), one
	// call at a time from a goroutine of the client, in the order the
	// events arrived. When nil, events go to the Events channel instead.
	OnEvent func(Event)
	// OnRead, when set, is called when the user's read marker of a
	// conversation moves forward (by this device's MarkRead, a marker
	// another device recorded, or a sync), with the new marker, from the
	// same goroutine as OnEvent and in order with it.
	OnRead func(conv string, seq int64)
	// OnFrame, when set, is called with every server frame received,
	// before the client handles it, from the connection's reader; it must
	// not keep b. Meant for logging and tests.
	OnFrame func(b []byte)
	// Cursors are the cursors of a previous complete sync (for example
	// kept on disk by the app); the first sync starts from them.
	Cursors map[string]int64
	// RequestTimeout is how long a command waits for its answer before it
	// is sent again with the same ids (default 20 s, above the gateway's
	// 15 s call timeout).
	RequestTimeout time.Duration
	// BaseBackoff and MaxBackoff bound the reconnect wait: before attempt n
	// the client waits random(0, min(MaxBackoff, BaseBackoff × 2^n))
	// (defaults 250 ms and 30 s).
	BaseBackoff, MaxBackoff time.Duration
	// StableAfter is how long a connection must live for the backoff to
	// start again from attempt 0 (default 1 min).
	StableAfter time.Duration
	// DialTimeout bounds one websocket dial (default 10 s).
	DialTimeout time.Duration
	// ReadLimit is the largest websocket message accepted (default 4 MiB;
	// batched messages and history pages can be large).
	ReadLimit int64
	// HTTPClient dials the websocket (default http.DefaultClient).
	HTTPClient *http.Client
	// Logger receives connection changes at debug and info level (default:
	// discarded).
	Logger *slog.Logger
	// NewID returns a fresh client_message_id (default: 16 random bytes,
	// hex). It must return ids of [A-Za-z0-9._:-] of at most 128 bytes.
	NewID func() string
	// RefreshBefore is how long before the connection's token expires the
	// client replaces it with a fresh one from the TokenSource (the
	// refresh op): at RefreshBefore before its exp, or halfway through
	// its life when that is later (default 1 min; negative: never, and an
	// expired token makes the client dial again instead).
	RefreshBefore time.Duration
}

func (o *Options) fill() {
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 20 * time.Second
	}
	if o.BaseBackoff <= 0 {
		o.BaseBackoff = 250 * time.Millisecond
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 30 * time.Second
	}
	if o.StableAfter <= 0 {
		o.StableAfter = time.Minute
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.ReadLimit <= 0 {
		o.ReadLimit = 4 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.NewID == nil {
		o.NewID = randomID
	}
	if o.RefreshBefore == 0 {
		o.RefreshBefore = time.Minute
	}
}

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "m-" + hex.EncodeToString(b[:])
}
