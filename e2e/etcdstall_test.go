package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/lease"
)

// stormBound is how soon after the stalled etcd leader resumes every vshard
// must have one live owner again, accepting (docs/reliability.md).
const stormBound = 30 * time.Second

// TestEtcdLeaderStall stops the raft leader of a three-member etcd cluster
// with SIGSTOP, under load, until the workers' leases have expired
// (docs/reliability.md). Both workers talk to that member only (as with a
// local etcd member per host), so neither can renew: each stops accepting a
// margin before its lease's deadline, the other two members elect a new
// leader, which lets every worker lease and coordinator session expire at
// once; nobody is left to reassign. On SIGCONT the workers learn that
// their leases are gone, register again, a coordinator is elected and
// every vshard is taken over at once: the takeover storm. It must be
// bounded — every vshard has one live owner, accepting, within stormBound
// of SIGCONT — no owner row's epoch may go back (the test watches the rows
// through the two other members), no vshard's log may go back to an older
// epoch, no send may be accepted from the TTL after the stall until the
// resume, and the world check finds nothing lost or doubled.
func TestEtcdLeaderStall(t *testing.T) {
	sharing(t, 75, 21)
	dir := t.TempDir()
	members := startEtcdCluster(t, dir, 3)
	li := etcdLeader(members)
	if li < 0 {
		t.Fatal("the etcd cluster has no leader")
	}
	leader := members[li]
	var eps, others []string
	for i, m := range members {
		eps = append(eps, m.endpoint())
		if i != li {
			others = append(others, m.endpoint())
		}
	}
	// Leases of shortTTL (the coordinator's session too), so that the stall
	// outlasts them sooner; dev's 64 vshards, so that the storm is as big
	// as a dev stack's.
	dev := startDev(t, dir, "--workers", "0", "--etcd", strings.Join(eps, ","),
		"--lease-ttl", strconv.Itoa(int(shortTTL/time.Second)), "--vshards", "64")
	vshards := dev.EP.All()
	epPath := filepath.Join(dev.Dir, "endpoints.json")
	workers := map[string]*proc{}
	for _, id := range []string{"wa", "wb"} {
		workers[id] = stacktest.StartProc(t, dev.Dir, id, []string{shortLease}, "worker", "--endpoints", epPath, "--etcd", leader.endpoint(), "--id", id, "--log-level", "warn")
	}
	stacktest.WaitFor(t, 120*time.Second, "wa and wb to share the vshards", func() bool {
		v := stacktest.EtcdView(t, dev.EP)
		a, b := stacktest.OwnedBy(v, vshards, "wa"), stacktest.OwnedBy(v, vshards, "wb")
		return a+b == vshards && a > 0 && b > 0
	})
	waitReady(t, dev, "wa")
	waitReady(t, dev, "wb")
	metricsURL := map[string]string{"wa": stacktest.AdminURL(t, dev.EP, "wa"), "wb": stacktest.AdminURL(t, dev.EP, "wb")}
	sumMetric := func(name string) float64 {
		return stacktest.Metric(t, metricsURL["wa"], name) + stacktest.Metric(t, metricsURL["wb"], name)
	}

	// Watch the owner rows through the members that keep running.
	cli, err := quietEtcdClient(others...)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := cli.Get(ctx, lease.DefaultPrefix+"shards/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	type rowChange struct {
		v     int
		owner lease.Owner
		at    time.Time
	}
	var mu sync.Mutex
	var changes []rowChange
	lastEpoch := map[int]int64{}
	for _, kv := range resp.Kvs {
		var o lease.Owner
		json.Unmarshal(kv.Value, &o)
		n, _ := strconv.Atoi(strings.TrimPrefix(string(kv.Key), lease.DefaultPrefix+"shards/"))
		lastEpoch[n] = o.Epoch
	}
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for wr := range cli.Watch(ctx, lease.DefaultPrefix+"shards/", clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
			mu.Lock()
			for _, ev := range wr.Events {
				var o lease.Owner
				json.Unmarshal(ev.Kv.Value, &o)
				n, _ := strconv.Atoi(strings.TrimPrefix(string(ev.Kv.Key), lease.DefaultPrefix+"shards/"))
				changes = append(changes, rowChange{v: n, owner: o, at: time.Now()})
			}
			mu.Unlock()
		}
	}()

	load := stacktest.StartLoad(t, dev.Dev, 10, 20)
	load.WaitAbove(t, 60*time.Second, "load to flow", 100)
	before := stacktest.EtcdView(t, dev.EP)

	leader.proc.Signal(syscall.SIGSTOP)
	stalled := time.Now()
	t.Logf("SIGSTOP to %s, the etcd leader; wa owns %d, wb owns %d vshards", leader.name, stacktest.OwnedBy(before, vshards, "wa"), stacktest.OwnedBy(before, vshards, "wb"))
	stacktest.WaitFor(t, 60*time.Second, "the new etcd leader to expire both workers' leases", func() bool {
		qctx, qcancel := context.WithTimeout(ctx, 2*time.Second)
		defer qcancel()
		r, err := cli.Get(qctx, lease.DefaultPrefix+"workers/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 0
	})
	expired := time.Now()
	refused := sumMetric("chatpipe_worker_lease_refused_total")
	leader.proc.Signal(syscall.SIGCONT)
	resumed := time.Now()
	t.Logf("both leases expired %v after the stall; SIGCONT; the workers had refused %v requests for their overdue leases",
		expired.Sub(stalled).Round(time.Millisecond), refused)
	if refused == 0 {
		t.Error("no request refused while the workers could not renew their leases")
	}

	var after lease.View
	stacktest.WaitFor(t, stormBound, fmt.Sprintf("every vshard to have one live owner, accepting, within %v of SIGCONT", stormBound), func() bool {
		for id, w := range workers {
			select {
			case <-w.Done():
				t.Fatalf("worker %s exited; log:\n%s", id, stacktest.Tail(w.Log))
			default:
			}
		}
		after = stacktest.EtcdView(t, dev.EP)
		a, b := stacktest.OwnedBy(after, vshards, "wa"), stacktest.OwnedBy(after, vshards, "wb")
		return a+b == vshards && stacktest.Metric(t, metricsURL["wa"], "chatpipe_worker_owned_shards") == float64(a) &&
			stacktest.Metric(t, metricsURL["wb"], "chatpipe_worker_owned_shards") == float64(b)
	})
	settled := time.Since(resumed)
	for id := range workers {
		if after.Workers[id].Gen <= before.Workers[id].Gen {
			t.Errorf("%s kept gen %d: its lease should have expired during the stall", id, after.Workers[id].Gen)
		}
	}
	n := load.Count()
	load.WaitAbove(t, 60*time.Second, "load to go on after the storm", n+100)
	accepted := load.Finish()
	cancel()
	<-watchDone

	late := 0
	for _, a := range accepted {
		if a.AcceptedAt.After(stalled.Add(shortTTL)) && a.AcceptedAt.Before(resumed) {
			late++
		}
	}
	if late > 0 {
		t.Errorf("%d sends accepted between the lease TTL after the stall and the resume: no worker could renew its lease then", late)
	}
	mu.Lock()
	moves := map[int]int{}
	for _, c := range changes {
		if c.owner.Epoch <= lastEpoch[c.v] {
			t.Errorf("vshard %d: owner row went from epoch %d to %d (%s gen %d)", c.v, lastEpoch[c.v], c.owner.Epoch, c.owner.Worker, c.owner.Gen)
		}
		lastEpoch[c.v] = c.owner.Epoch
		if c.at.After(resumed) {
			moves[c.v]++
		}
	}
	mu.Unlock()
	most := 0
	for _, m := range moves {
		most = max(most, m)
	}
	t.Logf("after SIGCONT every vshard had one live owner, accepting, within %v (bound %v): %d owner-row changes over %d vshards, at most %d per vshard; wa owns %d, wb owns %d",
		settled.Round(time.Millisecond), stormBound, len(changes), len(moves), most, stacktest.OwnedBy(after, vshards, "wa"), stacktest.OwnedBy(after, vshards, "wb"))
	if len(moves) != vshards {
		t.Errorf("%d of %d vshards changed owner after the resume: every one belonged to an expired lease", len(moves), vshards)
	}
	t.Logf("%d sends accepted in all", len(accepted))
	checkWorld(t, dev.EP, accepted) // I2 among it: no vshard's log goes back to an older epoch
}
