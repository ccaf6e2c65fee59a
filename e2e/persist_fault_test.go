package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestKilledPersistResumes kills persist with kill -9 in the middle of its
// Postgres transactions (each held open 300 ms before its commit) while
// messages flow and memberships change; a new persist resumes from the
// offsets in Postgres. Afterwards every event is in Postgres exactly once
// (the world check), and so is the read model persist applies in the same
// transactions: the membership periods in Postgres equal those folded from
// the committed log (nothing applied twice or lost), every conversation's
// last_seq is its last event, the delivery rows cover every seq, and a
// device connected all along received, live, everything its user may see,
// although the burst after the restart did not fit its send buffer.
func TestKilledPersistResumes(t *testing.T) {
	sharing(t, 15, 16)
	// A send buffer of 64 frames: the burst that follows the restart (the
	// events that piled up while no persist ran) is far more than that for
	// lu1, a member of every conversation.
	dev := startDev(t, t.TempDir(), "--persist=false", "--send-buffer", "64")
	ep := filepath.Join(dev.Dir, "endpoints.json")
	p1 := stacktest.StartProc(t, dev.Dir, "persist1", []string{"CHATPIPE_FAULT_PERSIST_SLEEP_BEFORE_COMMIT=300ms"},
		"persist", "--endpoints", ep, "--log-level", "warn")
	watch := newDevice(t, dev, "lu1", "lu1-watch") // a member of every load conversation
	if err := watch.connect(); err != nil {
		t.Fatal(err)
	}
	defer watch.disconnect()
	owner := newDevice(t, dev, "lu0", "lu0-churn")
	if err := owner.connect(); err != nil {
		t.Fatal(err)
	}
	defer owner.disconnect()
	if f, err := owner.doRetrying(map[string]any{"op": "create", "conversation_id": "pk", "members": []string{"lu1"}}); err != nil || f.Op != protocol.OpAccepted {
		t.Fatalf("create pk: %v %+v", err, f)
	}
	stop := make(chan struct{})
	var churn sync.WaitGroup
	churn.Add(1)
	go func() { // joins and kicks in pk while persist dies and comes back
		defer churn.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			u := fmt.Sprintf("pj%d", i%5)
			op := "join"
			if (i/5)%2 == 1 {
				op = "kick"
			}
			if _, err := owner.doRetrying(map[string]any{"op": op, "conversation_id": "pk", "user_id": u}); err != nil {
				t.Errorf("%s %s: %v", op, u, err)
				return
			}
		}
	}()
	load := stacktest.StartLoad(t, dev.Dev, 10, 20)
	load.WaitAbove(t, 60*time.Second, "load to flow", 200)
	time.Sleep(time.Second)
	p1.Kill9()
	time.Sleep(time.Second) // events pile up, neither stored nor projected
	stacktest.StartProc(t, dev.Dir, "persist2", nil, "persist", "--endpoints", ep, "--log-level", "warn")
	n := load.Count()
	load.WaitAbove(t, 120*time.Second, "load to go on after the fault", n+300)
	accepted := load.Finish()
	close(stop)
	churn.Wait()
	t.Logf("%d sends accepted", len(accepted))
	checkWorld(t, dev.EP, accepted)

	// Memberships, last_seq and the delivery rows, against the log.
	rows := checkReadModel(t, dev.EP)
	want := periods(rows)
	t.Logf("%d periods in pk: %v", len(want["pk"]), want["pk"])

	byConv := map[string][]row{}
	for _, r := range rows {
		byConv[r.Conv] = append(byConv[r.Conv], r)
	}
	missing := func() []string {
		var out []string
		for c, rs := range byConv {
			if got, want := len(watch.seqs(c)), len(visibleTo(rs, want[c]["lu1"])); got != want {
				out = append(out, fmt.Sprintf("%s: %d of %d", c, got, want))
			}
		}
		sort.Strings(out)
		return out
	}
	stacktest.WaitForOr(t, 30*time.Second, "the watching device to receive everything", func() bool { return len(missing()) == 0 }, func() string {
		watch.mu.Lock()
		conns, open := watch.conns, watch.conn != nil && watch.conn.Err() == nil
		watch.mu.Unlock()
		return fmt.Sprintf("%d connections, open %v, missing %v; the gateway's log:\n%s",
			conns, open, missing(), grepLines(filepath.Join(dev.Dir, "dev.log"), "slow websocket reader", "events may have been missed", "delivery"))
	})
	watch.mu.Lock()
	conns := watch.conns
	watch.mu.Unlock()
	if conns != 1 {
		t.Errorf("the watching device reconnected (%d connections): not a test of live delivery", conns)
	}
	if n := stacktest.Metric(t, dev.EP.Admin+"/metrics", "chatpipe_gateway_backlogs_total"); n == 0 {
		t.Errorf("no push found a send buffer full: the burst after the restart was not read back")
	}
}

// sortedPeriods renders periods in a fixed order for comparison.
func sortedPeriods(m map[string]map[string][][2]int64) []string {
	var out []string
	for c, users := range m {
		for u, ps := range users {
			out = append(out, fmt.Sprintf("%s/%s%v", c, u, ps))
		}
	}
	sort.Strings(out)
	return out
}

// projectedPeriods reads the read model's membership periods, in the
// shape periods gives the log's.
func projectedPeriods(t *testing.T, ep endpoints) map[string]map[string][][2]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return readPeriods(ctx, t, connectPG(ctx, t, ep.Postgres))
}

// readPeriods is projectedPeriods on an open connection.
func readPeriods(ctx context.Context, t *testing.T, conn *pgx.Conn) map[string]map[string][][2]int64 {
	t.Helper()
	got := map[string]map[string][][2]int64{}
	var conv, user string
	var joined int64
	var left *int64
	prows, err := conn.Query(ctx, `SELECT conversation_id, user_id, joined_seq, left_seq FROM memberships ORDER BY conversation_id, user_id, joined_seq`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgx.ForEachRow(prows, []any{&conv, &user, &joined, &left}, func() error {
		if got[conv] == nil {
			got[conv] = map[string][][2]int64{}
		}
		to := int64(1 << 62)
		if left != nil {
			to = *left
		}
		got[conv][user] = append(got[conv][user], [2]int64{joined, to})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}
