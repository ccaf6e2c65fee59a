package shardworker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/chatpipe/chatpipe/internal/link"
	"github.com/chatpipe/chatpipe/internal/logsink"
	"github.com/chatpipe/chatpipe/internal/pglisten"
	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// Config configures a Worker. Zero fields get the defaults of validate.
type Config struct {
	ID         string // worker id, unique in the deployment
	Listen     string // address of the gateway-facing listener (default 127.0.0.1:0)
	Advertise  string // address advertised in etcd (default: the listener's)
	AdminAddr  string // advertised address of the worker's metrics server, if any
	Etcd       *clientv3.Client
	Prefix     string
	Brokers    []string
	KafkaOpts  []kgo.Opt // appended to every Kafka client's options (TLS, SASL)
	Topic      string
	VShards    int
	Partitions int
	// Dedicated vshards beyond the hashed ones (lease.Config.Dedicated):
	// each writes only the conversations moved to it.
	Dedicated int
	DB        *pgxpool.Pool
	MaxBatch  int           // commands per transaction (default 1000)
	Linger    time.Duration // fixed extra wait for a batch to fill (default 0: adaptive, see LingerMax)
	// LingerMax is the latency budget of the adaptive group commit: a
	// vshard's writer waits up to this long for its batch to fill once its
	// commands arrive faster than its share of TxnBudget (internal/groupcommit).
	// Default 5 ms; negative: never wait (take what queued during the last
	// commit). A fixed Linger turns the adaptive wait off.
	LingerMax time.Duration
	// TxnBudget is the Kafka transactions per second this worker aims to
	// stay under, shared evenly by its vshards (default 2000).
	TxnBudget float64
	QueueLen  int // commands queued per vshard (default 10000)
	// MaxTakeovers is how many of the worker's vshards take over at once
	// (default DefaultMaxTakeovers); the others wait their turn before
	// their first round trip.
	MaxTakeovers int
	MaxConvs     int // conversations cached per vshard (default 20000; more while persist lags)
	// DedupeKeep and DedupeMemory bound a writer's in-memory dedupe: per
	// conversation it keeps at most DedupeKeep results of stored sends, and
	// none older than DedupeMemory (defaults 256 and 30 s). A retry past
	// them is answered from Postgres; results persist has not stored yet are
	// always kept.
	DedupeKeep   int
	DedupeMemory time.Duration
	// RefusalMemory is how long a writer remembers a final rejection of a
	// keyed command, answering other attempts of the key by the same
	// sender with it (default 2 min, far longer than an attempt can stay
	// in flight: the gateway's 15 s call plus what queues ahead of it).
	RefusalMemory time.Duration
	TrimInterval  time.Duration // how often a busy writer trims (default 1 s)
	// NoListen: do not LISTEN for persist's commits; every writer then
	// reads persist's stored offsets from Postgres when it trims (for
	// connection poolers that do not pass LISTEN through). With LISTEN the
	// worker learns them from persist's announcements.
	NoListen      bool
	CommitTimeout time.Duration // per transaction (default 10 s)
	TxnTimeout    time.Duration // Kafka transaction.timeout (default 10 s)
	ReplayTimeout time.Duration // default 60 s
	LeaseTTL      int64         // seconds (default 10)
	Limits        shardcore.Limits
	Protocol      protocol.Limits // request limits re-checked here (default protocol.DefaultLimits)
	ConvRate      float64         // messages/s per conversation (default 100; negative: off)
	ConvBurst     int             // default 200
	// Wire tunes the gateway links: write deadline, read timeout, replies
	// queued per link (defaults: link.Default*).
	Wire link.Config
	Log  *slog.Logger
}

// Defaults of the adaptive group commit (internal/groupcommit).
const (
	DefaultLingerMax = 5 * time.Millisecond // latency budget of a writer's wait for its batch
	DefaultTxnBudget = 2000                 // Kafka transactions/s per worker, shared by its vshards
)

// DefaultMaxTakeovers is Config.MaxTakeovers' default. A takeover is a
// handful of round trips (a producer id, the marker's transaction, the
// stored offset, the tail). Given 1,371 vshards at once, as on a cold start
// of 4,112 over three workers, a worker that started every takeover at the
// same moment timed out its markers and started them over: after 3 minutes
// it accepted on 368. With 32, 64 or 128 at a time the whole stack
// accepted after 27–37 s on this 2-core machine (one kfake broker), with
// no clear difference between them.
const DefaultMaxTakeovers = 64

// Defaults of the in-memory dedupe bounds (Config.DedupeKeep, DedupeMemory).
const (
	DefaultDedupeKeep   = 256
	DefaultDedupeMemory = 30 * time.Second
	// DefaultRefusalMemory is Config.RefusalMemory's default.
	DefaultRefusalMemory = 2 * time.Minute
)

func (c *Config) validate() error {
	if c.ID == "" || c.Etcd == nil || c.DB == nil || len(c.Brokers) == 0 || c.VShards <= 0 || c.Partitions <= 0 {
		return errors.New("shardworker: ID, Etcd, DB, Brokers, VShards and Partitions are required")
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:0"
	}
	if c.Prefix == "" {
		c.Prefix = lease.DefaultPrefix
	}
	if c.Topic == "" {
		c.Topic = logrecord.DefaultTopic
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 1000
	}
	if c.LingerMax == 0 {
		c.LingerMax = DefaultLingerMax
	}
	if c.TxnBudget <= 0 {
		c.TxnBudget = DefaultTxnBudget
	}
	if c.ConvRate == 0 {
		c.ConvRate = 100
	}
	if c.ConvBurst <= 0 {
		c.ConvBurst = 200
	}
	if c.MaxConvs <= 0 {
		c.MaxConvs = 20000
	}
	if c.DedupeKeep <= 0 {
		c.DedupeKeep = DefaultDedupeKeep
	}
	if c.DedupeMemory <= 0 {
		c.DedupeMemory = DefaultDedupeMemory
	}
	if c.RefusalMemory <= 0 {
		c.RefusalMemory = DefaultRefusalMemory
	}
	if c.TrimInterval <= 0 {
		c.TrimInterval = time.Second
	}
	if c.QueueLen <= 0 {
		c.QueueLen = 10000
	}
	if c.MaxTakeovers <= 0 {
		c.MaxTakeovers = DefaultMaxTakeovers
	}
	if c.CommitTimeout <= 0 {
		c.CommitTimeout = 10 * time.Second
	}
	if c.TxnTimeout <= 0 {
		c.TxnTimeout = 10 * time.Second
	}
	if c.ReplayTimeout <= 0 {
		c.ReplayTimeout = 60 * time.Second
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = lease.DefaultTTL
	}
	if c.Protocol.MaxFrameBytes == 0 {
		c.Protocol = protocol.DefaultLimits()
	}
	if c.Limits.MaxMembers <= 0 {
		c.Limits.MaxMembers = protocol.DefaultLimits().MaxMembers
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return nil
}

// Stats are the worker's counters.
type Stats struct {
	LeaseRenewals  atomic.Int64 // keep-alive responses: one stream per worker, whatever its shard count
	Takeovers      atomic.Int64
	Commits        atomic.Int64
	Events         atomic.Int64
	FencedWrites   atomic.Int64
	UnknownCommits atomic.Int64
	Evictions      atomic.Int64 // cached conversations dropped (reloaded on next use)
	DedupeTrimmed  atomic.Int64 // dedupe results dropped from memory (found in Postgres on a retry)
	// StateLoads counts batches that asked Postgres for state they lacked;
	// StateRoundTrips the round trips that answered them (loader.go).
	StateLoads      atomic.Int64
	StateRoundTrips atomic.Int64
	// ConvMoves counts the moved records this worker's writers committed
	// (a conversation isolated to, or released from, a dedicated vshard).
	ConvMoves atomic.Int64
	// Releases counts the overrides this worker's writers removed: a
	// released conversation was home (lease.ReleaseOverride).
	Releases atomic.Int64
	// PersistOffsetReads counts reads of persist's stored offsets from
	// Postgres (a writer trimming or replaying asks; persist's
	// announcements answer most of them).
	PersistOffsetReads atomic.Int64
}

// Worker owns some vshards and runs their writers.
type Worker struct {
	cfg   Config
	log   *slog.Logger
	stats Stats
	gen   atomic.Int64

	// persisted follows persist's stored offsets (persistOffset); offsetMu
	// makes a read of them one at a time.
	persisted *logsink.Announced
	offsetMu  sync.Mutex

	takeoverSeconds prometheus.Histogram
	commitSeconds   prometheus.Histogram
	arrivalSeconds  prometheus.Histogram

	mu     sync.Mutex
	shards map[int]*shard
	owned  atomic.Int64 // len(shards), read by the writers' group commit
	wg     sync.WaitGroup
	addr   string
	ready  chan struct{}
	view   atomic.Pointer[lease.Watcher]
	loader *loader   // the writers' shared state loads; nil until Run
	gate   leaseGate // stops taking commands when the lease may expire (leasegate.go)
	// takeovers holds a token per vshard taking over (MaxTakeovers).
	takeovers chan struct{}
}

// Advertised returns addr as others should dial it: a wildcard listen
// address (0.0.0.0, ::) becomes this host's name, as in a container.
func Advertised(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || !net.ParseIP(host).IsUnspecified() {
		return addr
	}
	if h, err := os.Hostname(); err == nil {
		return net.JoinHostPort(h, port)
	}
	return addr
}

// New returns a worker; Run starts it.
func New(cfg Config) (*Worker, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Worker{cfg: cfg, log: cfg.Log.With("worker", cfg.ID), shards: map[int]*shard{}, ready: make(chan struct{}),
		persisted: logsink.NewAnnounced(cfg.Topic),
		takeovers: make(chan struct{}, cfg.MaxTakeovers),
		takeoverSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "chatpipe_worker_takeover_seconds", Help: "Time from seeing the owner row to accepting commands (marker + replay), per vshard.",
			ConstLabels: prometheus.Labels{"worker": cfg.ID}, Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
		arrivalSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "chatpipe_worker_move_arrival_seconds", Help: "From a moved record's commit to its conversation's first command decided by the vshard it moved to (persist's lag plus the retry).",
			ConstLabels: prometheus.Labels{"worker": cfg.ID}, Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "chatpipe_worker_commit_seconds", Help: "Time to produce and commit one transaction (group commit).",
			ConstLabels: prometheus.Labels{"worker": cfg.ID}, Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
	}, nil
}

// Collectors returns the worker's Prometheus metrics.
func (w *Worker) Collectors() []prometheus.Collector {
	l := prometheus.Labels{"worker": w.cfg.ID}
	counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: l}, func() float64 { return float64(v.Load()) })
	}
	return append([]prometheus.Collector{
		counter("chatpipe_worker_fenced_writes_total", "Produces or commits refused because another writer took the vshard over.", &w.stats.FencedWrites),
		counter("chatpipe_worker_unknown_commits_total", "Transactions whose commit returned an error (outcome unknown; never answered accepted).", &w.stats.UnknownCommits),
		counter("chatpipe_worker_takeovers_total", "Vshards taken over (marker committed, replayed, accepting).", &w.stats.Takeovers),
		counter("chatpipe_worker_commits_total", "Kafka transactions committed.", &w.stats.Commits),
		counter("chatpipe_worker_events_total", "Events committed.", &w.stats.Events),
		counter("chatpipe_worker_lease_renewals_total", "Lease keep-alive responses (one stream per worker).", &w.stats.LeaseRenewals),
		counter("chatpipe_worker_evictions_total", "Cached conversations evicted.", &w.stats.Evictions),
		counter("chatpipe_worker_dedupe_trimmed_total", "Dedupe results dropped from memory (a later retry is answered from Postgres).", &w.stats.DedupeTrimmed),
		counter("chatpipe_worker_state_loads_total", "Batches whose writer asked Postgres for conversations or client_message_ids it lacked.", &w.stats.StateLoads),
		counter("chatpipe_worker_state_round_trips_total", "Postgres round trips that answered those loads (several writers' loads share one).", &w.stats.StateRoundTrips),
		counter("chatpipe_worker_persist_offset_reads_total", "Reads of persist's stored offsets from Postgres (persist's announcements answer the writers while the worker's LISTEN is in effect).", &w.stats.PersistOffsetReads),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "chatpipe_worker_dedupe_entries", Help: "Dedupe results held in memory by this worker's writers, as of their last trim.", ConstLabels: l},
			func() float64 { return float64(w.dedupeHeld()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "chatpipe_worker_owned_shards", Help: "Vshards this worker is accepting for.", ConstLabels: l},
			func() float64 { return float64(len(w.Owned())) }),
		counter("chatpipe_worker_conversation_moves_total", "Moved records committed: conversations isolated to or released from a dedicated vshard.", &w.stats.ConvMoves),
		counter("chatpipe_worker_overrides_released_total", "Overrides removed by the writer of a released conversation's hashed vshard once it held the conversation again.", &w.stats.Releases),
		w.takeoverSeconds,
		w.commitSeconds,
		w.arrivalSeconds,
	}, w.leaseCollectors()...)
}

// persistOffset is persist's stored next offset of partition part (ok:
// one is stored): what persist's announcements said, while they are
// current, else read from Postgres. It may lag what is stored, never lead
// it: what a writer trims or replays by it stays safe. Callers wait for a
// read in flight (offsetMu): the writers that take vshards over together
// all ask at once, and until that read is in, "nothing known" would read
// as "nothing stored" and start their replays at the partition's start.
func (w *Worker) persistOffset(ctx context.Context, part int32) (off int64, ok bool, err error) {
	w.offsetMu.Lock()
	defer w.offsetMu.Unlock()
	if !w.persisted.Stale() {
		off, ok = w.persisted.Offset(part)
		return off, ok, nil
	}
	have, err := logsink.Offsets(ctx, w.cfg.DB, logsink.PersistConsumer, w.cfg.Topic)
	if err != nil {
		w.persisted.MarkStale()
		return 0, false, err
	}
	w.stats.PersistOffsetReads.Add(1)
	w.persisted.Learn(have)
	off, ok = have[part]
	return off, ok, nil
}

// SetTxnTimeout sets the Kafka transaction timeout of writers started
// after the call.
func (w *Worker) SetTxnTimeout(d time.Duration) {
	if d > 0 {
		w.cfg.TxnTimeout = d
	}
}

// Stats returns the worker's counters.
func (w *Worker) Stats() *Stats { return &w.stats }

// Addr is the advertised address, valid once Ready is closed.
func (w *Worker) Addr() string { return w.addr }

// Ready is closed when the worker is registered in etcd.
func (w *Worker) Ready() <-chan struct{} { return w.ready }

// Healthy reports whether the worker is ready to serve: registered in etcd,
// and accepting for every vshard whose owner row names it.
func (w *Worker) Healthy() error {
	select {
	case <-w.ready:
	default:
		return errors.New("not registered in etcd yet")
	}
	watcher := w.view.Load()
	if watcher == nil {
		return errors.New("no ownership view yet")
	}
	if err := w.leaseGateErr(); err != nil {
		return err
	}
	v, gen := watcher.Snapshot(), w.gen.Load()
	assigned := 0
	for s := 0; s < w.layout().AllVShards(); s++ {
		if row, ok := v.Shards[s]; ok && row.Worker == w.cfg.ID && row.Gen == gen {
			assigned++
		}
	}
	if owned := len(w.Owned()); owned < assigned {
		return fmt.Errorf("taking over: accepting for %d of the %d vshards assigned to it", owned, assigned)
	}
	return nil
}

// dedupeHeld sums the dedupe results its writers hold.
func (w *Worker) dedupeHeld() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var n int64
	for _, s := range w.shards {
		n += s.dedupeHeld.Load()
	}
	return n
}

// Owned returns the vshards this worker is accepting for.
func (w *Worker) Owned() []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []int
	for v, s := range w.shards {
		if s.ready.Load() {
			out = append(out, v)
		}
	}
	return out
}

// Run serves until ctx ends, then stops its writers, revokes its lease (so
// its shards move at once) and returns.
func (w *Worker) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", w.cfg.Listen)
	if err != nil {
		return fmt.Errorf("shardworker: listen: %w", err)
	}
	w.addr = Advertised(ln.Addr().String())
	if w.cfg.Advertise != "" {
		w.addr = w.cfg.Advertise
	}
	bg, stopBG := context.WithCancel(context.Background())
	var bgwg sync.WaitGroup
	defer func() { stopBG(); bgwg.Wait() }()

	watcher, err := lease.Watch(bg, w.cfg.Etcd, w.cfg.Prefix, w.log)
	if err != nil {
		ln.Close()
		return err
	}
	w.view.Store(watcher)
	w.loader = newLoader(w.cfg.DB, w.cfg.CommitTimeout, &w.stats.StateRoundTrips, &w.stats.StateLoads)
	defer w.loader.stop()
	if !w.cfg.NoListen {
		bgwg.Add(1)
		go func() {
			defer bgwg.Done()
			w.persisted.Listen(bg, w.cfg.DB, pglisten.Persisted, w.log,
				"worker: LISTEN connection lost; reading persist's offsets until it is back")
		}()
	}
	bgwg.Add(2)
	go func() {
		defer bgwg.Done()
		if err := link.Serve(bg, ln, w.leaseGated(w.handle), w.cfg.Wire, w.log); err != nil {
			w.log.Error("worker listener failed", "err", err)
		}
	}()
	go func() {
		defer bgwg.Done()
		_ = lease.RunCoordinator(ctx, w.cfg.Etcd, watcher, lease.CoordinatorConfig{
			Prefix: w.cfg.Prefix, VShards: w.layout().AllVShards(), Candidate: w.cfg.ID, TTL: w.cfg.LeaseTTL, Log: w.log})
	}()

	readyOnce := sync.Once{}
	for ctx.Err() == nil {
		reg, err := lease.Register(ctx, w.cfg.Etcd, w.cfg.Prefix, w.cfg.ID, lease.WorkerInfo{Addr: w.addr, Admin: w.cfg.AdminAddr},
			w.cfg.LeaseTTL, &w.stats.LeaseRenewals, w.log)
		if err != nil {
			w.log.Warn("cannot register worker", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		w.gen.Store(reg.Gen)
		w.gate.set(reg)
		w.log.Info("worker registered", "gen", reg.Gen, "addr", w.addr)
		readyOnce.Do(func() { close(w.ready) })
		w.manage(ctx, reg, watcher)
		w.stopAll()
		if ctx.Err() != nil {
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := reg.Close(rctx); err != nil {
				w.log.Warn("lease revoke failed; shards move when it expires", "err", err)
			}
			cancel()
			break
		}
		_ = reg.Close(context.Background())
		w.log.Warn("worker lease lost; registering again with a new gen")
	}
	return nil
}

// manage starts and stops shard writers as the owner rows change, until the
// lease is lost or ctx ends.
func (w *Worker) manage(ctx context.Context, reg *lease.Registration, watcher *lease.Watcher) {
	var routes map[string]lease.Override // the overrides the writers were told of
	for {
		changed := watcher.Changed()
		view := watcher.Snapshot()
		now := watcher.Overrides()
		w.mu.Lock()
		for v := 0; v < w.layout().AllVShards(); v++ {
			row, ok := view.Shards[v]
			mine := ok && row.Worker == w.cfg.ID && row.Gen == reg.Gen
			cur := w.shards[v]
			if cur != nil && (!mine || cur.epoch != row.Epoch) {
				cur.stop()
				delete(w.shards, v)
				cur = nil
			}
			if mine && cur == nil {
				s := newShard(w, v, row)
				for cid, o := range now {
					w.tell(s, cid, o, true)
				}
				w.shards[v] = s
				w.wg.Add(1)
				go func() { defer w.wg.Done(); s.run() }()
			} else if cur != nil {
				for cid, o := range now {
					if prev, ok := routes[cid]; !ok || prev != o {
						w.tell(cur, cid, o, true)
					}
				}
				for cid := range routes {
					if _, ok := now[cid]; !ok {
						w.tell(cur, cid, lease.Override{}, false)
					}
				}
			}
		}
		routes = now
		w.owned.Store(int64(len(w.shards)))
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-reg.Lost():
			return
		case <-changed:
		}
	}
}

func (w *Worker) stopAll() {
	w.mu.Lock()
	for v, s := range w.shards {
		s.stop()
		delete(w.shards, v)
	}
	w.owned.Store(0)
	w.mu.Unlock()
	w.wg.Wait()
}

// layout is the deployment's shape.
func (w *Worker) layout() logrecord.Layout {
	return logrecord.Layout{VShards: w.cfg.VShards, Partitions: w.cfg.Partitions, Dedicated: w.cfg.Dedicated}
}

// tell feeds shard s override o of conversation cid (routed; else it was
// removed) if the conversation may be at s's vshard: its hashed one, or
// any dedicated one.
func (w *Worker) tell(s *shard, cid string, o lease.Override, routed bool) {
	if w.layout().MayHold(s.v, cid) {
		s.route(routeUpdate{conv: cid, to: o.VShard, rev: o.Rev, routed: routed})
	}
}

// vshardOf is where conversation cid's commands go: its override, else
// its hashed vshard.
func (w *Worker) vshardOf(cid string) int {
	if watcher := w.view.Load(); watcher != nil {
		if v, ok := watcher.Override(cid); ok {
			return v
		}
	}
	return logrecord.VShard(cid, w.cfg.VShards)
}

// handle routes a gateway request to the shard writer of its conversation.
func (w *Worker) handle(req *link.Request, reply func(*link.Response)) {
	r := req.Req
	done := func(rep *protocol.Reply, retry bool) { reply(&link.Response{RID: req.RID, Reply: rep, Retry: retry}) }
	if e := r.Validate(w.cfg.Protocol); e != nil {
		done(protocol.Rejected(r.ID, e), false)
		return
	}
	switch r.Op {
	case protocol.OpCreate, protocol.OpJoin, protocol.OpKick, protocol.OpLeave, protocol.OpSend, protocol.OpRead:
	default:
		done(protocol.Rejected(r.ID, protocol.Errorf(protocol.CodeBadRequest, "op %s is not served by workers", r.Op)), false)
		return
	}
	cmid := r.ClientMessageID
	if r.Op == protocol.OpRead {
		cmid = "" // a read marker is idempotent and takes no key
	}
	v := w.vshardOf(r.ConversationID)
	w.mu.Lock()
	s := w.shards[v]
	w.mu.Unlock()
	if s == nil {
		done(shardcore.Unavailable(r.ID, "vshard %d is not owned by %s", v, w.cfg.ID), true)
		return
	}
	c := &shardcore.Call{ReqID: r.ID, Tag: replyFunc(done), Deadline: req.Deadline, Cmd: shardcore.Command{
		Op: r.Op, ConversationID: r.ConversationID, Sender: req.User, UserID: r.UserID,
		ClientMessageID: cmid, Body: r.Body, Members: r.Members, Seq: r.Seq,
	}}
	if !s.submit(c) {
		done(shardcore.Unavailable(r.ID, "vshard %d is overloaded", v), true)
	}
}
