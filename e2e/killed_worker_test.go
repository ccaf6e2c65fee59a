// Workers killed with kill -9 while their transactions sit between produce and commit.

package e2e

import (
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/stacktest"
)

// TestKilledWriterBetweenProduceAndCommit kills a worker with kill -9 while
// its transactions sit between produce and commit.
func TestKilledWriterBetweenProduceAndCommit(t *testing.T) {
	sharing(t, 20, 19)
	dev := startDev(t, t.TempDir(), "--workers", "0")
	wa, _ := twoWorkers(t, dev, "CHATPIPE_FAULT_SLEEP_BEFORE_COMMIT=300ms", shortLease)
	underLoad(t, dev, func() {
		wa.Kill9()
		stacktest.WaitOwned(t, 120*time.Second, "wb to take over every vshard", dev.EP, dev.EP.All(), "wb", dev.EP.All())
	})
}

// TestKilledOnlyWorker kills the only worker with kill -9 while its
// transactions sit between produce and commit (docs/reliability.md). No
// other worker is alive: the open transactions hold their partitions' last
// stable offset until the broker aborts them (the 5 s transaction
// timeout), and nothing is accepted until a worker returns. Once one does,
// it takes every vshard over, clients' sends are accepted again, persist
// (the events and the read model) catches up within a bound, nothing
// accepted is lost and the world check holds.
func TestKilledOnlyWorker(t *testing.T) {
	sharing(t, 15, 24)
	dev := startDev(t, t.TempDir(), "--workers", "0")
	wa := dev.StartWorker(t, "wa", "CHATPIPE_FAULT_SLEEP_BEFORE_COMMIT=300ms", "CHATPIPE_TXN_TIMEOUT=5s", shortLease)
	stacktest.WaitOwned(t, 120*time.Second, "wa to own every vshard", dev.EP, dev.EP.All(), "wa", dev.EP.All())
	load := stacktest.StartLoad(t, dev.Dev, 10, 20)
	load.WaitAbove(t, 60*time.Second, "load to flow", 200)
	wa.Kill9()
	time.Sleep(time.Second) // answers already on their way may still arrive
	before := load.Count()
	time.Sleep(3 * time.Second) // no worker at all
	if n := load.Count(); n != before {
		t.Errorf("%d sends accepted while no worker was alive", n-before)
	}
	back := time.Now()
	dev.StartWorker(t, "wb")
	stacktest.WaitOwned(t, 120*time.Second, "wb to take over every vshard", dev.EP, dev.EP.All(), "wb", dev.EP.All())
	n := load.Count()
	load.WaitAbove(t, 120*time.Second, "load to go on after the worker returned", n+300)
	resumed := time.Since(back)
	accepted := load.Finish()
	// The bound: the lease of the killed worker runs out (4 s), wb takes
	// over (its markers fence and abort what is still open), and persist
	// reads on; with the load it sent meanwhile, well under 60 s.
	logRows := readLog(t, dev.EP)
	readDB(t, dev.EP, len(logRows))
	waitProjected(t, dev.EP, len(logRows))
	caughtUp := time.Since(back)
	t.Logf("%d sends accepted; after the worker returned: sends accepted again within %v, persist (events and read model) caught up with the log within %v", len(accepted), resumed.Round(time.Millisecond), caughtUp.Round(time.Millisecond))
	if caughtUp > 60*time.Second {
		t.Errorf("persist caught up %v after a worker returned, want within 60 s", caughtUp)
	}
	checkWorld(t, dev.EP, accepted)
}
