// A writer paused past its lease is fenced (plain and secured stacks); the reversed takeover order is caught.

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/clustersec"
	"github.com/chatpipe/chatpipe/internal/stacktest"
)

// pausedWriter runs the paused-writer scenario of docs/operations.md's
// "Fault tests" (TestPausedWriterIsFenced, TestReversedTakeoverOrderIsCaught):
// worker wa is paused (as by a long GC pause) while its transactions are in
// flight, for longer than its lease; its shards move to wb; then wa wakes up
// and tries to finish what it was doing. It returns what the clients were
// told and wa's fenced-write count.
func pausedWriter(t *testing.T, wbEnv ...string) (*devProc, []acceptedMsg, float64) {
	dev := startDev(t, t.TempDir(), "--workers", "0")
	accepted, fenced := pausedWriterOn(t, dev, func(id string, env ...string) *proc { return dev.StartWorker(t, id, env...) }, wbEnv...)
	return dev, accepted, fenced
}

// pausedWriterOn runs the paused-writer scenario on dev, a stack without
// workers, with workers started by startWorker (the secured stack's have
// its credentials: TestSecuredPausedWriterIsFenced).
func pausedWriterOn(t *testing.T, dev *devProc, startWorker func(id string, env ...string) *proc, wbEnv ...string) ([]acceptedMsg, float64) {
	// wa holds each transaction open a little between produce and commit,
	// so the pause lands in that window.
	// Its transaction timeout outlasts the pause, so only the new owner's
	// fencing — not Kafka's timeout — can stop its late commits.
	mark := filepath.Join(dev.Dir, "wa-in-commit")
	wa := startWorker("wa", "CHATPIPE_FAULT_SLEEP_BEFORE_COMMIT=300ms", "CHATPIPE_FAULT_COMMIT_MARK="+mark, "CHATPIPE_TXN_TIMEOUT=60s", shortLease)
	stacktest.WaitOwned(t, 120*time.Second, "wa to own every vshard", dev.EP, dev.EP.All(), "wa", dev.EP.All())
	startWorker("wb", wbEnv...)
	stacktest.WaitOwned(t, 120*time.Second, "wb to get its half", dev.EP, dev.EP.All(), "wb", dev.EP.All()/2)
	waMetrics := stacktest.AdminURL(t, dev.EP, "wa")

	load := stacktest.StartLoad(t, dev.Dev, 10, 20)
	load.WaitAbove(t, 30*time.Second, "load to flow", 200)
	// pause wa while one of its transactions sits between produce and commit
	os.Remove(mark)
	stacktest.WaitFor(t, 30*time.Second, "wa to enter a commit", func() bool { _, err := os.Stat(mark); return err == nil })
	wa.Signal(syscall.SIGSTOP)
	paused := time.Now()
	stacktest.WaitOwned(t, 120*time.Second, "wb to take over every vshard", dev.EP, dev.EP.All(), "wb", dev.EP.All())
	t.Logf("shards moved %v after the pause", time.Since(paused).Round(time.Millisecond))
	// Let wb finish taking over (and, in the broken order, sit in its
	// accept delay) before wa wakes up.
	time.Sleep(2500 * time.Millisecond)
	wa.Signal(syscall.SIGCONT)
	n := load.Count()
	load.WaitAbove(t, 60*time.Second, "load to go on after the pause", n+300)
	accepted := load.Finish()
	time.Sleep(500 * time.Millisecond)
	return accepted, stacktest.Metric(t, waMetrics, "chatpipe_worker_fenced_writes_total")
}

// TestPausedWriterIsFenced: a writer paused past its lease cannot make
// anything visible when it wakes up; Kafka fences it.
func TestPausedWriterIsFenced(t *testing.T) {
	sharing(t, 15, 28)
	dev, accepted, fenced := pausedWriter(t)
	checkPausedWriterFenced(t, dev, accepted, fenced)
}

// checkPausedWriterFenced: the paused writer had writes fenced, and the
// world holds every accepted send once.
func checkPausedWriterFenced(t *testing.T, dev *devProc, accepted []acceptedMsg, fenced float64) {
	t.Helper()
	t.Logf("%d sends accepted; the paused writer had %v writes fenced", len(accepted), fenced)
	if fenced == 0 {
		t.Error("no write of the paused writer was fenced: fencing is not wired (or the pause missed every transaction)")
	}
	checkWorld(t, dev.EP, accepted)
}

// TestReversedTakeoverOrderIsCaught builds the same scenario with the new
// owner accepting before it fences the old one: the old
// writer's late commit and the new writer's then reuse seqs, and the checks
// must see it. This shows the checks can fail.
func TestReversedTakeoverOrderIsCaught(t *testing.T) {
	sharing(t, 15, 43)
	dev, _, _ := pausedWriter(t, "CHATPIPE_FAULT_ACCEPT_BEFORE_MARKER=1", "CHATPIPE_FAULT_ACCEPT_DELAY=6s")
	rows := readLog(t, dev.EP)
	seen := map[string]string{}
	dups := 0
	for _, r := range rows {
		k := fmt.Sprintf("%s/%d", r.Conv, r.Seq)
		if prev, ok := seen[k]; ok && prev != r.MessageID {
			dups++
		}
		seen[k] = r.MessageID
	}
	t.Logf("the broken order produced %d duplicate seqs", dups)
	if dups == 0 {
		t.Error("accepting before the takeover marker produced no duplicate seq: the scenario does not exercise the race")
	}
}

// TestSecuredPausedWriterIsFenced is TestPausedWriterIsFenced in the
// secured mode: the workers' transactional ids are theirs by ACL, and the
// new owner's fencing of the paused one goes through the same broker
// checks; persist runs with its own user.
func TestSecuredPausedWriterIsFenced(t *testing.T) {
	sharing(t, 15, 37)
	s := startSecuredForChecks(t)
	s.startRole(clustersec.RolePersist)
	accepted, fenced := pausedWriterOn(t, s.dev, s.startWorker)
	checkPausedWriterFenced(t, s.dev, accepted, fenced)
}
