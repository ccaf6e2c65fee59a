package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/logrecord"
)

// etcdMember is one `chatpipe etcd` process of a test cluster, with what it
// needs to start again on the same data dir and ports.
type etcdMember struct {
	name       string
	clientPort int
	args       []string
	proc       *proc
	starts     int
}

func (m *etcdMember) endpoint() string { return fmt.Sprintf("http://127.0.0.1:%d", m.clientPort) }

func (m *etcdMember) start(t *testing.T, dir string) {
	t.Helper()
	m.starts++
	logName := m.name
	if m.starts > 1 {
		logName = fmt.Sprintf("%s-start%d", m.name, m.starts)
	}
	m.proc = stacktest.StartProc(t, dir, logName, nil, m.args...)
}

func (m *etcdMember) running() bool {
	select {
	case <-m.proc.Done():
		return false
	default:
		return true
	}
}

// startEtcdCluster starts n `chatpipe etcd` processes forming one cluster
// (each waits for a quorum of the others) and waits until every member
// answers a linearizable read.
func startEtcdCluster(t *testing.T, dir string, n int) []*etcdMember {
	t.Helper()
	var ms []*etcdMember
	var cluster []string
	for i := 1; i <= n; i++ {
		m := &etcdMember{name: fmt.Sprintf("etcd%d", i), clientPort: stacktest.FreePort(t)}
		peer := stacktest.FreePort(t)
		cluster = append(cluster, fmt.Sprintf("%s=http://127.0.0.1:%d", m.name, peer))
		m.args = []string{"etcd", "--data-dir", filepath.Join(dir, m.name), "--name", m.name,
			"--client-port", strconv.Itoa(m.clientPort), "--peer-port", strconv.Itoa(peer), "--log-level", "warn"}
		ms = append(ms, m)
	}
	for _, m := range ms {
		m.args = append(m.args, "--initial-cluster", strings.Join(cluster, ","))
		m.start(t, dir)
	}
	start := time.Now()
	stacktest.WaitFor(t, 120*time.Second, "the etcd cluster to answer through every member", func() bool {
		for _, m := range ms {
			if !m.running() {
				t.Fatalf("%s exited; log:\n%s", m.name, stacktest.Tail(m.proc.Log))
			}
			if !etcdAnswers(m.endpoint()) {
				return false
			}
		}
		return true
	})
	t.Logf("etcd cluster of %d members up in %v", n, time.Since(start).Round(time.Millisecond))
	return ms
}

func quietEtcdClient(endpoints ...string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
}

// etcdAnswers reports whether a linearizable read through endpoint alone
// succeeds within 3 s (it needs the member to be part of a quorum).
func etcdAnswers(endpoint string) bool {
	cli, err := quietEtcdClient(endpoint)
	if err != nil {
		return false
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = cli.Get(ctx, lease.DefaultPrefix+"config")
	return err == nil
}

// etcdLeader returns the index of the running member that is the raft
// leader, or -1 when none says so.
func etcdLeader(ms []*etcdMember) int {
	for i, m := range ms {
		if !m.running() {
			continue
		}
		cli, err := quietEtcdClient(m.endpoint())
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		st, err := cli.Status(ctx, m.endpoint())
		cancel()
		cli.Close()
		if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
			return i
		}
	}
	return -1
}

// pickToStop returns the leader if one is found among the running members,
// else the first running one.
func pickToStop(ms []*etcdMember) (i int, leader bool) {
	if i := etcdLeader(ms); i >= 0 {
		return i, true
	}
	return slices.IndexFunc(ms, (*etcdMember).running), false
}

// ownerChanges lists the vshards whose owner row differs between two views.
func ownerChanges(a, b lease.View, vshards int) []string {
	var out []string
	for s := 0; s < vshards; s++ {
		ra, rb := a.Shards[s], b.Shards[s]
		if ra.Owner != rb.Owner {
			out = append(out, fmt.Sprintf("vshard %d: %s/gen %d/epoch %d → %s/gen %d/epoch %d",
				s, ra.Worker, ra.Gen, ra.Epoch, rb.Worker, rb.Gen, rb.Epoch))
		}
	}
	return out
}

func countLines(path, substr string) int {
	b, _ := os.ReadFile(path)
	return strings.Count(string(b), substr)
}

// TestEtcdQuorumLoss runs etcd as three member processes under load (fault
// test 5). Losing one member changes nothing. Losing two loses the quorum:
// nobody can be made owner and nobody takes a vshard over; the owners keep
// their writers (a failing renewal is not a lost lease) and serve until
// their lease's local deadline comes within its margin, then pause: past
// the lease TTL after the quorum was lost no send is accepted until it is
// back, since a worker cannot tell a lost quorum from being cut off alone
// (docs/architecture.md, rule 7). When the two come back, renewals succeed
// again, every vshard ends with exactly one live owner, and the committed
// log and Postgres hold every accepted send once, under its seq (no split
// brain).
func TestEtcdQuorumLoss(t *testing.T) {
	sharing(t, 75, 40)
	dir := t.TempDir()
	members := startEtcdCluster(t, dir, 3)
	var eps []string
	for _, m := range members {
		eps = append(eps, m.endpoint())
	}
	dev := startDev(t, dir, "--workers", "0", "--etcd", strings.Join(eps, ","))
	wa, wb := twoWorkersEnv(t, dev, []string{shortLease}, []string{shortLease})
	vshards := dev.EP.All()
	workers := map[string]*proc{"wa": wa, "wb": wb}
	metricsURL := map[string]string{"wa": stacktest.AdminURL(t, dev.EP, "wa"), "wb": stacktest.AdminURL(t, dev.EP, "wb")}
	sumMetric := func(name string) float64 {
		return stacktest.Metric(t, metricsURL["wa"], name) + stacktest.Metric(t, metricsURL["wb"], name)
	}
	workersAlive := func(when string) {
		t.Helper()
		for id, w := range workers {
			select {
			case <-w.Done():
				t.Fatalf("worker %s exited %s; log:\n%s", id, when, stacktest.Tail(w.Log))
			default:
			}
		}
	}

	load := stacktest.StartLoad(t, dev.Dev, 10, 20)
	load.WaitAbove(t, 60*time.Second, "load to flow", 200)
	before := stacktest.EtcdView(t, dev.EP)
	convsOn := map[string]int{}
	for c := 0; c < 20; c++ {
		convsOn[before.Shards[logrecord.VShard(fmt.Sprintf("lc%d", c), dev.EP.VShards)].Worker]++
	}
	t.Logf("before: wa owns %d, wb owns %d vshards; the 20 load conversations are on %v", stacktest.OwnedBy(before, vshards, "wa"), stacktest.OwnedBy(before, vshards, "wb"), convsOn)

	// (1) Lose one member of three: the other two are a quorum.
	i1, wasLeader := pickToStop(members)
	stopped := time.Now()
	members[i1].proc.Stop()
	t.Logf("(1) stopped %s (the leader: %v) with SIGTERM in %v", members[i1].name, wasLeader, time.Since(stopped).Round(time.Millisecond))
	n := load.Count()
	load.WaitAbove(t, 120*time.Second, "load to go on with one etcd member down", n+300)
	t.Logf("(1) 300 more sends accepted %v after the member stopped", time.Since(stopped).Round(time.Millisecond))
	lastRead := stacktest.EtcdView(t, dev.EP)
	if ch := ownerChanges(before, lastRead, vshards); len(ch) > 0 {
		t.Errorf("(1) owner rows changed after losing one etcd member of three:\n%s", strings.Join(ch, "\n"))
	}
	for id := range workers {
		if before.Workers[id].Gen != lastRead.Workers[id].Gen {
			t.Errorf("(1) worker %s re-registered (gen %d → %d) after losing one etcd member of three", id, before.Workers[id].Gen, lastRead.Workers[id].Gen)
		}
	}
	workersAlive("after losing one etcd member")

	// (2) Lose a second member: no quorum. lastRead is the last view of
	// the owner rows etcd can give until it is back.
	takeoversBefore := sumMetric("chatpipe_worker_takeovers_total")
	i2, wasLeader := pickToStop(members)
	survivor := slices.IndexFunc(members, func(m *etcdMember) bool { return m != members[i1] && m != members[i2] })
	members[i2].proc.Stop()
	outageStart := time.Now()
	t.Logf("(2) stopped %s (the leader: %v); %s is alone", members[i2].name, wasLeader, members[survivor].name)

	// No write can commit now. (It may still commit once the quorum is
	// back, if the survivor took it as leader: hence a key outside the
	// prefix.)
	if cli, err := quietEtcdClient(members[survivor].endpoint()); err == nil {
		pctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err := cli.Put(pctx, "/e2e-probe/quorum-loss", "written while two of three members are down")
		cancel()
		cli.Close()
		if err == nil {
			t.Errorf("(2) a write committed with two of three etcd members down: the test is not losing the quorum")
		} else {
			t.Logf("(2) a write through %s fails as it should: %v", members[survivor].name, err)
		}
	}

	// Keep the load going for longer than the lease TTL: the workers keep
	// their writers and nobody takes a shard over, but once their leases'
	// local deadlines come within the margin they refuse every request
	// (nothing written).
	n = load.Count()
	refusedBefore := sumMetric("chatpipe_worker_lease_refused_total")
	minOwned := float64(vshards)
	// (Each load user sends to its conversations in turn and waits for
	// each answer, so the users soon all wait on one worker: only that one
	// need have refused anything.)
	stacktest.WaitFor(t, 120*time.Second, "the workers to refuse requests for their overdue leases without a quorum", func() bool {
		workersAlive("while etcd had no quorum")
		if owned := sumMetric("chatpipe_worker_owned_shards"); owned < minOwned {
			minOwned = owned
		}
		return time.Since(outageStart) > shortTTL+2*time.Second && sumMetric("chatpipe_worker_lease_refused_total") > refusedBefore
	})
	outage := time.Since(outageStart)
	takeoversDuring := sumMetric("chatpipe_worker_takeovers_total") - takeoversBefore
	lastAccepted := outageStart
	for _, a := range load.Snapshot() {
		if a.AcceptedAt.After(lastAccepted) {
			lastAccepted = a.AcceptedAt
		}
	}
	t.Logf("(2) without quorum for %v: %d sends accepted, the last %v after the quorum was lost; %v requests refused for overdue leases; the workers kept writers for at least %v of %d vshards throughout; %v takeovers",
		outage.Round(time.Millisecond), load.Count()-n, lastAccepted.Sub(outageStart).Round(time.Millisecond),
		sumMetric("chatpipe_worker_lease_refused_total")-refusedBefore, minOwned, vshards, takeoversDuring)
	// When each worker's gate closed: its lease's local deadline less the
	// margin, which chatpipe_worker_lease_seconds_left counts down to. The
	// last renewal etcd answered may have been sent after outageStart (a
	// leader answers keep-alives until it notices it lost its quorum), so
	// the test reads the moment from the workers. The gate is closed now
	// (the refusals above), so the moment no longer moves. A command
	// taken before it may still be committing after it (the margin is for
	// that): what must not be accepted is an attempt sent after it.
	var gateClosed time.Time
	for id, url := range metricsURL {
		left := stacktest.Metric(t, url, "chatpipe_worker_lease_seconds_left")
		at := time.Now().Add(time.Duration(left * float64(time.Second))) // read after the scrape: the latest it can be
		if left >= 0 {
			t.Errorf("(2) %s's gate is open without a quorum: %.3fs left", id, left)
		}
		if at.After(gateClosed) {
			gateClosed = at
		}
	}
	t.Logf("(2) the workers' gates closed %v after the quorum was lost at the latest", gateClosed.Sub(outageStart).Round(time.Millisecond))
	late := 0
	for _, a := range load.Snapshot() {
		if a.AttemptAt.After(gateClosed) {
			late++
		}
	}
	if late > 0 {
		t.Errorf("(2) %d sends accepted whose attempt was sent after the workers' gates closed: a worker took a command past its lease's deadline less the margin", late)
	}
	if minOwned < float64(vshards) {
		t.Errorf("(2) without quorum the workers stopped their writers for some vshards: at one point only %v of %d", minOwned, vshards)
	}
	if takeoversDuring != 0 {
		t.Errorf("(2) %v takeovers while etcd had no quorum: nobody can have been made owner", takeoversDuring)
	}
	for id, w := range workers {
		t.Logf("(2) %s logged %d renewal failures", id, countLines(w.Log, "lease renewal failing"))
	}

	// (3) Bring both back on the same data dirs and ports.
	recovery := time.Now()
	members[i1].start(t, dir)
	members[i2].start(t, dir)
	// Stop the stack before the members just restarted (cleanups run last
	// registered first), so it never shuts down without a quorum.
	t.Cleanup(func() { wb.Stop(); wa.Stop(); dev.Stop() })
	stacktest.WaitFor(t, 120*time.Second, "etcd to answer through every member again", func() bool {
		for _, m := range members {
			if !m.running() {
				t.Fatalf("%s exited; log:\n%s", m.name, stacktest.Tail(m.proc.Log))
			}
			if !etcdAnswers(m.endpoint()) {
				return false
			}
		}
		return true
	})
	t.Logf("(3) etcd answers through all three members %v after the restart", time.Since(recovery).Round(time.Millisecond))
	if cli, err := quietEtcdClient(eps...); err == nil {
		gctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := cli.Get(gctx, "/e2e-probe/quorum-loss")
		cancel()
		cli.Close()
		if err == nil {
			t.Logf("(3) the write tried without quorum committed after all: %v (a timed-out etcd write has an unknown outcome)", len(resp.Kvs) > 0)
		}
	}
	n = load.Count()
	load.WaitAbove(t, 120*time.Second, "load to go on after the quorum is back", n+300)
	var after lease.View
	stacktest.WaitFor(t, 120*time.Second, "every vshard to have exactly one live owner, accepting", func() bool {
		workersAlive("after the quorum came back")
		after = stacktest.EtcdView(t, dev.EP)
		a, b := stacktest.OwnedBy(after, vshards, "wa"), stacktest.OwnedBy(after, vshards, "wb")
		return a+b == vshards && a-b <= 1 && b-a <= 1 &&
			stacktest.Metric(t, metricsURL["wa"], "chatpipe_worker_owned_shards") == float64(a) &&
			stacktest.Metric(t, metricsURL["wb"], "chatpipe_worker_owned_shards") == float64(b)
	})
	t.Logf("(3) settled %v after the restart: wa owns %d, wb owns %d vshards", time.Since(recovery).Round(time.Millisecond),
		stacktest.OwnedBy(after, vshards, "wa"), stacktest.OwnedBy(after, vshards, "wb"))

	// An owner row may change only by the normal takeover order, and only
	// because a worker's lease really expired once etcd was back (a
	// recovering cluster may expire leases): then that worker registered
	// again with a new gen.
	var lost []string
	for id := range workers {
		if after.Workers[id].Gen != lastRead.Workers[id].Gen {
			lost = append(lost, fmt.Sprintf("%s (gen %d → %d)", id, lastRead.Workers[id].Gen, after.Workers[id].Gen))
		}
	}
	changes := ownerChanges(lastRead, after, vshards)
	for s := 0; s < vshards; s++ {
		if e0, e1 := lastRead.Shards[s].Epoch, after.Shards[s].Epoch; e1 < e0 {
			t.Errorf("(3) vshard %d: epoch went back from %d to %d", s, e0, e1)
		}
	}
	for id, w := range workers {
		t.Logf("(3) %s: %d renewal failures, %d lost leases logged in all", id,
			countLines(w.Log, "lease renewal failing"), countLines(w.Log, "worker lease is gone"))
	}
	switch {
	case len(lost) == 0 && len(changes) > 0:
		t.Errorf("(3) owner rows changed though no worker lost its lease:\n%s", strings.Join(changes, "\n"))
	case len(lost) > 0:
		t.Logf("(3) leases expired after the quorum came back: %v; %d owner rows changed by takeover", lost, len(changes))
	default:
		t.Logf("(3) no lease expired and no owner row changed")
	}

	accepted := load.Finish()
	t.Logf("%d sends accepted in all", len(accepted))
	checkWorld(t, dev.EP, accepted)
}
