package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/chatpipe/chatpipe/internal/auth"
	"github.com/chatpipe/chatpipe/internal/link"
	"github.com/chatpipe/chatpipe/protocol"
)

// The gateway's configuration and its defaults.

// Config configures a Gateway.
type Config struct {
	Owners    Owners
	VShards   int
	Dedicated int // dedicated vshards after the hashed ones (counted by Unowned)
	// Tokens verifies the bearer tokens of upgrades and refreshes; when
	// nil, HS256 tokens are checked against Secret (auth.Verify).
	Tokens       *auth.Verifier
	Secret       []byte
	Limits       protocol.Limits
	RouteTimeout time.Duration // internal retries while ownership moves (default 5 s)
	CallTimeout  time.Duration // one attempt at a worker (default 15 s); the request carries it and the worker drops a command still undecided then
	// SendBuffer is the frames queued per connection (default 1024). A
	// push that finds it full is read back from the read model later (see
	// backlog.go); a frame that waits SlowReader for room closes the
	// connection with 1008 (default 10 s).
	SendBuffer     int
	SlowReader     time.Duration
	MaxInFlight    int      // commands in flight per connection (default 256)
	OriginPatterns []string // allowed browser origins besides the gateway's own host
	// UserRate and UserBurst are the per-user command token bucket on this
	// gateway (default 20/s, bursts of 40; a negative rate turns it off).
	UserRate        float64
	UserBurst       int
	MaxConnsPerUser int           // open websockets per user on this gateway (default 16)
	PingInterval    time.Duration // websocket ping period; a missed pong closes the connection (default 30 s)
	// Reads answers sync and history from the read model; nil answers
	// them unavailable.
	Reads   ReadModel
	SyncMax int // events in one sync reply before it says more (default 500)
	// ReadYourWrites is how long a session's history, sync or
	// conversations waits for the read model to include that session's own
	// accepted writes before answering unavailable (default 2 s; negative:
	// no wait). See ryw.go.
	ReadYourWrites time.Duration
	// MaxConvsPerUser caps the conversations a user may be in: a create or
	// join that would add someone beyond it answers too_large (default
	// 5000; negative: no cap). Counted from the read model, so it is a soft
	// cap: commands racing each other may pass it by a few.
	MaxConvsPerUser int
	// Wire tunes the links to the workers: write deadline, health pings
	// and read timeout (defaults: link.Default*).
	Wire link.Config
	// Dial opens the links to the workers (default: link.Dial).
	Dial DialFunc
	Log  *slog.Logger
}

func (c *Config) validate() error {
	if c.Owners == nil || c.VShards <= 0 || (len(c.Secret) == 0 && c.Tokens == nil) {
		return errors.New("gateway: Owners, VShards and Tokens or Secret are required")
	}
	if c.Tokens == nil {
		v, err := auth.NewVerifier(context.Background(), auth.Options{Secret: c.Secret})
		if err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
		c.Tokens = v
	}
	if c.Limits.MaxFrameBytes == 0 {
		c.Limits = protocol.DefaultLimits()
	}
	if c.RouteTimeout <= 0 {
		c.RouteTimeout = 5 * time.Second
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = 15 * time.Second
	}
	if c.SendBuffer <= 0 {
		c.SendBuffer = 1024
	}
	if c.SlowReader <= 0 {
		c.SlowReader = 10 * time.Second
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 256
	}
	if c.UserRate == 0 {
		c.UserRate = 20
	}
	if c.UserBurst <= 0 {
		c.UserBurst = 40
	}
	if c.MaxConnsPerUser <= 0 {
		c.MaxConnsPerUser = 16
	}
	if c.PingInterval <= 0 {
		c.PingInterval = 30 * time.Second
	}
	if c.ReadYourWrites == 0 {
		c.ReadYourWrites = 2 * time.Second
	}
	if c.SyncMax <= 0 {
		c.SyncMax = 500
	}
	if c.MaxConvsPerUser == 0 {
		c.MaxConvsPerUser = 5000
	}
	if c.Dial == nil {
		c.Dial = dialWire
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return nil
}
