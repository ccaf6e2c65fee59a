package lease

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"golang.org/x/sync/errgroup"

	"github.com/chatpipe/chatpipe/internal/ownership"
)

// CoordinatorConfig configures RunCoordinator.
type CoordinatorConfig struct {
	Prefix  string
	VShards int
	// Candidate names this candidate in the election.
	Candidate string
	// Settle is how long a new leader waits for workers to register before
	// its first plan (default 1 s), so a cold start does not pile every
	// shard on the first worker only to move half of them again.
	Settle time.Duration
	// Interval bounds the time between two plans while something is left
	// to retry: a move or hand-off that failed, or hand-off requests that
	// could not be read (default 1 s).
	Interval time.Duration
	// IdleInterval bounds it otherwise (default 30 s). Every change of
	// the view (a worker registering or leaving, an owner row, a hand-off
	// request) wakes the coordinator at once, and a hand-off's pin is
	// planned again when it expires, so this is only a safety net: an
	// idle deployment's coordinator asks etcd nothing in between.
	IdleInterval time.Duration
	// TTL is the seconds the leader's etcd session lives without renewal
	// (default DefaultTTL): how long a dead leader blocks a new one.
	TTL int64
	Log *slog.Logger
}

// RunCoordinator campaigns for <prefix>coordinator and, while elected,
// reassigns shards whose owner is gone and balances shards over live workers
// (Plan), writing each move by compare-and-swap on the row's revision. It
// returns when ctx ends; it campaigns again when it loses the election.
func RunCoordinator(ctx context.Context, cli *clientv3.Client, w *Watcher, cfg CoordinatorConfig) error {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Settle == 0 {
		cfg.Settle = time.Second
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	if cfg.IdleInterval == 0 {
		cfg.IdleInterval = 30 * time.Second
	}
	for ctx.Err() == nil {
		err := lead(ctx, cli, w, cfg)
		if ctx.Err() != nil {
			return nil
		}
		cfg.Log.Warn("coordinator lost leadership", "candidate", cfg.Candidate, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
	return nil
}

func lead(ctx context.Context, cli *clientv3.Client, w *Watcher, cfg CoordinatorConfig) error {
	ttl := cfg.TTL
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(int(ttl)), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("lease: coordinator session: %w", err)
	}
	defer sess.Close()
	el := concurrency.NewElection(sess, cfg.Prefix+"coordinator")
	if err := el.Campaign(ctx, cfg.Candidate); err != nil {
		return fmt.Errorf("lease: campaign: %w", err)
	}
	cfg.Log.Info("elected coordinator", "candidate", cfg.Candidate)
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = el.Resign(rctx)
		cancel()
	}()
	select {
	case <-ctx.Done():
		return nil
	case <-sess.Done():
		return fmt.Errorf("lease: coordinator session expired")
	case <-time.After(cfg.Settle):
	}
	pins := map[int]time.Time{}
	for {
		changed := w.Changed()
		retry := handoffs(ctx, cli, w, cfg, pins)
		view := w.Snapshot()
		view.Pinned = map[int]bool{}
		for v, until := range pins {
			if time.Now().Before(until) {
				view.Pinned[v] = true
			} else {
				delete(pins, v)
			}
		}
		rev, failed := applyAll(ctx, cli, cfg.Prefix, ownership.Plan(view, cfg.VShards), cfg.Log)
		retry = retry || failed
		if rev > 0 {
			// Plan again only on a view that has the rows just
			// written: planned on one that lags, the moves already
			// made would be tried again and fail their compare.
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if err := w.WaitFor(wctx, rev); err != nil && ctx.Err() == nil {
				cfg.Log.Warn("ownership view lags the coordinator's writes", "err", err)
			}
			cancel()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-sess.Done():
			return fmt.Errorf("lease: coordinator session expired")
		case <-changed:
			// let a burst of changes settle
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		case <-time.After(planWait(retry, pins, time.Now(), cfg.Interval, cfg.IdleInterval)):
		}
	}
}

// planWait is how long the coordinator waits for a change before it plans
// again: interval while something is left to retry, else idle, or less if
// a hand-off's pin expires sooner (then a little after it does, so the
// plan sees it expired).
func planWait(retry bool, pins map[int]time.Time, now time.Time, interval, idle time.Duration) time.Duration {
	if retry {
		return interval
	}
	wait := idle
	for _, until := range pins {
		wait = min(wait, max(until.Sub(now)+10*time.Millisecond, 10*time.Millisecond))
	}
	return wait
}

// HandoffPin is how long a vshard handed off by an operator is kept where
// it was put before load balancing may move it again.
const HandoffPin = time.Minute

// RequestHandoff asks the coordinator to move vshard v to worker to, by the
// normal takeover order (epoch+1, marker, replay, accept).
func RequestHandoff(ctx context.Context, cli *clientv3.Client, prefix string, v int, to string) error {
	val, _ := json.Marshal(map[string]string{"to": to})
	if _, err := cli.Put(ctx, prefix+"handoff/"+strconv.Itoa(v), string(val)); err != nil {
		return fmt.Errorf("lease: request hand-off: %w", err)
	}
	return nil
}

// handoffs carries out operators' hand-off requests (<prefix>handoff/<n>).
// It reports whether one is left to retry (or they could not be read).
func handoffs(ctx context.Context, cli *clientv3.Client, w *Watcher, cfg CoordinatorConfig, pins map[int]time.Time) (retry bool) {
	resp, err := cli.Get(ctx, cfg.Prefix+"handoff/", clientv3.WithPrefix())
	if err != nil {
		return true
	}
	if len(resp.Kvs) == 0 {
		return false
	}
	view := w.Snapshot()
	for _, kv := range resp.Kvs {
		n, err := strconv.Atoi(strings.TrimPrefix(string(kv.Key), cfg.Prefix+"handoff/"))
		var req struct {
			To string `json:"to"`
		}
		if err == nil {
			err = json.Unmarshal(kv.Value, &req)
		}
		to, live := view.Workers[req.To]
		row := view.Shards[n]
		switch {
		case err != nil || n < 0 || n >= cfg.VShards:
			cfg.Log.Warn("dropping a malformed hand-off request", "key", string(kv.Key))
		case !live:
			cfg.Log.Warn("dropping a hand-off to a worker that is not live", "vshard", n, "to", req.To)
		case row.Worker == req.To && row.Gen == to.Gen:
		default:
			m := Move{VShard: n, From: row.Worker, To: req.To, Gen: to.Gen, Epoch: row.Epoch + 1, ModRevision: row.ModRevision}
			if _, err := apply(ctx, cli, cfg.Prefix, m); err != nil {
				cfg.Log.Warn("hand-off failed; retrying", "vshard", n, "to", req.To, "err", err)
				retry = true
				continue
			}
			cfg.Log.Info("handed off by request", "vshard", n, "from", m.From, "to", m.To, "epoch", m.Epoch)
			pins[n] = time.Now().Add(HandoffPin)
		}
		_, _ = cli.Delete(ctx, string(kv.Key))
	}
	return retry
}

// ApplyParallel is how many of a plan's moves the coordinator writes at
// once.
const ApplyParallel = 64

// applyAll writes a plan's moves, up to ApplyParallel at a time, and logs
// each outcome. Every move is a compare-and-swap on its own row, so their
// order does not matter; written one at a time, each waited for a raft
// commit and a disk sync of its own, and a cold start of 4,096 vshards
// took minutes before the last one had an owner. Concurrent writes share
// etcd's raft entries and syncs. A move that fails is left to the next
// plan, which sees the rows as they are then. It returns the highest etcd
// revision written (0: none) and whether a move failed.
func applyAll(ctx context.Context, cli *clientv3.Client, prefix string, moves []Move, log *slog.Logger) (int64, bool) {
	var g errgroup.Group
	g.SetLimit(ApplyParallel)
	var mu sync.Mutex
	var high int64
	var failed bool
	for _, m := range moves {
		g.Go(func() error {
			rev, err := apply(ctx, cli, prefix, m)
			if err != nil {
				log.Warn("shard move failed", "vshard", m.VShard, "to", m.To, "err", err)
				mu.Lock()
				failed = true
				mu.Unlock()
				return nil
			}
			log.Info("shard moved", "vshard", m.VShard, "from", m.From, "to", m.To, "epoch", m.Epoch)
			mu.Lock()
			high = max(high, rev)
			mu.Unlock()
			return nil
		})
	}
	_ = g.Wait() // every move logs its own error
	return high, failed
}

// apply writes one move if the row is still at the revision the plan saw,
// and returns the revision of the write.
func apply(ctx context.Context, cli *clientv3.Client, prefix string, m Move) (int64, error) {
	key := shardKey(prefix, m.VShard)
	val, _ := json.Marshal(Owner{Worker: m.To, Gen: m.Gen, Epoch: m.Epoch})
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", m.ModRevision)).
		Then(clientv3.OpPut(key, string(val))).Commit()
	if err != nil {
		return 0, fmt.Errorf("lease: write owner: %w", err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("lease: owner row of vshard %d changed since the plan", m.VShard)
	}
	return resp.Header.Revision, nil
}
