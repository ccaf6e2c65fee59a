package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/logrecord"
)

// TestInitAndConfig: `chatpipe init` agrees with a deployment of the same
// shape (idempotent), refuses another shape, and `chatpipe version` runs.
func TestInitAndConfig(t *testing.T) {
	sharing(t, 15, 14)
	dev := startDev(t, t.TempDir(), "--vshards", "64") // dev's own default shape
	run := func(args ...string) (string, error) {
		out, err := exec.Command(binary, args...).CombinedOutput()
		return string(out), err
	}
	base := []string{"init", "--etcd", strings.Join(dev.EP.Etcd, ","), "--database-url", dev.EP.Postgres, "--kafka", strings.Join(dev.EP.Kafka, ",")}
	if out, err := run(append(base, "--vshards", "64", "--partitions", "8", "--dedicated", "2")...); err != nil {
		t.Fatalf("init with the deployment's shape: %v\n%s", err, out)
	}
	out, err := run(append(base, "--vshards", "128", "--partitions", "8")...)
	if err == nil || !strings.Contains(out, "differs") {
		t.Errorf("init with another shape: %v\n%s", err, out)
	}
	if out, err := run("version"); err != nil || !strings.HasPrefix(out, "chatpipe ") {
		t.Errorf("version: %v %q", err, out)
	}

	// health and readiness on the gateway's address, metrics on the admin
	// address
	base0 := strings.TrimSuffix(strings.Replace(dev.EP.WebSocket, "ws://", "http://", 1), "/v1/ws")
	metrics0 := dev.EP.Admin + "/metrics"
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(base0 + path)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %v %v", path, resp, err)
		} else {
			resp.Body.Close()
		}
	}
	// the profiler is on the admin address only, never on the public one
	if resp, err := http.Get(dev.EP.Admin + "/debug/pprof/goroutine?debug=1"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("pprof on the admin address %q: %v %v", dev.EP.Admin, resp, err)
	} else {
		resp.Body.Close()
	}
	if resp, err := http.Get(base0 + "/debug/pprof/"); err == nil {
		if resp.StatusCode == http.StatusOK {
			t.Error("the public gateway address serves /debug/pprof/")
		}
		resp.Body.Close()
	}
	for _, m := range []string{"chatpipe_gateway_connections", "chatpipe_worker_owned_shards", "chatpipe_persist_inserted_total", "chatpipe_worker_lease_renewals_total"} {
		stacktest.Metric(t, metrics0, m) // fails the test if unreadable
	}
	// after some traffic: commit and command latency, persist batches and lag, answers by op, result and code
	cl0 := dev.Dial(t, "metrics")
	cl0.Must(map[string]any{"op": "create", "conversation_id": "mc", "members": []string{}})
	cl0.Do(map[string]any{"op": "send", "conversation_id": "nope", "client_message_id": "x", "body": "x"})
	readEvents(t, dev.EP.Postgres, 1)
	time.Sleep(500 * time.Millisecond)
	body := func() string {
		resp, err := http.Get(metrics0)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}()
	for _, m := range []string{"chatpipe_worker_commit_seconds_count", "chatpipe_persist_batch_records_count", "chatpipe_persist_batch_seconds_count",
		`chatpipe_persist_lag_records{partition=`, `chatpipe_gateway_commands_total{code="forbidden",op="send",result="rejected"}`,
		`chatpipe_gateway_commands_total{code="",op="create",result="accepted"}`, `chatpipe_gateway_command_seconds_count{op="send"}`,
		"chatpipe_worker_takeover_seconds_count", `chatpipe_build_info{go_version="go`} {
		if !strings.Contains(body, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
	if n := stacktest.Metric(t, metrics0, "chatpipe_worker_owned_shards"); n != float64(dev.EP.All()) {
		t.Errorf("owned_shards sums to %v, want %d", n, dev.EP.All())
	}
	if n := stacktest.Metric(t, metrics0, "chatpipe_gateway_unowned_vshards"); n != 0 {
		t.Errorf("the gateway sees %v vshards without a live owner, want 0", n)
	}

	// admin shards: every vshard owned by a live worker of dev
	ep := dev.Dir + "/endpoints.json"
	out, err = run("admin", "shards", "--endpoints", ep, "--json")
	if err != nil {
		t.Fatalf("admin shards: %v\n%s", err, out)
	}
	var table struct {
		Workers []struct {
			ID     string `json:"id"`
			TTL    int64  `json:"lease_ttl_seconds"`
			Shards int    `json:"shards"`
		} `json:"workers"`
		Shards []struct {
			Live  bool  `json:"live"`
			Epoch int64 `json:"epoch"`
		} `json:"shards"`
	}
	if err := json.Unmarshal([]byte(out), &table); err != nil {
		t.Fatalf("admin shards --json: %v\n%s", err, out)
	}
	total := 0
	for _, w := range table.Workers {
		if w.TTL <= 0 || w.TTL > 10 {
			t.Errorf("worker %s lease TTL %d", w.ID, w.TTL)
		}
		total += w.Shards
	}
	if len(table.Shards) != dev.EP.All() || total != dev.EP.All() || len(table.Workers) != 2 {
		t.Errorf("admin shards: %d shards, %d owned by %d workers", len(table.Shards), total, len(table.Workers))
	}
	for i, s := range table.Shards {
		if !s.Live || s.Epoch < 1 {
			t.Errorf("vshard %d: %+v", i, s)
		}
	}
	if out, err := run("admin", "shards", "--endpoints", ep); err != nil || !strings.Contains(out, "VSHARD") {
		t.Errorf("admin shards table: %v\n%s", err, out)
	}

	// admin handoff: vshard 0 moves to the other worker with epoch+1
	before := stacktest.EtcdView(t, dev.EP).Shards[0]
	other := "w1"
	if before.Worker == "w1" {
		other = "w2"
	}
	if out, err := run("admin", "handoff", "--endpoints", ep, "--vshard", "0", "--to", other); err != nil {
		t.Fatalf("admin handoff: %v\n%s", err, out)
	}
	after := stacktest.EtcdView(t, dev.EP).Shards[0]
	if after.Worker != other || after.Epoch != before.Epoch+1 {
		t.Errorf("handoff: %+v → %+v", before.Owner, after.Owner)
	}
	cl := dev.Dial(t, "hand")
	for i := 0; i < 50; i++ { // a conversation on vshard 0 keeps working after the move
		if conv := fmt.Sprintf("h%d", i); logrecord.VShard(conv, dev.EP.VShards) == 0 {
			cl.Must(map[string]any{"op": "create", "conversation_id": conv, "members": []string{}})
			break
		}
	}
	time.Sleep(2 * time.Second) // the balancer must not undo an operator's move
	if now := stacktest.EtcdView(t, dev.EP).Shards[0]; now.Worker != other {
		t.Errorf("vshard 0 moved back to %s after the hand-off", now.Worker)
	}

	// admin check-config: agrees as given, lists the disagreement otherwise
	// (the dev broker keeps one replica of everything)
	if out, err := run("admin", "check-config", "--endpoints", ep, "--vshards", "64", "--partitions", "8", "--min-replication", "1"); err != nil || !strings.Contains(out, "agree") {
		t.Errorf("check-config: %v\n%s", err, out)
	}
	if out, err := run("admin", "check-config", "--endpoints", ep, "--vshards", "64", "--partitions", "8"); err == nil || !strings.Contains(out, "replicated 1 ways, fewer than 3") {
		t.Errorf("check-config of a topic with one replica: %v\n%s", err, out)
	}
	// a log topic with the broker's usual 7-day retention is refused
	week := devstack.TopicSpec{Partitions: 8 + 2, Configs: map[string]string{"retention.ms": "604800000"}}
	if err := devstack.EnsureTopicSpec(context.Background(), dev.EP.Kafka, "chatpipe.week", week); err != nil {
		t.Fatal(err)
	}
	if out, err := run("admin", "check-config", "--endpoints", ep, "--topic", "chatpipe.week", "--min-replication", "1"); err == nil || !strings.Contains(out, "retention.ms=604800000") {
		t.Errorf("check-config of a topic with a 7-day retention: %v\n%s", err, out)
	}
	if out, err := run("admin", "check-config", "--endpoints", ep, "--vshards", "65", "--partitions", "8"); err == nil || !strings.Contains(out, "etcd holds vshards=64") {
		t.Errorf("check-config with a wrong shape: %v\n%s", err, out)
	}
}

// TestOpsPageOnTheAdminAddress: `chatpipe gateway` serves the pipeline page
// (/ops, /ops/state) and /metrics on its --admin address and not on its
// public one, which keeps the websocket, the chat page, /healthz and
// /readyz; --ops-public and --metrics-public put them back on the public
// address. `chatpipe dev` serves the pipeline page on both, /metrics on
// the admin address only (endpoints.json names it as metrics).
func TestOpsPageOnTheAdminAddress(t *testing.T) {
	parallel(t)
	dev := startDev(t, t.TempDir())
	gateway := func(name string, args ...string) (public, admin string) {
		port, adminPort := stacktest.FreePort(t), stacktest.FreePort(t)
		stacktest.StartProc(t, dev.Dir, name, nil, append([]string{"gateway", "--endpoints", filepath.Join(dev.Dir, "endpoints.json"),
			"--data-dir", dev.Dir, "--http", "127.0.0.1:" + strconv.Itoa(port), "--admin", "127.0.0.1:" + strconv.Itoa(adminPort), "--log-level", "warn"}, args...)...)
		stacktest.WaitFor(t, 60*time.Second, name+" to listen", func() bool { return stacktest.Dialable(port) && stacktest.Dialable(adminPort) })
		return fmt.Sprintf("http://127.0.0.1:%d", port), fmt.Sprintf("http://127.0.0.1:%d", adminPort)
	}
	public, admin := gateway("gateway-ops")
	onPublic, _ := gateway("gateway-ops-public", "--ops-public", "--metrics-public")
	for _, c := range []struct {
		base, path string
		want       int
	}{
		{public, "/", http.StatusOK},
		{public, "/healthz", http.StatusOK},
		{public, "/readyz", http.StatusOK},
		{public, "/ops", http.StatusNotFound},
		{public, "/ops/state", http.StatusNotFound},
		{public, "/metrics", http.StatusNotFound},
		{public, "/debug/pprof/", http.StatusNotFound},
		{admin, "/ops", http.StatusOK},
		{admin, "/ops/state", http.StatusOK},
		{admin, "/web/ops.js", http.StatusOK},
		{admin, "/metrics", http.StatusOK},
		{onPublic, "/ops", http.StatusOK},
		{onPublic, "/ops/state", http.StatusOK},
		{onPublic, "/metrics", http.StatusOK},
		{dev.EP.HTTP, "/ops/state", http.StatusOK},
		{dev.EP.HTTP, "/metrics", http.StatusNotFound},
		{dev.EP.Admin, "/ops/state", http.StatusOK},
		{dev.EP.Admin, "/metrics", http.StatusOK},
	} {
		resp, err := http.Get(c.base + c.path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("GET %s%s: %d, want %d", c.base, c.path, resp.StatusCode, c.want)
		}
	}
	// The admin address serves the gateway's own metrics; endpoints.json's
	// metrics is dev's admin address.
	if n := stacktest.Metric(t, admin+"/metrics", "chatpipe_gateway_unowned_vshards"); n != 0 {
		t.Errorf("gateway-ops sees %v vshards without a live owner, want 0", n)
	}
	var ep struct {
		Metrics string `json:"metrics"`
	}
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(dev.Dir, "endpoints.json"))), &ep); err != nil || ep.Metrics != dev.EP.Admin+"/metrics" {
		t.Errorf("endpoints.json names metrics %q (%v), want %s/metrics", ep.Metrics, err, dev.EP.Admin)
	}
}
