package sim

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/chatpipe/chatpipe/internal/ownership"
	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// World is one simulated deployment: log, owner store, sink, workers,
// gateway view, network, clients and devices, on one simulated clock.
// Nothing in it runs concurrently; every change is one step chosen by the
// schedule, so a run is a pure function of its Config and its choices.
type World struct {
	cfg Config
	ch  Chooser

	now  int64
	step int

	log     *Log
	owners  *OwnerStore
	sink    *Sink
	proj    *Projection
	workers []*worker
	net     network
	gateway ownership.View
	gwRev   int64
	// routes is the owner store's overrides: conversation → vshard (its
	// hashed vshard while a release is in progress); routesRev counts
	// their changes, routeRevs is the revision of each one's last write
	// (its mod revision), and the gateway and each worker act on the copy
	// they last read.
	routes      map[string]int
	routesRev   int64
	routeRevs   map[string]int64
	gwRoutes    map[string]int
	gwRoutesRev int64

	convs   []string
	ghosts  []string // conversations nobody creates
	users   []string
	ops     []*op
	devices []*device
	sends   int
	msgIDs  int

	faults int
	// Postgres (the sink and the writers' queries) and etcd (the writers'
	// owner-row reads) do not answer while now is before these.
	pgDownUntil   int64
	etcdDownUntil int64
	stats         Stats
	staleExample  string
	violations    []Violation
	// planMoves is whether ownership.Plan moved a vshard at owner store
	// revision planRev (planKnown: it was asked).
	planKnown bool
	planRev   int64
	planMoves bool
	// projBroken: conversations PropProjection has reported.
	projBroken map[string]bool
	trace      []string
}

// Run simulates one schedule whose choices ch makes, drains it (heal every
// fault, run to quiescence) and checks the properties.
func Run(cfg Config, ch Chooser) *Result {
	w := newWorld(cfg, ch)
	w.setup()
	for i := 0; i < cfg.Steps; i++ {
		w.randomStep()
	}
	return w.finish()
}

// RunSeed runs the schedule that seed chooses (NewSeededChooser) without a
// trace and, if a property broke, runs it again with one: the second run
// is the same schedule, and its Result has the trace Report prints.
func RunSeed(cfg Config, seed uint64) *Result {
	quiet := cfg
	quiet.Untraced = true
	if r := Run(quiet, NewSeededChooser(seed)); !r.Failed() || cfg.Untraced {
		return r
	}
	return Run(cfg, NewSeededChooser(seed))
}

// finish drains the world, checks the properties and returns the result.
func (w *World) finish() *Result {
	w.drain()
	w.check()
	w.stats.Steps = w.step
	w.stats.Ops = len(w.ops)
	w.stats.FencedWrites = w.log.Fenced
	w.stats.TimedOutTxns = w.log.TimedOut
	return &Result{Violations: w.violations, Stats: w.stats, Trace: w.trace, Stale: w.staleExample}
}

func newWorld(cfg Config, ch Chooser) *World {
	w := &World{cfg: cfg, ch: ch, owners: NewOwnerStore(cfg.LeaseTTL), sink: NewSink(), proj: NewProjection(), routes: map[string]int{}, routeRevs: map[string]int64{}, projBroken: map[string]bool{}}
	w.log = NewLog(w.layout().TopicPartitions())
	for i := 0; i < cfg.Workers; i++ {
		w.workers = append(w.workers, &worker{id: fmt.Sprintf("w%d", i), alive: true, writers: map[int]*writer{}})
	}
	for i := 0; i < cfg.Users; i++ {
		w.users = append(w.users, fmt.Sprintf("u%d", i))
	}
	w.convs = conversationIDs("c", cfg.Conversations, cfg.VShards)
	w.ghosts = conversationIDs("g", cfg.GhostConvs, cfg.VShards)
	for _, u := range w.users {
		for n := 0; n < cfg.DevicesPerUser; n++ {
			w.devices = append(w.devices, newDevice(u, n))
		}
	}
	return w
}

// conversationIDs names n conversations, prefix followed by numbers, so
// that conversation i lands on vshard i mod vshards.
func conversationIDs(prefix string, n, vshards int) []string {
	var out []string
	for i := 0; i < n; i++ {
		for k := 0; ; k++ {
			id := fmt.Sprintf("%s%d.%d", prefix, i, k)
			if logrecord.VShard(id, vshards) == i%vshards {
				out = append(out, id)
				break
			}
		}
	}
	return out
}

// setup registers the workers, assigns the vshards and has u0 create every
// conversation with u1 and u2; the creates are ordinary client ops.
func (w *World) setup() {
	for _, wk := range w.workers {
		w.register(wk)
	}
	w.coordinate()
	for _, wk := range w.workers {
		w.manage(wk)
	}
	w.refreshGateway()
	for _, c := range w.convs {
		w.issue(shardcore.Command{Op: protocol.OpCreate, ConversationID: c, Sender: w.users[0], Members: w.users[1:min(3, len(w.users))]}, true)
	}
}

// coordinate is one round of the coordinator: ownership.Plan on the current
// view, each move written by compare-and-swap.
func (w *World) coordinate() {
	for _, m := range ownership.Plan(w.owners.View(), w.layout().AllVShards()) {
		if w.owners.CAS(m) {
			w.stats.Moves++
			w.tracef("  move v%d %s→%s gen %d epoch %d", m.VShard, m.From, m.To, m.Gen, m.Epoch)
		}
	}
}

func (w *World) refreshGateway() {
	w.gateway, w.gwRev = w.owners.View(), w.owners.Rev()
	w.gwRoutes, w.gwRoutesRev = maps.Clone(w.routes), w.routesRev
}

// layout is the deployment's shape.
func (w *World) layout() logrecord.Layout {
	return logrecord.Layout{VShards: w.cfg.VShards, Partitions: w.cfg.Partitions, Dedicated: w.cfg.Dedicated}
}

// routeOf is where a router with overrides routes sends conv's commands.
func (w *World) routeOf(routes map[string]int, conv string) int {
	if v, ok := routes[conv]; ok {
		return v
	}
	return logrecord.VShard(conv, w.cfg.VShards)
}

// locatedAt is where the committed log says conv is written: the target
// of its last moved event, or its hashed vshard.
func (w *World) locatedAt(conv string) int {
	at := logrecord.VShard(conv, w.cfg.VShards)
	var top int64
	for _, rec := range w.log.ConvRecords(conv) {
		if e := rec.Event; e.Kind == logrecord.KindMoved && e.Seq > top && e.ToVShard != nil {
			top, at = e.Seq, *e.ToVShard
		}
	}
	return at
}

// advance moves the clock: leases run out, running workers renew theirs
// (or learn it is gone), old transactions time out.
func (w *World) advance(d int64) {
	w.now += d
	w.owners.Expire(w.now)
	for _, wk := range w.workers {
		if wk.running(w.now) && wk.registered && !wk.leaseLost && !w.owners.KeepAlive(wk.id, wk.gen, w.now) {
			wk.leaseLost = true
		}
	}
	w.log.ExpireTransactions(w.now, w.cfg.TxnTimeout)
}

func (w *World) worker(id string) *worker {
	for _, wk := range w.workers {
		if wk.id == id {
			return wk
		}
	}
	panic("sim: no worker " + id)
}

func (w *World) violate(prop, format string, args ...any) {
	w.violations = append(w.violations, Violation{Property: prop, Detail: fmt.Sprintf(format, args...)})
}

func (w *World) tracef(format string, args ...any) {
	if w.cfg.Untraced {
		return
	}
	w.trace = append(w.trace, fmt.Sprintf(format, args...))
}

// sortedKeys returns a map's keys in order: the simulation never depends on
// map iteration order.
func sortedKeys[K cmp.Ordered, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// pgDown reports whether Postgres is down now.
func (w *World) pgDown() bool { return w.now < w.pgDownUntil }

// etcdDown reports whether etcd is down now.
func (w *World) etcdDown() bool { return w.now < w.etcdDownUntil }

// outage takes a dependency down for 1 to 6 ticks from now.
func (w *World) outage(until *int64) {
	*until = w.now + 1 + int64(w.ch.Choose(6, "outage ticks"))
	w.stats.Outages++
}
