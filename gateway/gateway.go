// Package gateway serves the public websocket protocol (docs/protocol.md).
// It authenticates the upgrade, validates every frame, and routes each write
// command to the worker that owns the conversation's vshard — watching the
// owner rows in etcd — over one persistent, pipelined connection per worker.
// While ownership moves it retries internally for a bounded time, then
// answers `unavailable`.
package gateway

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chatpipe/chatpipe/internal/delivery"
	"github.com/chatpipe/chatpipe/internal/link"
	"github.com/chatpipe/chatpipe/internal/ownership"
	"github.com/chatpipe/chatpipe/protocol"
)

// Owners is the gateway's view of who owns each vshard: *lease.Watcher,
// which keeps it current from etcd, or lease.Static.
type Owners interface {
	// Route returns vshard v's live owner row and the worker's address;
	// false when no live worker owns it.
	Route(v int) (ownership.Row, ownership.WorkerInfo, bool)
	// Changed returns a channel closed at the next change of the view.
	Changed() <-chan struct{}
	// Override returns the vshard a conversation is routed to instead of
	// its hashed one (an operator isolated it), if any.
	Override(conversationID string) (int, bool)
}

// Link is a pipelined connection to one worker (*link.Client).
type Link interface {
	// Do sends a command and waits for its answer. An error wrapping
	// link.ErrNotSent means the command was not sent; any other error
	// means its outcome is unknown. The context's deadline travels with
	// the command as its budget.
	Do(ctx context.Context, user string, req *protocol.Request) (*link.Response, error)
	// Done is closed when the link is gone: the pool then dials a new one.
	Done() <-chan struct{}
	// Close closes the link; pending calls end as unknown outcomes.
	Close()
}

// DialFunc opens a link to the worker at addr.
type DialFunc func(ctx context.Context, addr string, cfg link.Config) (Link, error)

// dialWire is the default DialFunc: link.Dial.
func dialWire(ctx context.Context, addr string, cfg link.Config) (Link, error) {
	cl, err := link.Dial(ctx, addr, cfg)
	if err != nil {
		return nil, err
	}
	return cl, nil
}

// ReadModel answers the reads a session makes and the checks before a
// write (*delivery.Store, over Postgres).
type ReadModel interface {
	// Sync returns the events of all the user's conversations after the
	// cursors, at most limit of them.
	Sync(ctx context.Context, user string, cursors map[string]int64, limit int) (*delivery.SyncResult, error)
	// Since is Sync for the conversations in cursors only (reading back
	// what a full send buffer did not take).
	Since(ctx context.Context, user string, cursors map[string]int64, limit int) (*delivery.SyncResult, error)
	// History returns up to limit events of conv before beforeSeq (0: the
	// newest), in ascending seq, within the user's membership periods;
	// delivery.ErrForbidden if the user never was a member.
	History(ctx context.Context, user, conv string, beforeSeq int64, limit int) ([]*protocol.Event, error)
	// Conversations returns the conversations user is a member of now,
	// most recently active first, at most limit.
	Conversations(ctx context.Context, user string, limit int) ([]*protocol.ConversationInfo, error)
	// OpenMemberships counts, for each of users, the conversations other
	// than except they are a member of now.
	OpenMemberships(ctx context.Context, users []string, except string) (map[string]int, error)
	// Covered returns, for each of convs the read model knows, the seq up
	// to which history, sync and conversations include its events.
	Covered(ctx context.Context, convs []string) (map[string]int64, error)
}

// Stats are the gateway's counters.
type Stats struct {
	Unauthorized atomic.Int64 // upgrades refused with 401
	Connections  atomic.Int64
	Accepted     atomic.Int64
	Rejected     atomic.Int64
	Unavailable  atomic.Int64
}

// Gateway is the websocket front door.
type Gateway struct {
	cfg      Config
	stats    Stats
	users    *users
	commands *prometheus.CounterVec   // chatpipe_gateway_commands_total{op,result,code}
	byOp     map[string]opMetrics     // each op's accepted counter and latency, looked up once in New
	latency  *prometheus.HistogramVec // chatpipe_gateway_command_seconds{op}

	slowClosed  atomic.Int64 // connections closed with 1008 for a full send buffer
	backlogged  atomic.Int64 // pushes that found a send buffer full and were read back later
	rywTimeouts atomic.Int64 // reads answered unavailable: the read model lacked the session's write
	wsMessages  atomic.Int64 // websocket messages written, each one flush
	wsFrames    atomic.Int64 // frames written in them: answers, events, read markers

	pmu  sync.Mutex
	pool map[string]Link

	cmu      sync.Mutex
	conns    map[*websocket.Conn]struct{}
	closing  bool
	connWG   sync.WaitGroup
	shutdown chan struct{}

	moves *moveWatch // cancels calls whose vshard moved while they waited
}

// New returns a gateway.
func New(cfg Config) (*Gateway, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	g := &Gateway{cfg: cfg, users: newUsers(cfg.UserRate, cfg.UserBurst, cfg.MaxConnsPerUser),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "chatpipe_gateway_commands_total",
			Help: "Frames answered, by op (invalid: the frame could not be decoded), result (accepted, rejected, unavailable) and rejection code (empty when accepted)."},
			[]string{"op", "result", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "chatpipe_gateway_command_seconds",
			Help:    "Time from reading a frame to queueing its answer for the connection's writer, by op.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}},
			[]string{"op"}),
		pool: map[string]Link{}, conns: map[*websocket.Conn]struct{}{}, shutdown: make(chan struct{}),
		moves: newMoveWatch(cfg.Owners)}
	// Every op's series exist from the start, at 0, so that rates and
	// quantiles have them before the first command; the per-frame path
	// uses them without a label lookup.
	g.byOp = make(map[string]opMetrics, len(ops))
	for _, op := range ops {
		g.byOp[op] = opMetrics{accepted: g.commands.WithLabelValues(op, resultAccepted, ""), latency: g.latency.WithLabelValues(op)}
	}
	return g, nil
}

// Handler serves /v1/ws, /healthz and /readyz.
func (g *Gateway) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/ws", g.serveWS)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := g.Ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	return mux
}

// Ready reports whether the gateway can route: the ownership view from etcd
// has at least one live worker.
func (g *Gateway) Ready() error {
	for s := 0; s < g.cfg.VShards; s++ {
		if _, _, ok := g.cfg.Owners.Route(s); ok {
			return nil
		}
	}
	return errors.New("no live worker owns a vshard")
}

// Shutdown closes every websocket with 1012 (service restart) so clients
// reconnect, waits for their handlers (bounded by ctx) and closes the
// worker connections. http.Server.Shutdown does not close websockets; call
// this too. Safe to call twice.
func (g *Gateway) Shutdown(ctx context.Context) {
	g.cmu.Lock()
	if !g.closing {
		g.closing = true
		close(g.shutdown)
	}
	for c := range g.conns {
		go c.Close(websocket.StatusServiceRestart, "server restarting")
	}
	g.cmu.Unlock()
	done := make(chan struct{})
	go func() { g.connWG.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	g.pmu.Lock()
	for a, c := range g.pool {
		c.Close()
		delete(g.pool, a)
	}
	g.pmu.Unlock()
}
