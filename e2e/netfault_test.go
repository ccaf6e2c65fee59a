package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/logrecord"
)

// Network faults between roles (docs/reliability.md): a toxiproxy
// proxy in this process sits on one link — gateway→worker, the roles'
// links to the broker, persist→Postgres — and, under load, the link gets
// latency, then a black hole (data dropped, connections left open) for
// longer than the timeout that guards it, then heals. After the heal the
// load must go on and the world check must hold.

const (
	netLatencyMS    = 100 // ± netJitterMS, each way
	netJitterMS     = 50
	netLatencyFor   = 4 * time.Second
	netRecoverBound = 60 * time.Second // from the heal to 300 more sends accepted
)

// withLatency adds latency to np for netLatencyFor under load, which must
// keep being accepted meanwhile.
func withLatency(t *testing.T, load *loadGen, np *netProxy) {
	t.Helper()
	n := load.Count()
	np.latency(netLatencyMS, netJitterMS)
	time.Sleep(netLatencyFor)
	got := load.Count() - n
	np.heal()
	t.Logf("%s: %d±%d ms latency each way for %v: %d sends accepted meanwhile", np.p.Name, netLatencyMS, netJitterMS, netLatencyFor, got)
	if got == 0 {
		t.Errorf("%s: no send accepted during %v of %d ms latency", np.p.Name, netLatencyFor, netLatencyMS)
	}
}

// blackholeThenHeal black-holes the given streams of np for hole under
// load, heals the link and waits for the load to go on (300 more sends
// within netRecoverBound) and for Postgres to hold at least as many
// messages as had been accepted at the heal. It logs the figures and
// returns when the black hole began and when it was healed.
func blackholeThenHeal(t *testing.T, dev *devProc, load *loadGen, np *netProxy, hole time.Duration, streams ...string) (began, healed time.Time) {
	t.Helper()
	return blackholeThenHealWith(t, dev, load, np, hole, nil, streams...)
}

// blackholeThenHealWith is blackholeThenHeal calling onHole, if not nil,
// as soon as the black hole is in place.
func blackholeThenHealWith(t *testing.T, dev *devProc, load *loadGen, np *netProxy, hole time.Duration, onHole func(), streams ...string) (began, healed time.Time) {
	t.Helper()
	what := np.p.Name + " black-holed (" + strings.Join(streams, "+") + ")"
	n := load.Count()
	np.blackhole(streams...)
	began = time.Now()
	if onHole != nil {
		onHole()
	}
	time.Sleep(hole)
	during := load.Count() - n
	np.heal()
	healed = time.Now()
	n = load.Count()
	load.WaitAbove(t, netRecoverBound, "a send accepted after the heal of "+what, n)
	first := time.Since(healed)
	load.WaitAbove(t, netRecoverBound, "300 sends accepted after the heal of "+what, n+300)
	resumed := time.Since(healed)
	stacktest.WaitFor(t, netRecoverBound, "Postgres to hold what was accepted before the heal of "+what, func() bool { return dbMessages(t, dev.EP) >= n })
	caughtUp := time.Since(healed)
	t.Logf("%s for %v: %d sends accepted meanwhile; after the heal: first send accepted within %v, 300 more within %v, Postgres held everything accepted before the heal within %v",
		what, hole, during, first.Round(time.Millisecond), resumed.Round(time.Millisecond), caughtUp.Round(time.Millisecond))
	return began, healed
}

// logsOnFailure logs the tails of the named processes' logs in dir if t
// failed.
func logsOnFailure(t *testing.T, dir string, names ...string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, n := range names {
			t.Logf("%s.log:\n%s", n, stacktest.Tail(filepath.Join(dir, n+".log")))
		}
	})
}

// dbMessages counts the messages in Postgres.
func dbMessages(t *testing.T, ep endpoints) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, ep.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM events WHERE kind = $1`, logrecord.KindMessage).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// gatewayWorkerLink starts a stack whose one worker is reached by the
// gateway only through a proxy: the worker advertises the proxy's address.
// The gateway pings each link every 500 ms and closes one on which nothing
// was read for 3 s (--wire-read-timeout; 15 s by default).
func gatewayWorkerLink(t *testing.T) (*devProc, *netProxy) {
	listen := stacktest.FreePort(t)
	np := startNetProxy(t, "gateway→worker", "127.0.0.1:"+strconv.Itoa(listen))
	dev := startDev(t, t.TempDir(), "--workers", "0", "--wire-ping", "500ms", "--wire-read-timeout", "3s", "--call-timeout", "10s")
	stacktest.StartProc(t, dev.Dir, "wa", nil, "worker", "--endpoints", filepath.Join(dev.Dir, "endpoints.json"), "--id", "wa", "--log-level", "warn",
		"--listen", "127.0.0.1:"+strconv.Itoa(listen), "--advertise", np.addr())
	logsOnFailure(t, dev.Dir, "dev", "wa")
	stacktest.WaitOwned(t, 120*time.Second, "wa to own every vshard", dev.EP, dev.EP.All(), "wa", dev.EP.All())
	return dev, np
}

// TestNetworkFaultsGatewayWorker: latency, then a black hole twice the
// gateway's read timeout, on the only gateway→worker link.
func TestNetworkFaultsGatewayWorker(t *testing.T) {
	sharing(t, 15, 18)
	dev, np := gatewayWorkerLink(t)
	load := stacktest.StartLoad(t, dev.Dev, 10, 20)
	load.WaitAbove(t, 60*time.Second, "load to flow", 200)
	withLatency(t, load, np)
	blackholeThenHeal(t, dev, load, np, 6*time.Second, "upstream", "downstream")
	accepted := load.Finish()
	t.Logf("%d sends accepted", len(accepted))
	checkWorld(t, dev.EP, accepted)
}

// TestNetworkFaultsGatewayWorkerHalfOpen: the gateway→worker link goes
// half-open, one direction at a time, for twice the read timeout. With
// the answers stopped the worker still commits what it is sent, and the
// answers are lost: the clients' retries (same client_message_id) must be
// told the seq already committed and nothing may be doubled.
func TestNetworkFaultsGatewayWorkerHalfOpen(t *testing.T) {
	sharing(t, 15, 21)
	dev, np := gatewayWorkerLink(t)
	load := stacktest.StartLoad(t, dev.Dev, 10, 20)
	load.WaitAbove(t, 60*time.Second, "load to flow", 200)
	// The load's ten senders each wait for their answer, so whether one of
	// them has a send in flight to be committed after the answers stop is
	// a matter of schedule (1 to 9 of them in past runs, once none). Three
	// probes sent as the answers stop make sure some are: the link stays
	// up until the gateway's read timeout (3 s), so their requests reach
	// the worker, which commits them and answers into the black hole; the
	// probes learn their seqs on a retry after the heal.
	probers := make([]*client, 3)
	for i := range probers {
		probers[i] = dev.Dial(t, fmt.Sprintf("hp%d", i))
		probers[i].Must(map[string]any{"op": "create", "conversation_id": fmt.Sprintf("hpc%d", i), "members": []string{"hpx"}})
	}
	var probes sync.WaitGroup
	probed := make([]acceptedMsg, len(probers))
	sendProbes := func() {
		for i, p := range probers {
			probes.Add(1)
			go func() {
				defer probes.Done()
				a, err := p.SendAccepted(fmt.Sprintf("hpc%d", i), fmt.Sprintf("hp%d-1", i), "probe")
				if err != nil {
					t.Errorf("probe: %v", err)
					return
				}
				probed[i] = a
			}()
		}
	}
	began, healed := blackholeThenHealWith(t, dev, load, np, 6*time.Second, sendProbes, "downstream") // answers and pongs stop
	probes.Wait()
	blackholeThenHeal(t, dev, load, np, 6*time.Second, "upstream") // requests and pings stop
	accepted := load.Finish()
	for _, a := range probed {
		if a.MessageID != "" {
			accepted = append(accepted, a)
		}
	}
	// Sends committed while the answers were stopped: their answers were
	// dropped (the heal closes those connections), so the clients were told
	// only on a retry.
	byID := map[string]acceptedMsg{}
	for _, a := range accepted {
		byID[a.MessageID] = a
	}
	retried, probesRetried := 0, 0
	eachLogEvent(t, dev.EP, func(r *kgo.Record, e *logrecord.Event) {
		if a, ok := byID[e.MessageID]; ok && e.Kind == logrecord.KindMessage && r.Timestamp.After(began) && r.Timestamp.Before(healed) && a.AcceptedAt.After(healed) {
			retried++
			if strings.HasPrefix(a.Conv, "hpc") {
				probesRetried++
			}
		}
	})
	t.Logf("%d sends accepted; %d were committed while the answers were stopped and accepted on a retry (%d of them probes)", len(accepted), retried, probesRetried)
	if retried == 0 {
		t.Error("no send was committed while the answers were stopped: the half-open case lost no answer")
	}
	checkWorld(t, dev.EP, accepted)
}

// advertisedListener is a broker's listener that tells clients to dial
// another address (the proxy's) in the metadata it serves.
type advertisedListener struct {
	net.Listener
	addr net.Addr
}

func (l advertisedListener) Addr() net.Addr { return l.addr }

// TestNetworkFaultsBroker: latency, then a black hole longer than the
// worker's commit timeout (10 s, the shard writers' per-transaction bound)
// and persist's group session timeout (10 s), on the links to the broker.
// The broker runs in this process and advertises the proxy, so every Kafka
// connection — the worker's producers, persist's consumer — goes through
// it (Kafka clients dial the address in the metadata, not the bootstrap
// one).
func TestNetworkFaultsBroker(t *testing.T) {
	sharing(t, 15, 21)
	dir := t.TempDir()
	port := stacktest.FreePort(t)
	np := startNetProxy(t, "roles→broker", "127.0.0.1:"+strconv.Itoa(port))
	proxyAddr, err := net.ResolveTCPAddr("tcp", np.addr())
	if err != nil {
		t.Fatal(err)
	}
	k, err := devstack.StartKafka(filepath.Join(dir, "broker"), port, slog.New(slog.NewTextHandler(io.Discard, nil)),
		kfake.ListenFn(func(network, address string) (net.Listener, error) {
			ln, err := net.Listen(network, address)
			if err != nil {
				return nil, err
			}
			return advertisedListener{ln, proxyAddr}, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// dev's 8 hashed partitions and its 2 dedicated vshards' own
	if err := devstack.EnsureTopic(ctx, []string{np.addr()}, logrecord.DefaultTopic, 8+2); err != nil {
		t.Fatal(err)
	}
	dev := startDev(t, dir, "--kafka", np.addr())
	logsOnFailure(t, dir, "dev")
	load := stacktest.StartLoad(t, dev.Dev, 10, 20)
	load.WaitAbove(t, 60*time.Second, "load to flow", 200)
	withLatency(t, load, np)
	blackholeThenHeal(t, dev, load, np, 12*time.Second, "upstream", "downstream")
	accepted := load.Finish()
	t.Logf("%d sends accepted", len(accepted))
	checkWorld(t, dev.EP, accepted)
}

// TestNetworkFaultsPersistPostgres: latency, then a black hole, on the link
// from persist (its own process) to Postgres. Accepting does not wait for
// persist, so the load goes on throughout; Postgres must catch up after
// the heal, with every event once. Persist has no statement timeout: it
// waits on the black-holed connection until the heal closes it, then
// retries the batch. The backlog then reaches the gateway's delivery feed
// at once and overflows the devices' send buffers (1024 frames), so the
// gateway closes them ("reconnect and sync"): this load reconnects.
func TestNetworkFaultsPersistPostgres(t *testing.T) {
	sharing(t, 60, 21)
	dev := startDev(t, t.TempDir(), "--persist=false")
	upstream := pgHostPort(t, dev.EP.Postgres)
	np := startNetProxy(t, "persist→postgres", upstream)
	stacktest.StartProc(t, dev.Dir, "persist", nil, "persist", "--endpoints", filepath.Join(dev.Dir, "endpoints.json"),
		"--database-url", strings.Replace(dev.EP.Postgres, upstream, np.addr(), 1), "--log-level", "warn")
	logsOnFailure(t, dev.Dir, "dev", "persist")
	load, reconnects := startReconnectingLoad(t, dev, 10, 20)
	load.WaitAbove(t, 60*time.Second, "load to flow", 200)
	stacktest.WaitFor(t, 60*time.Second, "persist to write", func() bool { return dbMessages(t, dev.EP) > 0 })
	withLatency(t, load, np)
	blackholeThenHeal(t, dev, load, np, 10*time.Second, "upstream", "downstream")
	accepted := load.Finish()
	t.Logf("%d sends accepted; devices reconnected %d times (closed as slow readers when the backlog was delivered)", len(accepted), reconnects.Load())
	checkWorld(t, dev.EP, accepted)
}
