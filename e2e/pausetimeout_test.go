package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/stacktest"
)

// TestPausedPastTxnTimeout: a writer is paused (SIGSTOP) with a transaction
// between produce and commit for longer than its Kafka transaction timeout
// and its lease. Unlike TestPausedWriterIsFenced, whose transaction timeout
// outlasts the pause, here the broker aborts the open transactions itself
// before the new owner fences them. On waking, the writer must not commit
// as if it still owned its shards: its commits are refused, and the world
// check holds — no vshard's log going back to an older ownership epoch
// among it.
//
// CHATPIPE_E2E_PLANT=recommit plants the bug this test is for: the woken
// writer commits its refused batch again with a fresh producer, without
// asking etcd who owns the vshard. The test must then fail.
func TestPausedPastTxnTimeout(t *testing.T) {
	sharing(t, 15, 24)
	dev := startDev(t, t.TempDir(), "--workers", "0")
	mark := filepath.Join(dev.Dir, "wa-in-commit")
	const txnTimeout = 2 * time.Second
	env := []string{"CHATPIPE_FAULT_SLEEP_BEFORE_COMMIT=300ms", "CHATPIPE_FAULT_COMMIT_MARK=" + mark, "CHATPIPE_TXN_TIMEOUT=" + txnTimeout.String(), shortLease}
	if os.Getenv("CHATPIPE_E2E_PLANT") == "recommit" {
		env = append(env, "CHATPIPE_FAULT_RECOMMIT_AFTER_ABORT=1")
	}
	wa := dev.StartWorker(t, "wa", env...)
	stacktest.WaitOwned(t, 120*time.Second, "wa to own every vshard", dev.EP, dev.EP.All(), "wa", dev.EP.All())
	dev.StartWorker(t, "wb")
	stacktest.WaitOwned(t, 120*time.Second, "wb to get its half", dev.EP, dev.EP.All(), "wb", dev.EP.All()/2)
	waMetrics := stacktest.AdminURL(t, dev.EP, "wa")
	aborts0 := strings.Count(readFile(t, filepath.Join(dev.Dir, "dev.log")), "txn timeout abort")

	load := stacktest.StartLoad(t, dev.Dev, 10, 20)
	load.WaitAbove(t, 30*time.Second, "load to flow", 200)
	os.Remove(mark)
	stacktest.WaitFor(t, 30*time.Second, "wa to enter a commit", func() bool { _, err := os.Stat(mark); return err == nil })
	wa.Signal(syscall.SIGSTOP)
	paused := time.Now()
	stacktest.WaitOwned(t, 120*time.Second, "wb to take over every vshard", dev.EP, dev.EP.All(), "wb", dev.EP.All())
	if d := time.Since(paused); d < 2*txnTimeout {
		time.Sleep(2*txnTimeout - d)
	}
	aborts := strings.Count(readFile(t, filepath.Join(dev.Dir, "dev.log")), "txn timeout abort") - aborts0
	t.Logf("shards moved %v after the pause; the broker aborted %d transactions on timeout", time.Since(paused).Round(time.Millisecond), aborts)
	if aborts == 0 {
		t.Error("the broker timed out no transaction of the paused writer: the pause missed the open transaction or outlasted nothing")
	}
	wa.Signal(syscall.SIGCONT)
	n := load.Count()
	load.WaitAbove(t, 60*time.Second, "load to go on after the pause", n+300)
	accepted := load.Finish()
	time.Sleep(500 * time.Millisecond)
	refused := stacktest.Metric(t, waMetrics, "chatpipe_worker_fenced_writes_total") + stacktest.Metric(t, waMetrics, "chatpipe_worker_unknown_commits_total")
	t.Logf("%d sends accepted; the paused writer had %v commits or writes refused after waking", len(accepted), refused)
	if refused == 0 {
		t.Error("the paused writer had no write refused after waking: it committed nothing it held, or it was never stopped")
	}
	checkWorld(t, dev.EP, accepted)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
