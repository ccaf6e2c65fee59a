package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chatpipe/chatpipe/internal/atomicfile"
	"github.com/chatpipe/chatpipe/internal/auth"
)

// Config configures a run. Zero fields get the defaults of validate.
type Config struct {
	Run     string // run name: the run directory's name and the prefix of its ids
	Out     string // directory holding run directories and runs.ledger
	Profile Profile
	Rate    float64 // offered messages/s of the whole plan (default: the profile's)
	// Shard, when N > 1, runs part K of N of the plan: its users and
	// conversations only (shared with no other part), at Rate/N.
	Shard    Shard
	Duration time.Duration // send phase (default 60 s)
	Stack    Stack
	Secret   []byte // JWT secret to mint the users' tokens
	Seed     uint64
	// DupShare is the share of sends also sent from a second device of the
	// sender with the same ids (default 0.01; negative: none).
	DupShare float64
	// Churn is membership changes per second: a member of a group leaves
	// or is kicked, sends once more (forbidden expected), and is added
	// back a second later (default rate/500, at least 0.5/s; negative: none).
	Churn float64
	// Reconnects is deliberate reconnects per second: a random device
	// closes its websocket and dials again, resending what was in flight
	// and syncing from its cursors (default 0: none).
	Reconnects float64
	// PlainFrames asks the gateway for one frame per websocket message
	// instead of the batching subprotocol (protocol.SubprotocolBatch).
	PlainFrames bool
	BodyBytes   int           // message body size (default 100: log records of about 350 bytes)
	Timeout     time.Duration // an unanswered command is sent again after this (default 10 s), within Resend
	Resend      ResendPolicy  // backoff, budget and attempt limit of re-sends
	Drain       time.Duration // wait for answers and deliveries after the send phase (default 60 s)
	Settle      time.Duration // deliveries are done once none arrived for this long (default 2 s)
	Progress    io.Writer     // the live progress line (nil: none)
	Log         *slog.Logger
}

func (c *Config) validate() error {
	if !ValidRunName(c.Run) {
		return fmt.Errorf("loadgen: run name %q: use 1-48 of [A-Za-z0-9_-]", c.Run)
	}
	if c.Out == "" || c.Stack.WebSocket == "" || len(c.Secret) == 0 {
		return errors.New("loadgen: Out, Stack.WebSocket and Secret are required")
	}
	if c.Rate <= 0 {
		c.Rate = c.Profile.Rate
	}
	if c.Duration <= 0 {
		c.Duration = time.Minute
	}
	if c.DupShare == 0 {
		c.DupShare = 0.01
	}
	if c.Shard.N > 1 && (c.Shard.K < 1 || c.Shard.K > c.Shard.N) {
		return fmt.Errorf("loadgen: shard %d/%d", c.Shard.K, c.Shard.N)
	}
	if c.Churn == 0 {
		c.Churn = max(c.shardRate()/500, 0.5)
	}
	if c.BodyBytes <= 0 {
		c.BodyBytes = 100
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Drain <= 0 {
		c.Drain = time.Minute
	}
	if c.Settle <= 0 {
		c.Settle = 2 * time.Second
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Profile.Devices > 16 {
		return errors.New("loadgen: at most 16 devices per user (the gateway's per-user connection cap)")
	}
	return nil
}

// shardRate is the rate this process offers: its part of the plan's.
func (c *Config) shardRate() float64 { return c.Rate / float64(max(c.Shard.N, 1)) }

// DirName is the run's directory name under Out and its name in the
// ledger: the run name, with "-KofN" for a shard.
func (c *Config) DirName() string {
	if c.Shard.Whole() {
		return c.Run
	}
	return fmt.Sprintf("%s-%dof%d", c.Run, c.Shard.K, c.Shard.N)
}

// runner is one run in progress.
type runner struct {
	cfg  Config
	dir  string
	log  *slog.Logger
	plan Plan
	rng  *rand.Rand // owned by the scheduler goroutine

	devices map[string][]*device
	acc     *stream
	rej     *stream
	del     *stream
	gup     *stream
	accLat  *latency
	delLat  *latency

	sent, accepted, dups, membership atomic.Int64
	keys                             atomic.Int64 // idempotency keys of membership commands
	errors, reconnects, deliveries   atomic.Int64
	inflight                         atomic.Int64
	offered, commands, resends       atomic.Int64
	givenUp, unanswered              atomic.Int64
	sendStart, sendEnd               atomic.Int64 // unix ns
	delivery                         atomic.Int32 // 0 unknown, 1 served, 2 not served

	cmu      sync.Mutex
	rejects  map[string]int64
	retries  map[string]int64    // re-sends by cause
	refused  map[string]int64    // re-sends refused by cause
	members  map[string][]string // the run's view of each conversation's members
	churning map[string]bool
	phase    string
	perSec   []int64 // first sends per second of the send phase

	rs *resender

	tmu    sync.Mutex
	tokens map[string]string

	timers sync.WaitGroup  // delayed retries
	dctx   context.Context // the devices' context: retries end with it
}

// Run runs the load and writes the run directory. It returns the report
// (also on failure, with Status failed and the phase) and an error if the
// run failed.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	dir := filepath.Join(cfg.Out, cfg.DirName())
	ledger := filepath.Join(cfg.Out, LedgerFile)
	start := time.Now()
	if err := BeginRun(ledger, cfg.DirName(), dir, start); err != nil {
		return nil, err
	}
	// A died or failed attempt of this name left records: start afresh.
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	r := &runner{cfg: cfg, dir: dir, log: cfg.Log, accLat: newLatency(), delLat: newLatency(),
		rejects: map[string]int64{}, retries: map[string]int64{}, refused: map[string]int64{}, members: map[string][]string{},
		churning: map[string]bool{}, tokens: map[string]string{}, devices: map[string][]*device{},
		rng: rand.New(rand.NewPCG(cfg.Seed, 1+uint64(max(cfg.Shard.K, 0))<<32)), rs: newResender(cfg.Resend, rand.Int64N)}
	rep := &Report{Run: cfg.Run, Shard: cfg.Shard.String(), Profile: cfg.Profile.Name, Start: start.UTC(), Rate: cfg.shardRate(), Duration: cfg.Duration.String()}
	phase, err := r.run(ctx, rep)
	rep.End = time.Now().UTC()
	// The totals come from the run's own files, whatever phase it reached.
	if werr := r.writeCounters(); werr != nil && err == nil {
		err, phase = werr, "report"
	}
	if tot, terr := ReadTotals(dir); terr != nil {
		if err == nil {
			err, phase = terr, "report"
		}
	} else {
		tot.Apply(rep)
	}
	rep.DeliveryLat = r.delLat.summary()
	rep.DeliveryMode = "served"
	if !r.deliveryServed() {
		rep.DeliveryMode = "not served"
	}
	status := StatusFinished
	var errText string
	if err != nil {
		status, errText = StatusFailed, err.Error()
		rep.Phase, rep.Error = phase, errText
	}
	rep.Status = status
	werr := WriteReport(dir, rep)
	if werr != nil && err == nil {
		err, status, errText, phase = werr, StatusFailed, werr.Error(), "report"
	}
	end := rep.End
	line := LedgerLine{Run: cfg.DirName(), Status: status, Start: rep.Start, End: &end, Error: errText}
	if status != StatusFinished {
		line.Phase = phase
	}
	if lerr := EndRun(ledger, line); lerr != nil && err == nil {
		err = lerr
	}
	return rep, err
}

func (r *runner) setPhase(p string) error {
	r.cmu.Lock()
	r.phase = p
	r.cmu.Unlock()
	if err := atomicfile.Write(filepath.Join(r.dir, PhaseFile), []byte(p+"\n"), 0o644); err != nil {
		return err
	}
	return r.writeCounters()
}

// counters is a snapshot of what no record stream holds.
func (r *runner) counters() Counters {
	r.cmu.Lock()
	defer r.cmu.Unlock()
	c := Counters{Phase: r.phase, At: time.Now().UnixNano(), SendStart: r.sendStart.Load(), SendEnd: r.sendEnd.Load(),
		Offered: r.offered.Load(), Sent: r.sent.Load(), Commands: r.commands.Load(), Resends: r.resends.Load(),
		GivenUp: r.givenUp.Load(), Membership: r.membership.Load(), Errors: r.errors.Load(), Reconnects: r.reconnects.Load(),
		Unanswered: r.unanswered.Load(), SentPerSec: append([]int64(nil), r.perSec...),
		Retries: copyCounts(r.retries), Refused: copyCounts(r.refused)}
	return c
}

func copyCounts(m map[string]int64) map[string]int64 {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]int64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// writeCounters rewrites counters.json crash-safe.
func (r *runner) writeCounters() error {
	return atomicfile.WriteJSON(filepath.Join(r.dir, CountersFile), r.counters(), 0o644)
}

// keepRecords flushes the record streams and rewrites counters.json once a
// second until stop is closed, so a run killed mid-way leaves its totals.
func (r *runner) keepRecords(stop <-chan struct{}) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		for _, s := range []*stream{r.acc, r.rej, r.del, r.gup} {
			if err := s.flush(); err != nil {
				r.log.Warn("flush records", "err", err)
			}
		}
		if err := r.writeCounters(); err != nil {
			r.log.Warn("write counters", "err", err)
		}
	}
}

// run runs the phases; on error it returns the phase that failed.
func (r *runner) run(ctx context.Context, rep *Report) (string, error) {
	if err := r.setPhase("setup"); err != nil {
		return "setup", err
	}
	shape, err := Size(r.cfg.Profile, r.cfg.Rate)
	if err != nil {
		return "setup", err
	}
	if r.plan, err = ShardPlan(r.cfg.Run, shape, r.cfg.Profile, r.cfg.Seed, r.cfg.Shard); err != nil {
		return "setup", err
	}
	rep.Users, rep.Devices, rep.Conversations = len(r.plan.Users), r.plan.Devices, len(r.plan.Conversations)
	info := RunInfo{Run: r.cfg.Run, Shard: r.cfg.Shard.String(), Seed: r.cfg.Seed, Profile: r.cfg.Profile.Name, Rate: r.cfg.shardRate(), Duration: r.cfg.Duration.String(),
		Start: rep.Start, Stack: r.cfg.Stack, Plan: r.plan}
	if err := atomicfile.WriteJSON(filepath.Join(r.dir, RunFile), info, 0o644); err != nil {
		return "setup", err
	}
	for _, s := range []struct {
		p    **stream
		name string
	}{{&r.acc, AcceptedFile}, {&r.rej, RejectedFile}, {&r.del, DeliveredFile}, {&r.gup, GaveUpFile}} {
		if *s.p, err = openStream(filepath.Join(r.dir, s.name)); err != nil {
			return "setup", err
		}
	}
	defer func() {
		for _, s := range []*stream{r.acc, r.rej, r.del, r.gup} {
			if cerr := s.close(); cerr != nil && err == nil {
				err = fmt.Errorf("loadgen: close records: %w", cerr)
			}
		}
	}()
	stopKeeping := make(chan struct{})
	keeperDone := make(chan struct{})
	go func() { defer close(keeperDone); r.keepRecords(stopKeeping) }()
	defer func() { close(stopKeeping); <-keeperDone }()

	// Devices run until devCtx ends, after every answer and delivery.
	devCtx, stopDevices := context.WithCancel(ctx)
	r.dctx = devCtx
	var devWG sync.WaitGroup
	defer func() {
		stopDevices()
		devWG.Wait()
		r.timers.Wait()
		r.abandonPending()
	}()
	phase := "connect"
	if err := r.setPhase(phase); err != nil {
		return phase, err
	}
	for _, u := range r.plan.Users {
		for i := 0; i < r.plan.Devices; i++ {
			d := newDevice(r, u, i)
			r.devices[u] = append(r.devices[u], d)
			devWG.Add(1)
			go func() { defer devWG.Done(); d.run(devCtx) }()
		}
	}
	if err := r.waitConnected(ctx, time.Minute); err != nil {
		return phase, err
	}
	// Is delivery served? A sync of nothing says.
	probe := r.devices[r.plan.Users[0]][0]
	r.track(1)
	probe.enqueue(devCtx, &op{kind: "sync", cursors: map[string]int64{}, done: r.syncDone(devCtx, probe)})
	if err := r.waitIdle(ctx, 30*time.Second); err != nil {
		return phase, fmt.Errorf("loadgen: the first sync got no answer: %w", err)
	}

	phase = "create"
	if err := r.setPhase(phase); err != nil {
		return phase, err
	}
	var created atomic.Int64
	for _, c := range r.plan.Conversations {
		r.members[c.ID] = append([]string(nil), c.Members...)
		r.track(1)
		r.dev(c.Owner).enqueue(devCtx, &op{kind: "create", conv: c.ID, cmid: "create", members: c.Members[1:], done: func(f *frame) {
			if f.Op == "accepted" || f.Code == "conflict" {
				created.Add(1)
			}
		}})
	}
	if err := r.waitIdle(ctx, 2*time.Minute); err != nil {
		return phase, err
	}
	if n := created.Load(); n != int64(len(r.plan.Conversations)) {
		return phase, fmt.Errorf("loadgen: created %d of %d conversations", n, len(r.plan.Conversations))
	}

	phase = "send"
	if err := r.setPhase(phase); err != nil {
		return phase, err
	}
	r.send(ctx, devCtx)
	r.sendEnd.Store(time.Now().UnixNano())
	if ctx.Err() != nil {
		return phase, ctx.Err()
	}

	phase = "drain"
	if err := r.setPhase(phase); err != nil {
		return phase, err
	}
	if err := r.waitIdle(ctx, r.cfg.Drain); err != nil {
		r.unanswered.Store(r.inflight.Load())
		r.log.Warn("commands still unanswered after the drain", "n", r.inflight.Load())
	}

	phase = "converge"
	if err := r.setPhase(phase); err != nil {
		return phase, err
	}
	if r.deliveryServed() {
		r.waitQuiet(ctx, r.cfg.Drain)
		for _, ds := range r.devices {
			for _, d := range ds {
				r.track(1)
				d.enqueue(devCtx, &op{kind: "sync", cursors: d.cursorCopy(), done: r.syncDone(devCtx, d)})
			}
		}
		if err := r.waitIdle(ctx, r.cfg.Drain); err != nil {
			return phase, fmt.Errorf("loadgen: devices did not finish their sync: %w", err)
		}
		r.waitQuiet(ctx, r.cfg.Drain)
	}
	stopDevices()
	devWG.Wait()
	r.timers.Wait()
	r.abandonPending()

	phase = "report"
	if err := r.setPhase(phase); err != nil {
		return phase, err
	}
	if ctx.Err() != nil {
		return phase, ctx.Err()
	}
	return phase, nil
}

func (r *runner) dev(user string) *device {
	return r.devices[user][0]
}

func (r *runner) token(user string) (string, error) {
	r.tmu.Lock()
	defer r.tmu.Unlock()
	if t, ok := r.tokens[user]; ok {
		return t, nil
	}
	t, err := auth.Mint(r.cfg.Secret, user, r.cfg.Duration+2*time.Hour, time.Now())
	if err != nil {
		return "", fmt.Errorf("loadgen: token for %s: %w", user, err)
	}
	r.tokens[user] = t
	return t, nil
}

// track counts commands without a final answer yet.
func (r *runner) track(n int64) { r.inflight.Add(n) }

func (r *runner) deliveryServed() bool { return r.delivery.Load() == 1 }

func (r *runner) bump(m map[string]int64, k string) {
	r.cmu.Lock()
	m[k]++
	r.cmu.Unlock()
}

func (r *runner) waitConnected(ctx context.Context, limit time.Duration) error {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for _, ds := range r.devices {
		for _, d := range ds {
			select {
			case <-d.connected:
			case <-ctx.Done():
				return ctx.Err()
			case <-deadline.C:
				return fmt.Errorf("loadgen: not every device connected within %v (%d errors)", limit, r.errors.Load())
			}
		}
	}
	return nil
}

// waitIdle waits until every command has its final answer.
func (r *runner) waitIdle(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for r.inflight.Load() > 0 {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("loadgen: %d commands unanswered after %v", r.inflight.Load(), limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// waitQuiet waits until no event was delivered for Settle (at most limit).
func (r *runner) waitQuiet(ctx context.Context, limit time.Duration) {
	deadline := time.Now().Add(limit)
	last, since := r.deliveries.Load(), time.Now()
	for ctx.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		if n := r.deliveries.Load(); n != last {
			last, since = n, time.Now()
		} else if time.Since(since) >= r.cfg.Settle {
			return
		}
	}
}
