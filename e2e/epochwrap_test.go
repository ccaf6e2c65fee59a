package e2e

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// ageTxnID runs empty transactions on txnID (EndTxn v5 aborts, each of
// which bumps the producer epoch, as every transaction end does under
// KIP-890) until its epoch is at least epoch.
func ageTxnID(t *testing.T, addr, txnID string, epoch int16) int {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	init := kmsg.NewPtrInitProducerIDRequest()
	init.TransactionalID, init.TransactionTimeoutMillis = &txnID, 10000
	ir, err := init.RequestWith(ctx, cl)
	if err != nil || ir.ErrorCode != 0 {
		t.Fatalf("init producer id: %v %+v", err, ir)
	}
	pid, e := ir.ProducerID, ir.ProducerEpoch
	n := 0
	for e < epoch {
		end := kmsg.NewPtrEndTxnRequest()
		end.TransactionalID, end.ProducerID, end.ProducerEpoch, end.Commit = txnID, pid, e, false
		r, err := end.RequestWith(ctx, cl)
		if err != nil || r.ErrorCode != 0 {
			t.Fatalf("empty transaction %d (epoch %d): %v %+v", n, e, err, r)
		}
		if r.ProducerEpoch <= e {
			t.Fatalf("ending a transaction at epoch %d did not bump it (%d): the broker does not bump per transaction", e, r.ProducerEpoch)
		}
		pid, e = r.ProducerID, r.ProducerEpoch
		n++
	}
	return n
}

func describeTxn(t *testing.T, addr, txnID string) kadm.DescribedTransaction {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := kadm.NewClient(cl).DescribeTransactions(ctx, txnID)
	if err != nil {
		t.Fatal(err)
	}
	dt, ok := d[txnID]
	if !ok || dt.Err != nil {
		t.Fatalf("describe %s: %+v", txnID, dt)
	}
	return dt
}

// TestProducerEpochRotation: a vshard's transactional.id past 32,767
// transactions. The epoch is a 16-bit number that every transaction end
// bumps; at its end the broker gives the id a new producer ID at epoch 0.
// The id is aged by empty transactions to a few short of that, then the
// writer commits through the rotation, and then it is paused with a
// transaction open on the new producer ID while another worker takes the
// vshard over: on waking its commit is refused and the world check holds.
func TestProducerEpochRotation(t *testing.T) {
	sharing(t, 40, 13)
	dir := t.TempDir()
	k, err := devstack.StartKafka(filepath.Join(dir, "broker"), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	dev := startDev(t, dir, "--kafka", k.Addr(), "--workers", "0", "--rate-conv", "-1", "--rate-user", "-1")
	const conv = "wrap"
	txnID := logrecord.TransactionalID(logrecord.VShard(conv, dev.EP.VShards))
	const margin = 12 // transactions left before the rotation
	start := time.Now()
	n := ageTxnID(t, k.Addr(), txnID, math.MaxInt16-1-margin)
	before := describeTxn(t, k.Addr(), txnID)
	t.Logf("%s aged by %d transactions in %v: producer %d epoch %d", txnID, n, time.Since(start).Round(time.Millisecond), before.ProducerID, before.ProducerEpoch)

	mark := filepath.Join(dev.Dir, "wa-in-commit")
	hold := filepath.Join(dev.Dir, "wa-hold-commit")
	wa := dev.StartWorker(t, "wa", "CHATPIPE_FAULT_SLEEP_BEFORE_COMMIT=1ms", "CHATPIPE_FAULT_COMMIT_MARK="+mark, "CHATPIPE_FAULT_COMMIT_HOLD="+hold, shortLease)
	stacktest.WaitOwned(t, 120*time.Second, "wa to own every vshard", dev.EP, dev.EP.All(), "wa", dev.EP.All())
	waMetrics := stacktest.AdminURL(t, dev.EP, "wa")
	owner := dev.Dial(t, "wu0")
	owner.Must(map[string]any{"op": "create", "conversation_id": conv, "members": []string{"wu1"}})

	var mu sync.Mutex
	var accepted []acceptedMsg
	send := func(cmid string) {
		sent := time.Now()
		r, err := owner.SendRetrying(conv, cmid, "wrap")
		if err != nil || r.Op != protocol.OpAccepted {
			t.Errorf("send %s: %+v %v", cmid, r, err)
			return
		}
		mu.Lock()
		accepted = append(accepted, acceptedMsg{Conv: conv, ClientMessageID: cmid, MessageID: r.MessageID, Sender: "wu0", Seq: r.Seq, SentAt: sent, AcceptedAt: time.Now()})
		mu.Unlock()
	}
	// one transaction each, through the rotation
	for i := 0; i < 2*margin; i++ {
		send(fmt.Sprintf("through-%d", i))
	}
	after := describeTxn(t, k.Addr(), txnID)
	t.Logf("after %d more sends: producer %d epoch %d", 2*margin, after.ProducerID, after.ProducerEpoch)
	if after.ProducerID == before.ProducerID {
		t.Fatalf("the producer ID did not rotate (still %d, epoch %d)", after.ProducerID, after.ProducerEpoch)
	}

	// Pause wa with a transaction of the new producer ID open: the hold
	// keeps the transaction that made the mark from reaching its commit
	// until wa has been paused, overtaken and woken. (Paused on a mark
	// alone, wa could finish that commit first and be caught between
	// transactions, with nothing left for the new owner to refuse.)
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Remove(mark)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var halted sync.Once
	halt := func() { halted.Do(func() { close(stop) }) }
	defer func() { halt(); wg.Wait() }() // no sender outlives a test that fails half-way
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			send(fmt.Sprintf("paused-%d", i))
		}
	}()
	stacktest.WaitFor(t, 30*time.Second, "wa to enter a commit", func() bool { _, err := os.Stat(mark); return err == nil })
	wa.Signal(syscall.SIGSTOP)
	dev.StartWorker(t, "wb")
	// The owner rows move before wb's takeover marker initialises each
	// transactional.id: only once wb accepts for every vshard has it
	// fenced wa's producer. Woken before that, wa may still commit its
	// open transaction first, legitimately, and the test sees no refusal.
	stacktest.WaitFor(t, 120*time.Second, "wb to take over and accept on every vshard", func() bool {
		view := stacktest.EtcdView(t, dev.EP)
		if stacktest.OwnedBy(view, dev.EP.All(), "wb") != dev.EP.All() || view.Workers["wb"].Admin == "" {
			return false
		}
		return stacktest.Metric(t, stacktest.AdminURLIn(t, view, "wb"), "chatpipe_worker_owned_shards") == float64(dev.EP.All())
	})
	wa.Signal(syscall.SIGCONT)
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	refused := func() float64 {
		return stacktest.Metric(t, waMetrics, "chatpipe_worker_fenced_writes_total") + stacktest.Metric(t, waMetrics, "chatpipe_worker_unknown_commits_total")
	}
	stacktest.WaitFor(t, 60*time.Second, "wa's held commit on "+txnID+" to be refused after waking", func() bool { return refused() > 0 })
	mu.Lock()
	n0 := len(accepted)
	mu.Unlock()
	stacktest.WaitFor(t, 60*time.Second, "sends to "+conv+" to go on after the pause", func() bool { mu.Lock(); defer mu.Unlock(); return len(accepted) > n0+20 })
	halt()
	wg.Wait()
	t.Logf("%d sends accepted; wa had %v writes or commits refused after waking; now producer %d", len(accepted), refused(), describeTxn(t, k.Addr(), txnID).ProducerID)
	checkWorld(t, dev.EP, accepted)
}
