package e2e

import (
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/devstack"
)

// underLoad starts load on dev, runs fault after some sends were accepted,
// keeps the load going until more were accepted after the fault, and
// checks the world.
func underLoad(t *testing.T, dev *devProc, fault func()) {
	t.Helper()
	load := startLoad(t, dev, 10, 20)
	load.waitAbove(t, 60*time.Second, "load to flow", 200)
	fault()
	n := load.count()
	load.waitAbove(t, 120*time.Second, "load to go on after the fault", n+300)
	accepted := load.finish()
	t.Logf("%d sends accepted", len(accepted))
	checkWorld(t, dev.ep, accepted)
}

// twoWorkers starts worker wa (with waEnv), waits until it owns every
// vshard, then starts wb and waits until they share them and both are
// ready.
func twoWorkers(t *testing.T, dev *devProc, waEnv ...string) (*proc, *proc) {
	t.Helper()
	return twoWorkersEnv(t, dev, waEnv, nil)
}

// twoWorkersEnv is twoWorkers with an environment for wb as well.
func twoWorkersEnv(t *testing.T, dev *devProc, waEnv, wbEnv []string) (*proc, *proc) {
	t.Helper()
	wa := dev.startWorker(t, "wa", waEnv...)
	waitOwned(t, 120*time.Second, "wa to own every vshard", dev.ep, dev.ep.all(), "wa", dev.ep.all())
	wb := dev.startWorker(t, "wb", wbEnv...)
	waitOwned(t, 120*time.Second, "wb to get its half", dev.ep, dev.ep.all(), "wb", dev.ep.all()/2)
	for _, id := range []string{"wa", "wb"} { // /readyz: registered and accepting for every vshard assigned
		url := strings.TrimSuffix(adminURL(t, dev.ep, id), "/metrics") + "/readyz"
		waitFor(t, 120*time.Second, id+" to be ready", func() bool {
			resp, err := http.Get(url)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
	return wa, wb
}

// TestKilledWriterBetweenProduceAndCommit kills a worker with kill -9 while
// its transactions sit between produce and commit (fault test 2).
func TestKilledWriterBetweenProduceAndCommit(t *testing.T) {
	dev := startDev(t, t.TempDir(), "--workers", "0")
	wa, _ := twoWorkers(t, dev, "CHATPIPE_FAULT_SLEEP_BEFORE_COMMIT=300ms", shortLease)
	underLoad(t, dev, func() {
		wa.kill9()
		waitOwned(t, 120*time.Second, "wb to take over every vshard", dev.ep, dev.ep.all(), "wb", dev.ep.all())
	})
}

// TestKilledPersistResumes kills persist with kill -9 in the middle of a
// Postgres transaction; a new persist resumes from the offsets in Postgres
// and every event ends up there exactly once (fault test 3).
func TestKilledPersistResumes(t *testing.T) {
	parallel(t)
	dev := startDev(t, t.TempDir(), "--persist=false")
	ep := filepath.Join(dev.dir, "endpoints.json")
	p1 := startProc(t, dev.dir, "persist1", []string{"CHATPIPE_FAULT_PERSIST_SLEEP_BEFORE_COMMIT=300ms"}, "persist", "--endpoints", ep, "--log-level", "warn", "--admin", "127.0.0.1:0")
	underLoad(t, dev, func() {
		time.Sleep(time.Second)
		p1.kill9()
		startProc(t, dev.dir, "persist2", nil, "persist", "--endpoints", ep, "--log-level", "warn")
	})
}

// TestKafkaRestartUnderLoad stops the broker gracefully and starts it again
// on the same data dir and port while clients send (fault test 4).
func TestKafkaRestartUnderLoad(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	port := freePort(t)
	kdir := filepath.Join(dir, "broker")
	args := []string{"kafka", "--data-dir", kdir, "--port", strconv.Itoa(port), "--partitions", "10", "--log-level", "warn"} // dev's 8 hashed partitions and its 2 dedicated vshards' own
	k := startProc(t, dir, "kafka1", nil, args...)
	waitFor(t, 30*time.Second, "the broker to listen", func() bool { return dialable(port) })
	dev := startDev(t, dir, "--kafka", fmt.Sprintf("127.0.0.1:%d", port))
	underLoad(t, dev, func() {
		k.stop()
		k = startProc(t, dir, "kafka2", nil, args...)
		waitFor(t, 30*time.Second, "the broker to listen again", func() bool { return dialable(port) })
	})
}

// TestAddWorkerUnderLoad adds a third worker while clients send: shards move
// to it by hand-off and no message is lost (fault test 6). Then the worker
// shuts down gracefully: it revokes its lease on the way out, so its
// vshards move without waiting for the TTL.
func TestAddWorkerUnderLoad(t *testing.T) {
	dev := startDev(t, t.TempDir(), "--workers", "0")
	twoWorkers(t, dev)
	var wc *proc
	underLoad(t, dev, func() {
		wc = dev.startWorker(t, "wc")
		waitFor(t, 120*time.Second, "wc to get a third", func() bool {
			return ownedBy(etcdView(t, dev.ep), dev.ep.all(), "wc") >= dev.ep.all()/3
		})
	})
	wc.stop()
	if _, ok := etcdView(t, dev.ep).Workers["wc"]; ok {
		t.Error("wc exited gracefully but its lease is still alive: it did not hand its shards off")
	}
	waitFor(t, 30*time.Second, "wc's vshards to move", func() bool {
		v := etcdView(t, dev.ep)
		return ownedBy(v, dev.ep.all(), "wa")+ownedBy(v, dev.ep.all(), "wb") == dev.ep.all()
	})
}

// freePort returns a port on 127.0.0.1 for a process a test starts (a
// worker's --listen, an etcd member, an admin address): devstack.FreePort's,
// below the kernel's ephemeral range.
func freePort(t *testing.T) int {
	t.Helper()
	p, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func dialable(port int) bool {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// TestKilledOnlyWorker kills the only worker with kill -9 while its
// transactions sit between produce and commit (docs/reliability.md). No
// other worker is alive: the open transactions hold their partitions' last
// stable offset until the broker aborts them (the 5 s transaction
// timeout), and nothing is accepted until a worker returns. Once one does,
// it takes every vshard over, clients' sends are accepted again, persist and
// the projection catch up within a bound, nothing accepted is lost and the
// world check holds.
func TestKilledOnlyWorker(t *testing.T) {
	parallel(t)
	dev := startDev(t, t.TempDir(), "--workers", "0")
	wa := dev.startWorker(t, "wa", "CHATPIPE_FAULT_SLEEP_BEFORE_COMMIT=300ms", "CHATPIPE_TXN_TIMEOUT=5s", shortLease)
	waitOwned(t, 120*time.Second, "wa to own every vshard", dev.ep, dev.ep.all(), "wa", dev.ep.all())
	load := startLoad(t, dev, 10, 20)
	load.waitAbove(t, 60*time.Second, "load to flow", 200)
	wa.kill9()
	time.Sleep(time.Second) // answers already on their way may still arrive
	before := load.count()
	time.Sleep(3 * time.Second) // no worker at all
	if n := load.count(); n != before {
		t.Errorf("%d sends accepted while no worker was alive", n-before)
	}
	back := time.Now()
	dev.startWorker(t, "wb")
	waitOwned(t, 120*time.Second, "wb to take over every vshard", dev.ep, dev.ep.all(), "wb", dev.ep.all())
	n := load.count()
	load.waitAbove(t, 120*time.Second, "load to go on after the worker returned", n+300)
	resumed := time.Since(back)
	accepted := load.finish()
	// The bound: the lease of the killed worker runs out (4 s), wb takes
	// over (its markers fence and abort what is still open), and the
	// consumers read on; with the load it sent meanwhile, well under 60 s.
	logRows := readLog(t, dev.ep)
	readDB(t, dev.ep, len(logRows))
	waitProjected(t, dev.ep, len(logRows))
	caughtUp := time.Since(back)
	t.Logf("%d sends accepted; after the worker returned: sends accepted again within %v, persist and the projection caught up with the log within %v", len(accepted), resumed.Round(time.Millisecond), caughtUp.Round(time.Millisecond))
	if caughtUp > 60*time.Second {
		t.Errorf("persist and the projection caught up %v after a worker returned, want within 60 s", caughtUp)
	}
	checkWorld(t, dev.ep, accepted)
}
