package devstack

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// testMember is one member of a test cluster: what it needs to (re)start.
type testMember struct {
	dir, name            string
	clientPort, peerPort int
}

func testMembers(t *testing.T, n int) ([]testMember, string) {
	t.Helper()
	base := t.TempDir()
	var ms []testMember
	var cluster []string
	ports, err := FreePorts(2 * n) // distinct: two members given one port fail at once
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		cp, pp := ports[2*i-2], ports[2*i-1]
		m := testMember{dir: filepath.Join(base, fmt.Sprintf("m%d", i)), name: fmt.Sprintf("m%d", i), clientPort: cp, peerPort: pp}
		ms = append(ms, m)
		cluster = append(cluster, fmt.Sprintf("%s=http://127.0.0.1:%d", m.name, pp))
	}
	return ms, strings.Join(cluster, ",")
}

func startTestMember(t *testing.T, ctx context.Context, m testMember, cluster string) (*Etcd, error) {
	e, err := StartEtcdMember(ctx, m.dir, m.name, m.clientPort, m.peerPort, cluster, testLogger(t))
	if err == nil {
		t.Cleanup(func() { _ = e.Close() })
	}
	return e, err
}

// startTestMembers starts members at once: each waits for a quorum.
func startTestMembers(t *testing.T, ctx context.Context, ms []testMember, cluster string) []*Etcd {
	t.Helper()
	out := make([]*Etcd, len(ms))
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() { out[i], errs[i] = startTestMember(t, ctx, m, cluster) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("start %s: %v", ms[i].name, err)
		}
	}
	return out
}

func memberClient(t *testing.T, e *Etcd) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func mustPut(t *testing.T, ctx context.Context, e *Etcd, key, val string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := memberClient(t, e).Put(ctx, key, val); err != nil {
		t.Fatalf("put %s through %v: %v", key, e.Endpoints(), err)
	}
}

// linearizableGet reads key through e only; a linearizable read needs the
// member to reach a quorum and to have caught up with it.
func linearizableGet(t *testing.T, ctx context.Context, e *Etcd, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := memberClient(t, e).Get(ctx, key)
	if err != nil {
		t.Fatalf("get %s through %v: %v", key, e.Endpoints(), err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("get %s through %v: %d kvs", key, e.Endpoints(), len(resp.Kvs))
	}
	return string(resp.Kvs[0].Value)
}

func TestEtcdCluster(t *testing.T) {
	ctx := testContext(t)
	ms, cluster := testMembers(t, 3)
	es := startTestMembers(t, ctx, ms, cluster)
	for i, e := range es {
		want := fmt.Sprintf("http://127.0.0.1:%d", ms[i].clientPort)
		if eps := e.Endpoints(); !slices.Equal(eps, []string{want}) {
			t.Fatalf("%s Endpoints = %v, want [%s]", ms[i].name, eps, want)
		}
		if e.PeerPort() != ms[i].peerPort {
			t.Fatalf("%s PeerPort = %d, want %d", ms[i].name, e.PeerPort(), ms[i].peerPort)
		}
	}
	ml, err := memberClient(t, es[0]).MemberList(ctx)
	if err != nil {
		t.Fatalf("member list: %v", err)
	}
	if len(ml.Members) != 3 {
		t.Fatalf("member list has %d members, want 3: %v", len(ml.Members), ml.Members)
	}
	for _, m := range ml.Members {
		i := slices.IndexFunc(ms, func(tm testMember) bool { return tm.name == m.Name })
		if i < 0 || !slices.Equal(m.PeerURLs, []string{fmt.Sprintf("http://127.0.0.1:%d", ms[i].peerPort)}) {
			t.Fatalf("unexpected member %s with peer URLs %v", m.Name, m.PeerURLs)
		}
	}

	// Write through one member, read through another.
	mustPut(t, ctx, es[0], "devstack/cluster", "v1")
	if got := linearizableGet(t, ctx, es[1], "devstack/cluster"); got != "v1" {
		t.Fatalf("read through m2 = %q, want v1", got)
	}

	// A second member on a dir in use is refused.
	if e2, err := StartEtcdMember(ctx, ms[2].dir, ms[2].name, 0, ms[2].peerPort, cluster, testLogger(t)); err == nil {
		_ = e2.Close()
		t.Fatal("second StartEtcdMember on a dir in use succeeded")
	} else if !strings.Contains(err.Error(), "already in use") {
		t.Fatalf("second StartEtcdMember: unexpected error %v", err)
	}

	// Lose one of three: the other two still make a quorum.
	if err := es[2].Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-es[2].Done():
	default:
		t.Fatal("Done not closed after Close")
	}
	mustPut(t, ctx, es[1], "devstack/cluster", "v2")
	if got := linearizableGet(t, ctx, es[0], "devstack/cluster"); got != "v2" {
		t.Fatalf("read through m1 with m3 down = %q, want v2", got)
	}

	// Restart it on the same dir and ports: it rejoins and catches up.
	start := time.Now()
	e3, err := startTestMember(t, ctx, ms[2], cluster)
	if err != nil {
		t.Fatalf("restart m3: %v", err)
	}
	t.Logf("m3 rejoined in %v", time.Since(start).Round(time.Millisecond))
	es[2] = e3
	if got := linearizableGet(t, ctx, es[2], "devstack/cluster"); got != "v2" {
		t.Fatalf("read through the restarted m3 = %q, want v2", got)
	}
	mustPut(t, ctx, es[2], "devstack/cluster", "v3")
	if got := linearizableGet(t, ctx, es[0], "devstack/cluster"); got != "v3" {
		t.Fatalf("read through m1 after the restart = %q, want v3", got)
	}

	// Lose two of three: no write can commit. The write is not refused
	// either: a leader that has not yet noticed it lost its quorum keeps it
	// in its log, and it may commit once the quorum is back (an unknown
	// outcome, not a failure), hence a key of its own.
	for _, i := range []int{1, 2} {
		if err := es[i].Close(); err != nil {
			t.Fatal(err)
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = memberClient(t, es[0]).Put(pctx, "devstack/probe", "written without quorum")
	cancel()
	if err == nil {
		t.Fatal("a write committed with two of three members down")
	}
	t.Logf("write without quorum: %v", err)

	// Both come back (one at a time: one plus the survivor is a quorum).
	for _, i := range []int{1, 2} {
		if es[i], err = startTestMember(t, ctx, ms[i], cluster); err != nil {
			t.Fatalf("restart %s: %v", ms[i].name, err)
		}
	}
	for i, e := range es {
		if got := linearizableGet(t, ctx, e, "devstack/cluster"); got != "v3" {
			t.Fatalf("read through %s after quorum came back = %q, want v3", ms[i].name, got)
		}
	}
	mustPut(t, ctx, es[1], "devstack/cluster", "v4")
}

func TestEtcdClusterBadConfig(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name, cluster string
		peerPort      int
		want          string
	}{
		{"m1", "m2=http://127.0.0.1:2380", 2380, "does not name member m1"},
		{"m1", "m1=http://127.0.0.1:2381", 2380, "listens on http://127.0.0.1:2380"},
		{"m1", "m1=http://127.0.0.1:2380", 0, "peer port 0"},
		{"m1", "m1=notaurl", 2380, "initial cluster"},
		{"", "", 2380, "empty member name"},
	} {
		e, err := StartEtcdMember(ctx, filepath.Join(dir, "x"), tc.name, 0, tc.peerPort, tc.cluster, testLogger(t))
		if err == nil {
			_ = e.Close()
			t.Fatalf("StartEtcdMember(%q, %d, %q) succeeded", tc.name, tc.peerPort, tc.cluster)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("StartEtcdMember(%q, %d, %q) = %v, want an error containing %q", tc.name, tc.peerPort, tc.cluster, err, tc.want)
		}
	}
}
