package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestAdminRebuild rebuilds an empty database from the committed log alone
// and compares it with the live one: the log is the source of truth.
func TestAdminRebuild(t *testing.T) {
	parallel(t)
	dev := startDev(t, t.TempDir())
	alice := dev.Dial(t, "alice")
	for c := 0; c < 5; c++ {
		conv := fmt.Sprintf("r%d", c)
		alice.Must(map[string]any{"op": "create", "conversation_id": conv, "members": []string{"bob", "carol"}})
		for i := 0; i < 10; i++ {
			if r, err := alice.SendRetrying(conv, fmt.Sprintf("m%d", i), fmt.Sprintf("body %d", i)); err != nil || r.Op != "accepted" {
				t.Fatalf("send: %+v %v", r, err)
			}
		}
		alice.Must(map[string]any{"op": "kick", "conversation_id": conv, "user_id": "carol"})
	}
	want := readEvents(t, dev.EP.Postgres, 5*12)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dev.EP.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE DATABASE rebuilt`); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	target := strings.Replace(dev.EP.Postgres, "/chatpipe?", "/rebuilt?", 1)
	out, err := exec.Command(binary, "admin", "rebuild", "--kafka", strings.Join(dev.EP.Kafka, ","), "--database-url", target).CombinedOutput()
	if err != nil {
		t.Fatalf("admin rebuild: %v\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
	got := readEvents(t, target, len(want))
	if !reflect.DeepEqual(got, want) {
		t.Errorf("rebuilt database differs from the live one: %d vs %d rows", len(got), len(want))
	}
	// The read model too: persist applies it in the transaction that stores
	// the events, so the live one is complete once its events are.
	const readModel = `SELECT 'member ' || conversation_id || ' ' || user_id || ' ' || joined_seq || '-' || coalesce(left_seq::text, 'open')
		FROM memberships UNION ALL
		SELECT 'conversation ' || conversation_id || ' ' || last_seq || ' ' || last_activity_at FROM conversations UNION ALL
		SELECT 'offsets ' || consumer || ' ' || log_partition || ' ' || next_offset FROM consumer_offsets ORDER BY 1`
	if live, rebuilt := queryRows(t, dev.EP.Postgres, readModel), queryRows(t, target, readModel); !reflect.DeepEqual(rebuilt, live) {
		t.Errorf("rebuilt read model differs from the live one:\n%s\nlive:\n%s", strings.Join(rebuilt, "\n"), strings.Join(live, "\n"))
	}
	// a second rebuild into a non-empty database is refused
	if out, err := exec.Command(binary, "admin", "rebuild", "--kafka", strings.Join(dev.EP.Kafka, ","), "--database-url", target).CombinedOutput(); err == nil {
		t.Errorf("rebuild into a non-empty database succeeded:\n%s", out)
	}
}

// readEvents returns every column of events that comes from the log, in
// (conversation_id, seq) order, once the table holds n rows.
func readEvents(t *testing.T, url string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		have, _ := strconv.Atoi(queryRows(t, url, `SELECT count(*)::text FROM events`)[0])
		if have >= n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events", have, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return queryRows(t, url, `SELECT concat_ws('|', conversation_id, seq, kind, message_id, client_message_id, sender, body, user_id,
		array_to_string(members, ','), created_at, vshard, epoch, log_partition, log_offset) FROM events ORDER BY conversation_id, seq`)
}

// queryRows returns the one text column of sql's rows at url.
func queryRows(t *testing.T, url, sql string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background()) // (called in a poll: one connection at a time)
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}
