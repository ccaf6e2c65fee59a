package lease_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/chatpipe/chatpipe/lease"
)

// TestCoordinatorAssignsEveryVShard runs the coordinator against a real
// etcd on a cold start of the compose file's size (4,096 hashed vshards and
// 16 dedicated) with three live workers: every vshard gets exactly one owner
// row, at epoch 1, the loads differ by at most one, and a worker that leaves
// has its vshards spread over the other two with their epochs raised. No
// move fails its compare: the coordinator plans again only once its view
// has its own writes.
func TestCoordinatorAssignsEveryVShard(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts etcd")
	}
	const vshards = 4096 + 16
	quiet := slog.New(slog.DiscardHandler)
	_, cli := testEtcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	regs := map[string]*lease.Registration{}
	for _, id := range []string{"wa", "wb", "wc"} {
		reg, err := lease.Register(ctx, cli, lease.DefaultPrefix, id, lease.WorkerInfo{}, 10, nil, quiet)
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Close(context.Background())
		regs[id] = reg
	}
	w, err := lease.Watch(ctx, cli, lease.DefaultPrefix, quiet)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var logged syncBuffer
	go func() {
		defer close(done)
		_ = lease.RunCoordinator(ctx, cli, w, lease.CoordinatorConfig{
			Prefix: lease.DefaultPrefix, VShards: vshards, Candidate: "c", Settle: 10 * time.Millisecond,
			Log: slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	}()
	defer func() { cancel(); <-done }()

	// settled waits until every vshard has a live owner and the loads of
	// the live workers differ by at most one, and returns the view.
	settled := func(what string, workers int) lease.View {
		t.Helper()
		start := time.Now()
		for {
			v := w.Snapshot()
			loads := map[string]int{}
			owned := 0
			for s := 0; s < vshards; s++ {
				if row, _, ok := v.Live(s); ok {
					loads[row.Worker]++
					owned++
				}
			}
			lo, hi := vshards, 0
			for _, n := range loads {
				lo, hi = min(lo, n), max(hi, n)
			}
			if owned == vshards && len(loads) == workers && hi-lo <= 1 {
				t.Logf("%s: every one of %d vshards owned, loads %v, after %v", what, vshards, loads, time.Since(start).Round(time.Millisecond))
				return v
			}
			if time.Since(start) > 3*time.Minute {
				t.Fatalf("%s: after 3 minutes %d of %d vshards have a live owner, loads %v", what, owned, vshards, loads)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	cold := settled("cold start", 3)
	for s := 0; s < vshards; s++ {
		if row := cold.Shards[s]; row.Epoch != 1 {
			t.Fatalf("vshard %d at epoch %d after a cold start, want 1", s, row.Epoch)
		}
	}

	if n := strings.Count(logged.String(), "shard move failed"); n > 0 {
		t.Errorf("%d moves failed on a cold start; the coordinator's log:\n%s", n, logged.String())
	}

	if err := regs["wc"].Close(ctx); err != nil {
		t.Fatal(err)
	}
	after := settled("after wc left", 2)
	for s := 0; s < vshards; s++ {
		was, now := cold.Shards[s], after.Shards[s]
		switch {
		case was.Worker == "wc" && now.Epoch != was.Epoch+1:
			t.Fatalf("vshard %d moved from wc to %s at epoch %d, want %d", s, now.Worker, now.Epoch, was.Epoch+1)
		case was.Worker != "wc" && now != was:
			t.Fatalf("vshard %d of a live worker changed: %+v → %+v", s, was, now)
		}
	}
	if n := strings.Count(logged.String(), "shard move failed"); n > 0 {
		t.Errorf("%d moves failed; the coordinator's log:\n%s", n, logged.String())
	}
}

// syncBuffer is a bytes.Buffer safe for a logger's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// etcdRanges is how many ranges the test's embedded etcd has served
// (etcd_mvcc_range_total, in the default registry).
func etcdRanges(t *testing.T) float64 {
	t.Helper()
	fams, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "etcd_mvcc_range_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("etcd_mvcc_range_total not found")
	return 0
}

// TestIdleCoordinatorAsksNothing: once every vshard has its owner, the
// coordinator reads nothing from etcd while nothing changes (it read the
// hand-off requests every Interval before), and a hand-off request still
// wakes it at once: the watch of the view sees the request.
func TestIdleCoordinatorAsksNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts etcd")
	}
	const vshards = 16
	quiet := slog.New(slog.DiscardHandler)
	_, cli := testEtcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, id := range []string{"wa", "wb"} {
		reg, err := lease.Register(ctx, cli, lease.DefaultPrefix, id, lease.WorkerInfo{}, 10, nil, quiet)
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Close(context.Background())
	}
	w, err := lease.Watch(ctx, cli, lease.DefaultPrefix, quiet)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = lease.RunCoordinator(ctx, cli, w, lease.CoordinatorConfig{
			Prefix: lease.DefaultPrefix, VShards: vshards, Candidate: "c", Settle: 10 * time.Millisecond,
			Interval: 50 * time.Millisecond, Log: quiet})
	}()
	defer func() { cancel(); <-done }()

	owned := func() map[int]string {
		v := w.Snapshot()
		out := map[int]string{}
		for s := 0; s < vshards; s++ {
			if row, _, ok := v.Live(s); ok {
				out[s] = row.Worker
			}
		}
		return out
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(owned()) < vshards {
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s %d of %d vshards have an owner", len(owned()), vshards)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // (the last plan's reads)
	before := etcdRanges(t)
	time.Sleep(2 * time.Second)
	if n := etcdRanges(t) - before; n > 0 {
		t.Errorf("the idle coordinator read etcd %v times in 2 s, want 0", n)
	}

	to := "wa"
	if owned()[3] == "wa" {
		to = "wb"
	}
	asked := time.Now()
	if err := lease.RequestHandoff(ctx, cli, lease.DefaultPrefix, 3, to); err != nil {
		t.Fatal(err)
	}
	for owned()[3] != to {
		if time.Since(asked) > 5*time.Second {
			t.Fatalf("vshard 3 not handed off to %s within 5 s of the request", to)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("handed off %v after the request", time.Since(asked).Round(time.Millisecond))
}
