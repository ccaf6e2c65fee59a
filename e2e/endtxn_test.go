package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// endTxnFault is what the broker does to the commit of one transaction.
type endTxnFault int

const (
	// commitReplyLost: the broker commits the transaction a moment late
	// and its reply never reaches the writer (every EndTxn the writer
	// sends for it goes unanswered).
	commitReplyLost endTxnFault = iota
	// commitRequestLost: the writer's EndTxn is never applied nor
	// answered; the transaction stays open until the next owner's
	// InitProducerID (or the transaction timeout) aborts it.
	commitRequestLost
	// commitLie is a planted broker bug for showing that the test can
	// fail: it answers the commit with success without applying it, so
	// the writer answers accepted for a transaction that is later aborted.
	commitLie
)

// endTxnControl holds back the commit of the next transaction of one
// transactional.id, as fault says, using kfake's request control.
type endTxnControl struct {
	c     *kfake.Cluster
	addr  string
	txnID string
	fault endTxnFault

	mu        sync.Mutex
	target    *kmsg.EndTxnRequest // the first EndTxn(commit) caught
	swallowed int                 // EndTxn requests of the target left unanswered
	appliedOK bool                // commitReplyLost: the broker applied the commit
	passCopy  atomic.Bool         // let the test's own copy of the commit through
	off       atomic.Bool
}

func (e *endTxnControl) install(t *testing.T) {
	e.c.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		r := req.(*kmsg.EndTxnRequest)
		if e.off.Load() {
			e.c.DropControl()
			return nil, nil, false
		}
		if r.TransactionalID != e.txnID || !r.Commit {
			return nil, nil, false
		}
		if e.passCopy.CompareAndSwap(true, false) {
			return nil, nil, false
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.target == nil {
			cp := *r
			e.target = &cp
			switch e.fault {
			case commitReplyLost:
				go e.commitLate(t, cp)
			case commitLie:
				// abort the transaction, then tell the writer it committed
				abort := cp
				abort.Commit = false
				var code int16
				var err error
				e.c.SleepControl(func() { code, err = e.send(abort) })
				if err != nil || code != 0 {
					t.Errorf("planted abort: code %d, %v", code, err)
				}
				resp := r.ResponseKind().(*kmsg.EndTxnResponse)
				resp.ProducerID, resp.ProducerEpoch = r.ProducerID, r.ProducerEpoch+1
				return resp, nil, true
			}
		} else if r.ProducerID != e.target.ProducerID || r.ProducerEpoch != e.target.ProducerEpoch {
			return nil, nil, false // a later producer (the next session): untouched
		}
		e.swallowed++
		e.c.KeepControl()
		return nil, nil, true // no reply
	})
	t.Cleanup(func() { e.off.Store(true) })
}

// commitLate applies the caught commit on the broker 2 s after the writer
// sent it, as the writer's own request would have been, from a connection
// of the test's.
func (e *endTxnControl) commitLate(t *testing.T, req kmsg.EndTxnRequest) {
	time.Sleep(2 * time.Second)
	e.passCopy.Store(true)
	code, err := e.send(req)
	if err != nil || code != 0 {
		t.Errorf("late commit of the caught transaction: code %d, %v", code, err)
		return
	}
	e.mu.Lock()
	e.appliedOK = true
	e.mu.Unlock()
}

// send sends an EndTxn for the writer's transaction from a client of the
// test's.
func (e *endTxnControl) send(req kmsg.EndTxnRequest) (int16, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.addr))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return 0, err
	}
	return resp.ErrorCode, nil
}

// TestEndTxnUnknownOutcome sends one message whose transaction's commit
// the broker holds back, twice: once the commit is applied late and its
// reply lost (the message is in the log although the writer never heard
// so), once the commit request itself is lost (the transaction is
// aborted). Either way the writer cannot know the outcome: the first
// attempt must be answered neither accepted nor with a definitive reject,
// and the client's retry with the same client_message_id must find the
// truth — exactly one event, in the log and in Postgres, with the seq and
// message_id of the accepted answer.
//
// CHATPIPE_E2E_PLANT=endtxn-lie plants a lost commit instead of the first
// fault: the broker aborts the transaction and answers its commit with
// success, so the writer answers accepted for a message that is not in the
// log. The test must then fail.
func TestEndTxnUnknownOutcome(t *testing.T) {
	sharing(t, 10, 24)
	dir := t.TempDir()
	k, err := devstack.StartKafka(filepath.Join(dir, "broker"), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close) // after the dev process stops
	dev := startDev(t, dir, "--kafka", k.Addr())
	metrics := dev.EP.Admin + "/metrics"
	owner := dev.Dial(t, "eu0")

	var accepted []acceptedMsg
	phases := []struct {
		name  string
		fault endTxnFault
	}{{"commit applied, reply lost", commitReplyLost}, {"commit request lost", commitRequestLost}}
	if os.Getenv("CHATPIPE_E2E_PLANT") == "endtxn-lie" {
		phases[0].fault = commitLie
	}
	for i, ph := range phases {
		conv := fmt.Sprintf("ec%d", i)
		owner.Must(map[string]any{"op": "create", "conversation_id": conv, "members": []string{"eu1"}})
		v := logrecord.VShard(conv, dev.EP.VShards)
		ctl := &endTxnControl{c: k.Cluster(), addr: k.Addr(), txnID: logrecord.TransactionalID(v), fault: ph.fault}
		ctl.install(t)
		unknown0 := stacktest.Metric(t, metrics, "chatpipe_worker_unknown_commits_total")

		cmid := fmt.Sprintf("held-%d", i)
		sent := time.Now()
		first, err := owner.Do(map[string]any{"op": "send", "conversation_id": conv, "client_message_id": cmid, "body": ph.name})
		if err != nil {
			t.Fatalf("%s: first attempt: %v", ph.name, err)
		}
		t.Logf("%s: first attempt answered after %v: %s %s %q", ph.name, time.Since(sent).Round(time.Millisecond), first.Op, first.Code, first.Message)
		if first.Op == protocol.OpAccepted || first.Code != protocol.CodeUnavailable {
			t.Errorf("%s: the first attempt, whose commit had no answer, was answered %s %s; want unavailable (outcome unknown)", ph.name, first.Op, first.Code)
		}
		r, err := owner.SendRetrying(conv, cmid, ph.name)
		if err != nil || r.Op != protocol.OpAccepted {
			t.Fatalf("%s: retry: %+v %v", ph.name, r, err)
		}
		accepted = append(accepted, acceptedMsg{Conv: conv, ClientMessageID: cmid, MessageID: r.MessageID, Sender: "eu0", Seq: r.Seq, SentAt: sent, AcceptedAt: time.Now()})
		// one more message after it: the conversation goes on
		next, err := owner.SendRetrying(conv, cmid+"-next", "after")
		if err != nil || next.Op != protocol.OpAccepted {
			t.Fatalf("%s: next send: %+v %v", ph.name, next, err)
		}
		accepted = append(accepted, acceptedMsg{Conv: conv, ClientMessageID: cmid + "-next", MessageID: next.MessageID, Sender: "eu0", Seq: next.Seq, SentAt: time.Now(), AcceptedAt: time.Now()})

		ctl.mu.Lock()
		caught, swallowed, applied := ctl.target != nil, ctl.swallowed, ctl.appliedOK
		ctl.mu.Unlock()
		ctl.off.Store(true)
		if !caught {
			t.Fatalf("%s: the broker saw no commit of %s: the fault missed", ph.name, ctl.txnID)
		}
		if ph.fault == commitReplyLost && !applied {
			t.Errorf("%s: the held-back commit was not applied", ph.name)
		}
		unknown := stacktest.Metric(t, metrics, "chatpipe_worker_unknown_commits_total") - unknown0
		t.Logf("%s: %d EndTxn requests unanswered, %v unknown commits; retry accepted seq %d", ph.name, swallowed, unknown, r.Seq)
		if ph.fault != commitLie && unknown < 1 {
			t.Errorf("%s: the writer counted no unknown commit", ph.name)
		}
	}

	// Exactly one event per client_message_id, in the log and Postgres.
	logRows := readLog(t, dev.EP)
	for name, rows := range map[string][]row{"log": logRows, "postgres": readDB(t, dev.EP, len(logRows))} {
		for _, a := range accepted {
			var n int
			for _, r := range rows {
				if r.Conv == a.Conv && r.Kind == logrecord.KindMessage && r.ClientMessageID == a.ClientMessageID {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%s: %s/%s is there %d times, want exactly once", name, a.Conv, a.ClientMessageID, n)
			}
		}
	}
	checkWorld(t, dev.EP, accepted)
}
