package web

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/lease"
)

const workerMetrics = `# TYPE chatpipe_worker_events_total counter
chatpipe_worker_events_total{worker="%[1]s"} %[2]d
# TYPE chatpipe_worker_fenced_writes_total counter
chatpipe_worker_fenced_writes_total{worker="%[1]s"} 1
# TYPE chatpipe_worker_takeovers_total counter
chatpipe_worker_takeovers_total{worker="%[1]s"} 2
# TYPE chatpipe_worker_owned_shards gauge
chatpipe_worker_owned_shards{worker="%[1]s"} 2
# TYPE chatpipe_worker_takeover_seconds histogram
chatpipe_worker_takeover_seconds_bucket{worker="%[1]s",le="+Inf"} 2
chatpipe_worker_takeover_seconds_sum{worker="%[1]s"} 0.5
chatpipe_worker_takeover_seconds_count{worker="%[1]s"} 2
# TYPE go_goroutines gauge
go_goroutines 12
`

func TestMetricSample(t *testing.T) {
	s := newMetricSample()
	if err := s.parse(fmt.Appendf(nil, workerMetrics, "wa", 10)); err != nil {
		t.Fatal(err)
	}
	err := s.parse([]byte("# TYPE chatpipe_persist_lag_records gauge\nchatpipe_persist_lag_records{partition=\"0\"} 3\nchatpipe_persist_lag_records{partition=\"1\"} 4\n"))
	if err != nil {
		t.Fatal(err)
	}
	wa := s.workers["wa"]
	for name, want := range map[string]float64{
		"chatpipe_worker_events_total": 10, "chatpipe_worker_fenced_writes_total": 1, "chatpipe_worker_owned_shards": 2,
		"chatpipe_worker_takeover_seconds_sum": 0.5, "chatpipe_worker_takeover_seconds_count": 2,
	} {
		if wa[name] != want {
			t.Errorf("wa %s = %v, want %v", name, wa[name], want)
		}
	}
	if got := s.global["chatpipe_persist_lag_records"]; got != 7 {
		t.Errorf("persist lag summed over partitions = %v, want 7", got)
	}
	if _, ok := s.global["go_goroutines"]; ok {
		t.Error("kept a metric that is not chatpipe_*")
	}
	if err := s.parse([]byte("not a metrics page {")); err == nil {
		t.Error("parsed garbage without an error")
	}
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestOpsState checks the pipeline's state against a real etcd holding
// owner rows, two registered workers (one answering on its admin address,
// one not), a coordinator, and this process's own metrics.
func TestOpsState(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	etcd, err := devstack.StartEtcd(ctx, t.TempDir(), 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	var mu sync.Mutex
	waEvents := 100
	wa := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, workerMetrics, "wa", waEvents)
	}))
	defer wa.Close()
	dead, err := net.Listen("tcp", "127.0.0.1:0") // an admin address nobody serves
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()

	put := func(key string, v any, opts ...clientv3.OpOption) {
		t.Helper()
		b, _ := json.Marshal(v)
		if _, err := cli.Put(ctx, lease.DefaultPrefix+key, string(b), opts...); err != nil {
			t.Fatal(err)
		}
	}
	grant := func() clientv3.LeaseID {
		t.Helper()
		l, err := cli.Grant(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		return l.ID
	}
	waLease, wbLease := grant(), grant()
	put("workers/wa", lease.WorkerInfo{Addr: "127.0.0.1:1", Gen: 3, Admin: strings.TrimPrefix(wa.URL, "http://")}, clientv3.WithLease(waLease))
	put("workers/wb", lease.WorkerInfo{Addr: "127.0.0.1:2", Gen: 5, Admin: deadAddr}, clientv3.WithLease(wbLease))
	put("shards/0", lease.Owner{Worker: "wa", Gen: 3, Epoch: 1})
	put("shards/1", lease.Owner{Worker: "wa", Gen: 3, Epoch: 4})
	put("shards/2", lease.Owner{Worker: "wb", Gen: 5, Epoch: 2})
	put("shards/3", lease.Owner{Worker: "wb", Gen: 4, Epoch: 1}) // an older gen of wb: not live
	put("shards/5", lease.Owner{Worker: "wa", Gen: 3, Epoch: 1}) // the first dedicated vshard
	put("shards/9", lease.Owner{Worker: "wz", Gen: 1, Epoch: 1}) // beyond the vshards: ignored
	since := time.Date(2026, 11, 29, 6, 0, 0, 0, time.UTC)
	put("routes/hot-2", lease.Override{VShard: 5, Since: since})
	put("routes/hot-1", lease.Override{VShard: 5, Since: since})
	put("routes/home", lease.Override{VShard: 2, Since: since}) // a release in progress
	if _, err := cli.Put(ctx, lease.DefaultPrefix+"routes/bad", "{"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, lease.DefaultPrefix+"coordinator/694d8a1b", "wa"); err != nil {
		t.Fatal(err)
	}

	accepted := 40.0
	clock := &fakeClock{t: time.Date(2026, 11, 29, 7, 0, 0, 0, time.UTC)}
	ops, err := NewOps(OpsConfig{
		Etcd: cli, VShards: 5, Dedicated: 2, Topic: "chatpipe.log", Log: testLog(t), Now: clock.Now,
		LocalMetrics: func(context.Context) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			return fmt.Appendf(nil, "# TYPE chatpipe_gateway_commands_total counter\nchatpipe_gateway_commands_total{op=\"send\",result=\"accepted\",code=\"\"} %v\nchatpipe_gateway_commands_total{op=\"send\",result=\"rejected\",code=\"forbidden\"} 3\n# TYPE chatpipe_gateway_connections gauge\nchatpipe_gateway_connections 2\n", accepted), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}

	s := ops.State(ctx)
	if len(s.Errors) > 0 {
		t.Fatalf("errors: %v", s.Errors)
	}
	wantShards := []ShardState{
		{VShard: 0, Worker: "wa", Gen: 3, Epoch: 1, Live: true}, {VShard: 1, Worker: "wa", Gen: 3, Epoch: 4, Live: true},
		{VShard: 2, Worker: "wb", Gen: 5, Epoch: 2, Live: true}, {VShard: 3, Worker: "wb", Gen: 4, Epoch: 1}, {VShard: 4},
		{VShard: 5, Worker: "wa", Gen: 3, Epoch: 1, Live: true, Dedicated: true, Conversations: []string{"hot-1", "hot-2"}},
		{VShard: 6, Dedicated: true},
	}
	if fmt.Sprint(s.Shards) != fmt.Sprint(wantShards) {
		t.Fatalf("shards\n got %v\nwant %v", s.Shards, wantShards)
	}
	if s.VShards != 5 || s.Dedicated != 2 {
		t.Errorf("vshards %d dedicated %d, want 5 and 2", s.VShards, s.Dedicated)
	}
	wantOverrides := []OverrideState{
		{Conversation: "home", VShard: 2, Since: since}, {Conversation: "hot-1", VShard: 5, Since: since, Isolated: true},
		{Conversation: "hot-2", VShard: 5, Since: since, Isolated: true},
	}
	if fmt.Sprint(s.Overrides) != fmt.Sprint(wantOverrides) {
		t.Errorf("overrides\n got %v\nwant %v", s.Overrides, wantOverrides)
	}
	if s.Coordinator != "wa" {
		t.Errorf("coordinator %q, want wa", s.Coordinator)
	}
	workers := map[string]WorkerState{}
	for _, w := range s.Workers {
		workers[w.ID] = w
	}
	if len(workers) != 2 {
		t.Fatalf("workers: %+v", s.Workers)
	}
	if w := workers["wa"]; w.State != WorkerLive || w.Owned != 3 || w.Rows != 3 || w.Gen != 3 || w.LeaseTTL <= 0 || w.Metrics["events_total"] != 100 {
		t.Errorf("wa: %+v", w)
	}
	if w := workers["wb"]; w.State != WorkerUnreachable || w.Owned != 1 || w.Rows != 2 || w.Error == "" {
		t.Errorf("wb: %+v", w)
	}
	if s.Totals.FencedWrites != 1 || s.Totals.Takeovers != 2 || s.Totals.Events != 100 {
		t.Errorf("totals: %+v", s.Totals)
	}
	if s.Gateway["connections"] != 2 || s.Gateway["commands_total{result=accepted}"] != 40 || s.Gateway["commands_total"] != 43 {
		t.Errorf("gateway: %v", s.Gateway)
	}

	// A state younger than MaxAge is served again.
	mu.Lock()
	waEvents, accepted = 300, 140
	mu.Unlock()
	if again := ops.State(ctx); again != s {
		t.Error("a second call within MaxAge collected again")
	}

	// Two seconds later: rates over the window.
	clock.Add(2 * time.Second)
	s = ops.State(ctx)
	if s.Rates.Events != 100 || s.Rates.GatewayAccepted != 50 {
		t.Errorf("rates after 2 s: %+v", s.Rates)
	}
	for _, w := range s.Workers {
		if w.ID == "wa" && w.EventsPerSecond != 100 {
			t.Errorf("wa events/s = %v, want 100", w.EventsPerSecond)
		}
	}

	// wa's lease ends: it is gone, keeps its last metrics, and its rows
	// are no longer live.
	if _, err := cli.Revoke(ctx, waLease); err != nil {
		t.Fatal(err)
	}
	clock.Add(2 * time.Second)
	s = ops.State(ctx)
	for _, w := range s.Workers {
		if w.ID == "wa" && (w.State != WorkerGone || w.Owned != 0 || w.Rows != 3 || w.LeaseTTL != -1 || w.Metrics["events_total"] != 300) {
			t.Errorf("wa after its lease ended: %+v", w)
		}
	}
	if s.Shards[0].Live || s.Shards[1].Live || !s.Shards[2].Live || s.Shards[5].Live {
		t.Errorf("shards after wa's lease ended: %v", s.Shards)
	}
	if s.Totals.Events != 300 {
		t.Errorf("totals keep a gone worker's last counters: %+v", s.Totals)
	}

	// Once no row names it, a gone worker is forgotten after Forget.
	put("shards/0", lease.Owner{Worker: "wb", Gen: 5, Epoch: 2})
	put("shards/1", lease.Owner{Worker: "wb", Gen: 5, Epoch: 5})
	put("shards/5", lease.Owner{Worker: "wb", Gen: 5, Epoch: 2})
	if _, err := cli.Delete(ctx, lease.DefaultPrefix+"routes/hot-2"); err != nil {
		t.Fatal(err)
	}
	clock.Add(11 * time.Minute)
	s = ops.State(ctx)
	for _, w := range s.Workers {
		if w.ID == "wa" {
			t.Errorf("wa still listed 11 min after it was last seen: %+v", w)
		}
	}
	if !s.Shards[0].Live || s.Shards[1].Epoch != 5 || !s.Shards[5].Live || fmt.Sprint(s.Shards[5].Conversations) != "[hot-1]" {
		t.Errorf("shards after the move: %v", s.Shards)
	}
}

func TestNewOpsNeedsEtcdAndVShards(t *testing.T) {
	if _, err := NewOps(OpsConfig{VShards: 4}); err == nil {
		t.Error("NewOps without etcd: no error")
	}
	if _, err := NewOps(OpsConfig{Etcd: &clientv3.Client{}}); err == nil {
		t.Error("NewOps without vshards: no error")
	}
	if _, err := NewOps(OpsConfig{Etcd: &clientv3.Client{}, VShards: 4, Dedicated: -1}); err == nil {
		t.Error("NewOps with negative dedicated vshards: no error")
	}
}

func TestAddMissingPartitions(t *testing.T) {
	c := &ConsumerState{Consumer: "projection", Partitions: []PartitionState{{Partition: 2, NextOffset: 5}}}
	addMissingPartitions(c, map[int32]int64{0: 3, 1: 0, 2: 9})
	var got []int32
	for _, p := range c.Partitions {
		got = append(got, p.Partition)
	}
	if fmt.Sprint(got) != "[0 1 2]" {
		t.Fatalf("partitions %v, want [0 1 2]", got)
	}
}
