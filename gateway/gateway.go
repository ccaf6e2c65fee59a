// Package gateway serves the public websocket protocol (docs/protocol.md).
// It authenticates the upgrade, validates every frame, and routes each write
// command to the worker that owns the conversation's vshard — watching the
// owner rows in etcd — over one persistent, pipelined connection per worker.
// While ownership moves it retries internally for a bounded time, then
// answers `unavailable`.
package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chatpipe/chatpipe/internal/auth"
	"github.com/chatpipe/chatpipe/internal/delivery"
	"github.com/chatpipe/chatpipe/internal/link"
	"github.com/chatpipe/chatpipe/internal/ownership"
	"github.com/chatpipe/chatpipe/logrecord"
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

// opMetrics are one op's series of the commands counter (accepted) and
// of the latency histogram.
type opMetrics struct {
	accepted prometheus.Counter
	latency  prometheus.Observer
}

// ops are the op label's values (opLabel).
var ops = []string{protocol.OpCreate, protocol.OpJoin, protocol.OpKick, protocol.OpLeave, protocol.OpSend,
	protocol.OpSync, protocol.OpHistory, protocol.OpConversations, protocol.OpRead, protocol.OpRefresh, "invalid"}

// Results of chatpipe_gateway_commands_total.
const (
	resultAccepted    = "accepted"
	resultRejected    = "rejected"
	resultUnavailable = "unavailable"
)

// opLabel is the op label of a frame: its op when the frame decoded to a
// known one, else "invalid" (a client cannot add label values).
func (g *Gateway) opLabel(req *protocol.Request) string {
	if req != nil {
		if _, ok := g.byOp[req.Op]; ok {
			return req.Op
		}
	}
	return "invalid"
}

// count counts a frame's answer in chatpipe_gateway_commands_total; code
// is the rejection code ("" when accepted).
func (g *Gateway) count(op string, code protocol.Code) {
	if code == "" {
		g.byOp[op].accepted.Inc()
		return
	}
	result := resultRejected
	if code == protocol.CodeUnavailable {
		result = resultUnavailable
	}
	g.commands.WithLabelValues(op, result, string(code)).Inc()
}

// observe records the time since start, when a frame of op was read, in
// chatpipe_gateway_command_seconds.
func (g *Gateway) observe(op string, start time.Time) {
	g.byOp[op].latency.Observe(time.Since(start).Seconds())
}

// replyCode is a reply's rejection code, "" when it was accepted.
func replyCode(rep *protocol.Reply) protocol.Code {
	if rep.Op == protocol.OpAccepted {
		return ""
	}
	return rep.Code
}

// Unowned returns how many vshards have no live owner in the gateway's
// view: commands for them wait, then answer unavailable.
func (g *Gateway) Unowned() int {
	n := 0
	for s := 0; s < g.cfg.VShards+g.cfg.Dedicated; s++ {
		if _, _, ok := g.cfg.Owners.Route(s); !ok {
			n++
		}
	}
	return n
}

// Stats returns the counters.
func (g *Gateway) Stats() *Stats { return &g.stats }

// Collectors returns the gateway's Prometheus metrics.
func (g *Gateway) Collectors() []prometheus.Collector {
	counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "chatpipe_gateway_connections", Help: "Open websocket connections."},
			func() float64 { return float64(g.stats.Connections.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "chatpipe_gateway_unowned_vshards", Help: "Vshards without a live owner in this gateway's view of etcd."},
			func() float64 { return float64(g.Unowned()) }),
		counter("chatpipe_gateway_unauthorized_total", "Upgrades refused with 401.", &g.stats.Unauthorized),
		counter("chatpipe_gateway_slow_readers_closed_total", "Connections closed with 1008 because their send buffer stayed full.", &g.slowClosed),
		counter("chatpipe_gateway_backlogs_total", "Times pushes found a connection's send buffer full and the session read them back from the read model instead.", &g.backlogged),
		counter("chatpipe_gateway_read_your_writes_timeouts_total", "Reads answered unavailable because the read model did not include the session's own write in time.", &g.rywTimeouts),
		counter("chatpipe_gateway_ws_messages_total", "Websocket messages written to devices, each one flush (a batching connection's message carries several frames).", &g.wsMessages),
		counter("chatpipe_gateway_ws_frames_total", "Frames written to devices in those messages: answers, events, read markers.", &g.wsFrames),
		g.commands,
		g.latency,
	}
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

func bearer(r *http.Request) string {
	if h := r.Header.Get("Authorization"); strings.HasPrefix(h, "Bearer ") {
		return strings.TrimPrefix(h, "Bearer ")
	}
	return r.URL.Query().Get("token")
}

func (g *Gateway) serveWS(w http.ResponseWriter, r *http.Request) {
	claims, err := g.cfg.Tokens.Verify(r.Context(), bearer(r))
	user := claims.Subject
	if err != nil {
		g.stats.Unauthorized.Add(1)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	st, ok := g.users.connect(user, time.Now())
	if !ok {
		http.Error(w, "too many connections for this user", http.StatusTooManyRequests)
		return
	}
	defer g.users.disconnect(st, time.Now())
	g.cmu.Lock()
	if g.closing {
		g.cmu.Unlock()
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	g.connWG.Add(1)
	g.cmu.Unlock()
	defer g.connWG.Done()

	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{OriginPatterns: g.cfg.OriginPatterns,
		Subprotocols: []string{protocol.SubprotocolBatch}})
	if err != nil {
		return
	}
	c.SetReadLimit(int64(g.cfg.Limits.MaxFrameBytes))
	g.cmu.Lock()
	if g.closing {
		// Shutdown began while this connection was being upgraded: it
		// closed the connections it found, and this one was not yet
		// among them.
		g.cmu.Unlock()
		c.Close(websocket.StatusServiceRestart, "server restarting")
		return
	}
	g.conns[c] = struct{}{}
	g.cmu.Unlock()
	g.stats.Connections.Add(1)
	defer func() {
		g.cmu.Lock()
		delete(g.conns, c)
		g.cmu.Unlock()
		g.stats.Connections.Add(-1)
		c.CloseNow()
	}()
	sess := newSession(g, c, user)
	sess.exp, sess.limits = g.deadline(claims), st
	g.users.attach(st, sess)
	defer g.users.detach(st, sess)
	sess.run(r.Context())
}

// session is one websocket connection of an authenticated user.
type session struct {
	g      *Gateway
	c      *websocket.Conn
	user   string
	exp    time.Time  // the token's expiry and leeway: later commands get unauthorized (refresh moves it)
	limits *userState // the user's rate limiter, shared by their connections
	// out is the send buffer: every frame to the device, written in the
	// order queued (replies, pushes, and a backlog's read-back: backlog.go).
	out chan []byte
	// pushRoom is how full pushes may fill the send buffer: the rest is
	// kept for replies (up to MaxInFlight of them, at most half the buffer).
	pushRoom int
	sem      chan struct{}
	// batch: the client asked for protocol.SubprotocolBatch, so the writer
	// sends everything queued when it wakes as one message of
	// newline-separated frames.
	batch bool
	wbuf  []byte // the writer's reused batch buffer

	pending pendingWrites // accepted writes the read model may lack (ryw.go)
	backlog backlog       // pushes the send buffer had no room for (backlog.go)

	closing atomic.Bool
}

func newSession(g *Gateway, c *websocket.Conn, user string) *session {
	return &session{g: g, c: c, user: user, out: make(chan []byte, g.cfg.SendBuffer), sem: make(chan struct{}, g.cfg.MaxInFlight),
		pushRoom: g.cfg.SendBuffer - min(g.cfg.MaxInFlight, g.cfg.SendBuffer/2), batch: c.Subprotocol() == protocol.SubprotocolBatch,
		backlog: newBacklog()}
}

// writeTimeout bounds the writes of one wake-up of a connection's writer:
// a peer that takes longer to read them is closed.
const writeTimeout = 10 * time.Second

// maxBatchBytes bounds one message of a batching connection (frames past
// it go in the next message).
const maxBatchBytes = 64 << 10

// writeBatch writes first and every frame queued behind it as messages of
// newline-separated frames, each at most maxBatchBytes unless one frame
// alone is larger: one write (and one flush) for many events.
// It returns how many frames and messages it wrote (a queued item may
// already hold several newline-joined frames; a frame holds no raw newline).
func (s *session) writeBatch(first []byte) (frames, msgs int64, err error) {
	buf := append(s.wbuf[:0], first...)
	flush := func() error {
		if err := s.c.Write(noDeadline, websocket.MessageText, buf); err != nil {
			return err
		}
		frames, msgs = frames+int64(bytes.Count(buf, newline))+1, msgs+1
		return nil
	}
	for n := len(s.out); n > 0; n-- {
		b := <-s.out
		s.took()
		if len(buf)+1+len(b) > maxBatchBytes {
			if err := flush(); err != nil {
				return frames, msgs, err
			}
			buf = buf[:0]
		} else {
			buf = append(buf, '\n')
		}
		buf = append(buf, b...)
	}
	s.wbuf = buf
	err = flush()
	return frames, msgs, err
}

var newline = []byte{'\n'}

// noDeadline is the context of a session's reads and writes. The websocket
// library registers a callback on a cancellable context for every frame
// read or written (a lock, an allocation, a removal); instead, the
// session's end and a stalled write's deadline close the connection, which
// ends whatever read or write is in flight.
var noDeadline = context.Background()

func (s *session) run(parent context.Context) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The session's end ends the connection: a read or write in flight
	// returns (they run on noDeadline).
	context.AfterFunc(ctx, func() { s.c.CloseNow() })
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // writer
		defer wg.Done()
		// One deadline for what is queued at each wake-up (at most a
		// buffer's worth): a timer re-armed per wake-up, not one per
		// write. When it fires the connection is done for: it is closed.
		var timedOut atomic.Bool
		deadline := time.AfterFunc(time.Hour, func() { timedOut.Store(true); s.c.CloseNow() })
		deadline.Stop()
		defer deadline.Stop()
		for {
			var b []byte
			select {
			case b = <-s.out:
				s.took()
			case <-ctx.Done():
				return
			}
			deadline.Reset(writeTimeout)
			var err error
			var frames, msgs int64
			if s.batch {
				frames, msgs, err = s.writeBatch(b)
			} else { // b and what is queued behind it, one message each
				for n := len(s.out); ; n-- {
					if err = s.c.Write(noDeadline, websocket.MessageText, b); err != nil {
						break
					}
					frames++
					if n == 0 {
						break
					}
					b = <-s.out
					s.took()
				}
				msgs = frames
			}
			deadline.Stop()
			s.g.wsMessages.Add(msgs)
			s.g.wsFrames.Add(frames)
			if err != nil {
				if timedOut.Load() && !s.closing.Swap(true) {
					// The deadline fired: the peer stopped reading (the
					// close frame could not be written either). Whether
					// the reader saw the connection end first and ended
					// the session does not matter.
					s.countSlow()
				}
				cancel()
				return
			}
		}
	}()
	wg.Add(1)
	go func() { // reads back the pushes the send buffer had no room for
		defer wg.Done()
		s.catchUp(ctx)
	}()
	wg.Add(1)
	go func() { // liveness: a peer that stops answering pings is closed
		defer wg.Done()
		t := time.NewTicker(s.g.cfg.PingInterval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				pctx, pcancel := context.WithTimeout(ctx, s.g.cfg.PingInterval)
				err := s.c.Ping(pctx)
				pcancel()
				if err != nil {
					s.c.Close(websocket.StatusPolicyViolation, "ping timeout")
					cancel()
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	defer wg.Wait()
	defer cancel()
	for {
		typ, frame, err := s.c.Read(noDeadline)
		if err != nil {
			return
		}
		start := time.Now()
		var (
			req  *protocol.Request
			id   string
			perr *protocol.Error
		)
		if typ != websocket.MessageText {
			perr = protocol.Errorf(protocol.CodeBadRequest, "frames must be text")
		} else if req, id, perr = protocol.Decode(frame, s.g.cfg.Limits); perr == nil && req.Op == protocol.OpRefresh {
			// Handled here, before the next frame is read: the commands
			// that follow a refresh run on the token it installed.
			s.refresh(ctx, req, start)
			continue
		} else if perr == nil {
			perr = s.admit(start)
		}
		if perr != nil {
			s.g.stats.Rejected.Add(1)
			op := s.g.opLabel(req)
			s.g.count(op, perr.Code)
			s.send(protocol.Rejected(id, perr))
			s.g.observe(op, start)
			continue
		}
		select {
		case s.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-s.sem }()
			op := s.g.opLabel(req)
			var (
				code     protocol.Code
				answered bool
			)
			switch req.Op {
			case protocol.OpSync:
				code, answered = s.sync(ctx, req)
			case protocol.OpHistory:
				code, answered = s.history(ctx, req)
			case protocol.OpConversations:
				code, answered = s.conversations(ctx, req)
			default:
				rep := s.g.handle(ctx, s.user, req) // counts it
				if req.Op != protocol.OpRead {      // a marker names a seq already in the read model
					s.wrote(ctx, rep) // before the client can see it: its next read waits for it
				}
				s.send(rep)
				s.g.observe(op, start)
				return
			}
			if answered { // not when the connection went away first
				s.g.count(op, code)
				s.g.observe(op, start)
			}
		}()
	}
}

// deadline is when a connection authenticated by claims stops taking
// commands: the token's exp plus the leeway its verification allowed.
func (g *Gateway) deadline(claims auth.Claims) time.Time {
	return claims.ExpiresAt.Add(g.cfg.Tokens.Leeway())
}

// refresh answers a refresh: a valid token of the connection's user
// replaces the connection's token (its expiry); any other answer changes
// nothing. It costs a command of the user's rate limit, and works on a
// connection whose token has already expired (the new token proves the
// user as an upgrade would).
func (s *session) refresh(ctx context.Context, req *protocol.Request, start time.Time) {
	var (
		perr   *protocol.Error
		claims auth.Claims
		err    error
	)
	if wait, ok := s.limits.allow(start); !ok {
		perr = protocol.Errorf(protocol.CodeRateLimited, "more than %g commands/s from %s", s.g.cfg.UserRate, s.user)
		perr.RetryAfterMS = max(wait.Milliseconds(), 1)
	} else if claims, err = s.g.cfg.Tokens.Verify(ctx, req.Token); err != nil {
		perr = protocol.Errorf(protocol.CodeUnauthorized, "the new token is not valid; the connection keeps its token")
	} else if claims.Subject != s.user {
		perr = protocol.Errorf(protocol.CodeForbidden, "the new token is for another user; the connection keeps its token")
	}
	if perr != nil {
		s.g.stats.Rejected.Add(1)
		s.g.count(protocol.OpRefresh, perr.Code)
		s.send(protocol.Rejected(req.ID, perr))
		s.g.observe(protocol.OpRefresh, start)
		return
	}
	s.exp = s.g.deadline(claims)
	s.g.stats.Accepted.Add(1)
	s.g.count(protocol.OpRefresh, "")
	s.send(&protocol.Reply{Op: protocol.OpAccepted, ID: req.ID, ExpiresAt: protocol.FormatTime(claims.ExpiresAt)})
	s.g.observe(protocol.OpRefresh, start)
}

// admit checks the token is still valid and takes a token from the user's
// bucket: over the limit, the command is answered rate_limited before it
// reaches any writer.
func (s *session) admit(now time.Time) *protocol.Error {
	if now.After(s.exp) {
		return protocol.Errorf(protocol.CodeUnauthorized, "the token expired; refresh it or reconnect with a new one")
	}
	if wait, ok := s.limits.allow(now); !ok {
		e := protocol.Errorf(protocol.CodeRateLimited, "more than %g commands/s from %s", s.g.cfg.UserRate, s.user)
		e.RetryAfterMS = max(wait.Milliseconds(), 1)
		return e
	}
	return nil
}

// send queues a frame; a connection whose buffer is full is a slow reader:
// it is closed with 1008 and catches up with sync.
func (s *session) send(r any) {
	if rep, ok := r.(*protocol.Reply); ok { // every command's answer: encoded by hand
		s.sendRaw(protocol.AppendReply(make([]byte, 0, 192), rep))
		return
	}
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	s.sendRaw(b)
}

// sendRaw queues an encoded frame without blocking (see send).
func (s *session) sendRaw(b []byte) {
	select {
	case s.out <- b:
	default:
		s.closeOnce(websocket.StatusPolicyViolation, "send buffer overflow; reconnect and sync")
	}
}

// closeOnce closes the connection (in the background: the close handshake
// waits for the peer) the first time it is called.
func (s *session) closeOnce(code websocket.StatusCode, reason string) {
	if s.closing.Swap(true) {
		return
	}
	if code == websocket.StatusPolicyViolation {
		s.countSlow()
	}
	go s.c.Close(code, reason)
}

// countSlow counts and logs a connection closed for not reading.
func (s *session) countSlow() {
	s.g.slowClosed.Add(1)
	s.g.cfg.Log.Warn("closing a slow websocket reader", "user", s.user)
}

func (g *Gateway) handle(ctx context.Context, user string, req *protocol.Request) *protocol.Reply {
	var rep *protocol.Reply
	switch req.Op {
	case protocol.OpCreate, protocol.OpJoin:
		if e := g.checkConvCap(ctx, user, req); e != nil {
			rep = protocol.Rejected(req.ID, e)
			break
		}
		rep = g.route(ctx, user, req)
	case protocol.OpKick, protocol.OpLeave, protocol.OpSend, protocol.OpRead:
		rep = g.route(ctx, user, req)
	default:
		rep = protocol.Rejected(req.ID, protocol.Errorf(protocol.CodeBadRequest, "op %s is not available in this version", req.Op))
	}
	switch {
	case rep.Op == protocol.OpAccepted:
		g.stats.Accepted.Add(1)
	case rep.Code == protocol.CodeUnavailable:
		g.stats.Unavailable.Add(1)
	default:
		g.stats.Rejected.Add(1)
	}
	g.count(g.opLabel(req), replyCode(rep))
	return rep
}

// vshardOf is where a conversation's commands go: its override, else its
// hashed vshard.
func (g *Gateway) vshardOf(cid string) int {
	if v, ok := g.cfg.Owners.Override(cid); ok {
		return v
	}
	return logrecord.VShard(cid, g.cfg.VShards)
}

// retrySafe reports whether a command whose outcome is unknown may be sent
// again: one carrying a client_message_id (every send; create, join, kick
// and leave when the client gave one) is deduplicated by it, so a second
// attempt returns the first one's result. A membership command without a
// key is not: a join that took effect may have been undone since (the user
// kicked), and sending it again would add them back — one command, two
// effects. Those are sent again only when nothing was written (the worker
// said retry, or the request never left), and otherwise answered
// unavailable for the client to decide (docs/protocol.md).
// A read marker is safe without a key: recording it twice is recording it
// once.
func retrySafe(req *protocol.Request) bool {
	return req.ClientMessageID != "" || req.Op == protocol.OpRead
}

// route sends a write command to the owner of its vshard, retrying while
// ownership moves, for at most RouteTimeout since the last move it saw.
func (g *Gateway) route(ctx context.Context, user string, req *protocol.Request) *protocol.Reply {
	deadline := time.Now().Add(g.cfg.RouteTimeout)
	backoff := 10 * time.Millisecond
	why := "has no live owner" // what the last try ran into
	for {
		changed := g.cfg.Owners.Changed()
		// Looked up at each try: an override that changed since (the
		// conversation is moving) takes effect at once.
		v := g.vshardOf(req.ConversationID)
		sleep := backoff
		if row, w, ok := g.cfg.Owners.Route(v); ok {
			rep, moved, reason, after := g.attempt(ctx, w.Addr, v, row.Epoch, user, req)
			if rep != nil {
				return rep
			}
			why = reason
			if after > 0 && after < sleep {
				// The worker said when to try again (a conversation
				// moving between vshards: soon).
				sleep = after
			}
			if moved {
				deadline = time.Now().Add(g.cfg.RouteTimeout)
				continue
			}
		} else {
			why = "has no live owner"
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return unavailable(req.ID, "vshard "+strconv.Itoa(v)+" "+why+"; retry with the same ids", 1000)
		}
		select {
		case <-ctx.Done():
		case <-changed:
		case <-time.After(sleep):
		}
		backoff = min(backoff*2, 250*time.Millisecond)
	}
}

// attempt sends req once to the worker at addr, owner of v at epoch. It
// returns the reply to give the client, or nil to try again (moved: the
// shard moved while the call was waiting; why: what went wrong, for the
// client's answer if the retries run out; after: when the worker said to
// try again, if it did).
func (g *Gateway) attempt(ctx context.Context, addr string, v int, epoch int64, user string, req *protocol.Request) (rep *protocol.Reply, moved bool, why string, after time.Duration) {
	cl, err := g.client(ctx, addr)
	if err != nil {
		return nil, false, "cannot reach its owner", 0
	}
	cctx, cancel := context.WithTimeout(ctx, g.cfg.CallTimeout)
	defer cancel()
	safe := retrySafe(req)
	var mc *moveCall
	if safe {
		// A frozen owner never answers: when the shard moves, ask the new
		// owner instead (dedupe makes that safe).
		mc = &moveCall{v: v, epoch: epoch, cancel: cancel}
		g.moves.add(mc)
	}
	resp, err := cl.Do(cctx, user, req)
	if mc != nil {
		g.moves.remove(mc)
		moved = mc.moved.Load()
	}
	switch {
	case errors.Is(err, link.ErrNotSent):
		return nil, moved, "could not be asked (the request was not sent)", 0 // nothing was written
	case err != nil && !safe:
		return unavailable(req.ID, "the outcome of this command is unknown; look at the conversation before sending it again", 200), false, "", 0
	case err != nil:
		return nil, moved, "did not answer in time (the outcome is unknown)", 0
	case resp.Retry, safe && resp.Reply.Code == protocol.CodeUnavailable:
		return nil, moved, "answered: " + resp.Reply.Message, time.Duration(resp.Reply.RetryAfterMS) * time.Millisecond
	}
	return resp.Reply, false, "", 0
}

func unavailable(id, msg string, after int64) *protocol.Reply {
	e := protocol.Errorf(protocol.CodeUnavailable, "%s", msg)
	e.RetryAfterMS = after
	return protocol.Rejected(id, e)
}

func (g *Gateway) client(ctx context.Context, addr string) (Link, error) {
	g.pmu.Lock()
	cl := g.pool[addr]
	g.pmu.Unlock()
	if cl != nil {
		select {
		case <-cl.Done():
		default:
			return cl, nil
		}
	}
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ncl, err := g.cfg.Dial(dctx, addr, g.cfg.Wire)
	if err != nil {
		return nil, err
	}
	g.pmu.Lock()
	defer g.pmu.Unlock()
	if cur := g.pool[addr]; cur != nil && cur != cl {
		select {
		case <-cur.Done():
		default:
			ncl.Close()
			return cur, nil
		}
	}
	g.pool[addr] = ncl
	return ncl, nil
}
