package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/logrecord"
)

// logEpochs is what the committed log says about who wrote what: each
// event by conversation and seq, and each takeover marker by vshard and
// epoch.
type logEpochs struct {
	events  map[string]*logrecord.Event // "conv/seq"
	markers map[[2]int64]*logrecord.Event
}

// marker returns the first marker of vshard v with an epoch above epoch.
func (le *logEpochs) markerAfter(v int, epoch int64) *logrecord.Event {
	var first *logrecord.Event
	for k, m := range le.markers {
		if int(k[0]) == v && k[1] > epoch && (first == nil || k[1] < first.Epoch) {
			first = m
		}
	}
	return first
}

// readLogEpochs reads the committed log and checks I2 on it: per vshard,
// in the order of its partition, no record (event or marker) has an older
// epoch than one before it — a writer that lost its vshard committed
// nothing after the new owner's marker.
func readLogEpochs(t *testing.T, ep endpoints) *logEpochs {
	t.Helper()
	le := &logEpochs{events: map[string]*logrecord.Event{}, markers: map[[2]int64]*logrecord.Event{}}
	last := map[int]*logrecord.Event{}
	regressions := 0
	eachLogEvent(t, ep, func(r *kgo.Record, e *logrecord.Event) {
		if prev := last[e.VShard]; prev != nil && e.Epoch < prev.Epoch {
			if regressions++; regressions <= 10 {
				t.Errorf("vshard %d: %s of epoch %d (%s) at offset %d/%d after a %s of epoch %d (%s)",
					e.VShard, e.Kind, e.Epoch, e.Worker, r.Partition, r.Offset, prev.Kind, prev.Epoch, prev.Worker)
			}
		}
		if prev := last[e.VShard]; prev == nil || e.Epoch >= prev.Epoch {
			last[e.VShard] = e
		}
		if e.Kind == logrecord.KindTakeover {
			if _, ok := le.markers[[2]int64{int64(e.VShard), e.Epoch}]; !ok {
				le.markers[[2]int64{int64(e.VShard), e.Epoch}] = e
			}
			return
		}
		le.events[fmt.Sprintf("%s/%d", e.ConversationID, e.Seq)] = e
	})
	if regressions > 0 {
		t.Errorf("%d records of a vshard's log went back to an older epoch", regressions)
	}
	return le
}

// waitReady waits for a worker's /readyz to answer 200.
func waitReady(t *testing.T, dev *devProc, id string) {
	t.Helper()
	url := strings.TrimSuffix(stacktest.AdminURL(t, dev.EP, id), "/metrics") + "/readyz"
	stacktest.WaitFor(t, 120*time.Second, id+" to be ready", func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// TestStarvedKeepAlive black-holes one worker's link to etcd while its
// process runs and the other worker, the gateway and the test still reach
// etcd (docs/reliability.md). wa's renewals get no answer, so its lease's
// local deadline (the last answered renewal's send time plus the TTL) comes
// closer; a margin before it wa stops accepting, while its lease is still
// alive, and well before wb's takeover markers: every send wa accepted
// under its old lease was answered before the earliest moment etcd could
// expire that lease (measured by the test from etcd's own TTL), and before
// wb's marker of that vshard. Without the gate wa would accept until wb's
// marker fenced it. Once the link heals, wa learns that its lease is gone
// and registers again with a new gen; the log's epochs never go back and
// the world check finds nothing lost or doubled.
func TestStarvedKeepAlive(t *testing.T) {
	alone(t, 17)
	dev := startDev(t, t.TempDir(), "--workers", "0")
	etcdHost := strings.TrimPrefix(strings.TrimPrefix(dev.EP.Etcd[0], "http://"), "https://")
	link := startNetProxy(t, "wa-etcd", etcdHost)
	wa := stacktest.StartProc(t, dev.Dir, "wa", nil, "worker", "--endpoints", filepath.Join(dev.Dir, "endpoints.json"),
		"--etcd", "http://"+link.addr(), "--id", "wa", "--log-level", "warn")
	vshards := dev.EP.All()
	stacktest.WaitOwned(t, 120*time.Second, "wa to own every vshard", dev.EP, vshards, "wa", vshards)
	dev.StartWorker(t, "wb")
	stacktest.WaitOwned(t, 120*time.Second, "wb to get its half", dev.EP, vshards, "wb", vshards/2)
	waitReady(t, dev, "wa")
	waitReady(t, dev, "wb")
	waMetrics, wbMetrics := stacktest.AdminURL(t, dev.EP, "wa"), stacktest.AdminURL(t, dev.EP, "wb")

	cli, err := quietEtcdClient(dev.EP.Etcd...)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()

	load := stacktest.StartLoad(t, dev.Dev, 10, 20)
	load.WaitAbove(t, 60*time.Second, "load to flow", 200)

	resp, err := cli.Get(ctx, lease.DefaultPrefix+"workers/wa")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("read workers/wa: %v %v", resp, err)
	}
	leaseID := clientv3.LeaseID(resp.Kvs[0].Lease)
	atHole := stacktest.EtcdView(t, dev.EP)
	oldGen := atHole.Workers["wa"].Gen
	oldEpoch := map[int]int64{}
	for v := 0; v < vshards; v++ {
		if row, _, ok := atHole.Live(v); ok && row.Worker == "wa" {
			oldEpoch[v] = row.Epoch
		}
	}
	link.blackhole("upstream", "downstream")
	hole := time.Now()
	t.Logf("black-holed wa's etcd link; wa owns %d vshards", len(oldEpoch))

	// The earliest moment etcd may expire wa's lease, from etcd's own
	// answers: the remaining TTL (whole seconds, rounded down) counted from
	// when each question was sent.
	var expiresNoEarlier time.Time
	var expired time.Time
	stacktest.WaitFor(t, 60*time.Second, "wa's lease to expire", func() bool {
		sent := time.Now()
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ttl, err := cli.TimeToLive(qctx, leaseID)
		cancel()
		if err != nil {
			return false
		}
		if ttl.TTL < 0 { // (0: less than a second left)
			expired = time.Now()
			return true
		}
		if e := sent.Add(time.Duration(ttl.TTL) * time.Second); e.After(expiresNoEarlier) {
			expiresNoEarlier = e
		}
		return false
	})
	t.Logf("wa's lease expired %v after the black hole (etcd's TTL said no earlier than %v)",
		expired.Sub(hole).Round(time.Millisecond), expiresNoEarlier.Sub(hole).Round(time.Millisecond))
	stacktest.WaitFor(t, 60*time.Second, "wb to take over every vshard, accepting", func() bool {
		return stacktest.OwnedBy(stacktest.EtcdView(t, dev.EP), vshards, "wb") == vshards && stacktest.Metric(t, wbMetrics, "chatpipe_worker_owned_shards") == float64(vshards)
	})
	tookOver := time.Now()
	refused := stacktest.Metric(t, waMetrics, "chatpipe_worker_lease_refused_total")
	t.Logf("wb accepts for every vshard %v after the black hole; wa refused %v requests for its overdue lease", tookOver.Sub(hole).Round(time.Millisecond), refused)
	if refused == 0 {
		t.Error("wa refused no request while its lease renewal was overdue: the gateway kept routing to it, so it should have")
	}
	select {
	case <-wa.Done():
		t.Fatalf("wa exited; log:\n%s", stacktest.Tail(wa.Log))
	default:
	}

	link.heal()
	healed := time.Now()
	stacktest.WaitFor(t, 60*time.Second, "wa to register again with a new gen", func() bool {
		w, ok := stacktest.EtcdView(t, dev.EP).Workers["wa"]
		return ok && w.Gen > oldGen
	})
	t.Logf("wa registered again %v after the heal", time.Since(healed).Round(time.Millisecond))
	n := load.Count()
	load.WaitAbove(t, 60*time.Second, "load to go on after the heal", n+300)
	accepted := load.Finish()

	le := readLogEpochs(t, dev.EP)
	var lastOld time.Time
	lastOldOf := map[int]time.Time{}
	oldAccepted := 0
	for _, a := range accepted {
		e := le.events[fmt.Sprintf("%s/%d", a.Conv, a.Seq)]
		if e == nil {
			continue // the world check reports it
		}
		if ep, ok := oldEpoch[e.VShard]; !ok || e.Epoch != ep { // (events name their epoch, markers the worker too)
			continue
		}
		oldAccepted++
		if a.AcceptedAt.After(lastOldOf[e.VShard]) {
			lastOldOf[e.VShard] = a.AcceptedAt
		}
		if a.AcceptedAt.After(lastOld) {
			lastOld = a.AcceptedAt
		}
	}
	if oldAccepted == 0 {
		t.Fatal("no send accepted by wa under its old lease: the load did not reach it")
	}
	t.Logf("%d sends accepted by wa under its old lease; the last %v after the black hole, %v before the earliest expiry etcd allowed",
		oldAccepted, lastOld.Sub(hole).Round(time.Millisecond), expiresNoEarlier.Sub(lastOld).Round(time.Millisecond))
	if !lastOld.Before(expiresNoEarlier) {
		t.Errorf("wa answered accepted %v after the black hole, not before its lease could expire (%v): it did not stop accepting in time",
			lastOld.Sub(hole).Round(time.Millisecond), expiresNoEarlier.Sub(hole).Round(time.Millisecond))
	}
	for v, ep := range oldEpoch {
		m := le.markerAfter(v, ep)
		if m == nil {
			t.Errorf("vshard %d: no takeover marker after wa's epoch %d", v, ep)
			continue
		}
		if last := lastOldOf[v]; !last.IsZero() && !last.Before(m.CreatedAt) {
			t.Errorf("vshard %d: wa's last accepted at %v is not before %s's takeover marker (epoch %d) at %v",
				v, last.Format(time.StampMicro), m.Worker, m.Epoch, m.CreatedAt.Format(time.StampMicro))
		}
	}
	t.Logf("%d sends accepted in all", len(accepted))
	checkWorld(t, dev.EP, accepted)
}
