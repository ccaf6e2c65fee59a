package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chatpipe/chatpipe/internal/auth"
	"github.com/chatpipe/chatpipe/tools/loadgen"
)

// TestLoadgenShardsMerged runs two loadgen processes at once against one
// `chatpipe dev`, each one half of the same plan (--shard 1/2, 2/2),
// merges their run directories with `chatpipe loadgen merge` and checks
// the merged run as one: it passes. After one accepted message is deleted
// from Postgres the same check fails. Shard 2 is given the stack the way a
// deployed one is (--ws, --jwt-secret-file, --kafka, --database-url, no
// endpoints.json), and the last check names the world by flags too.
func TestLoadgenShardsMerged(t *testing.T) {
	sharing(t, 20, 22)
	dev := startDev(t, t.TempDir())
	out := filepath.Join(t.TempDir(), "runs")
	ep := filepath.Join(dev.Dir, "endpoints.json")
	res := make([]cmdResult, 2)
	var wg sync.WaitGroup
	target := [][]string{{"--endpoints", ep}, {"--ws", dev.EP.WebSocket, "--jwt-secret-file", filepath.Join(dev.Dir, auth.SecretFile),
		"--kafka", strings.Join(dev.EP.Kafka, ","), "--database-url", dev.EP.Postgres}}
	for k := 1; k <= 2; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[k-1] = runChatpipe(t, append(append([]string{"loadgen"}, target[k-1]...), "--rate", "60", "--duration", "10s",
				"--shard", []string{"1/2", "2/2"}[k-1], "--out", out, "--run", "sh", "--progress=false", "--drain", "90s")...)
		}()
	}
	wg.Wait()
	var parts []*loadgen.RunDir
	for k, r := range res {
		if r.err != nil {
			t.Fatalf("loadgen shard %d/2: %v\n%s", k+1, r.err, r.out)
		}
		run, err := loadgen.ReadRun(filepath.Join(out, []string{"sh-1of2", "sh-2of2"}[k]))
		if err != nil {
			t.Fatal(err)
		}
		rep := run.Report
		if rep.Status != loadgen.StatusFinished || rep.Accepted == 0 || rep.Shard != []string{"1/2", "2/2"}[k] || rep.Rate != 30 {
			t.Fatalf("shard %d: status %s, accepted %d, shard %q, rate %v", k+1, rep.Status, rep.Accepted, rep.Shard, rep.Rate)
		}
		parts = append(parts, run)
	}
	users := map[string]bool{}
	for _, u := range parts[0].Info.Plan.Users {
		users[u] = true
	}
	for _, u := range parts[1].Info.Plan.Users {
		if users[u] {
			t.Fatalf("user %s is in both shards", u)
		}
	}

	merged := filepath.Join(out, "sh")
	m := runChatpipe(t, "loadgen", "merge", "--out", merged, filepath.Join(out, "sh-1of2"), filepath.Join(out, "sh-2of2"))
	if m.err != nil {
		t.Fatalf("merge: %v\n%s", m.err, m.out)
	}
	run, err := loadgen.ReadRun(merged)
	if err != nil {
		t.Fatal(err)
	}
	rep := run.Report
	if rep.Status != loadgen.StatusFinished || rep.Accepted != parts[0].Report.Accepted+parts[1].Report.Accepted ||
		rep.Sent != parts[0].Report.Sent+parts[1].Report.Sent || rep.AcceptedLat.Count != rep.Accepted || rep.Rate != 60 ||
		len(run.Accepted) != len(parts[0].Accepted)+len(parts[1].Accepted) {
		t.Fatalf("merged report: status %s, sent %d, accepted %d (latency n=%d), rate %v; %d accepted lines", rep.Status, rep.Sent, rep.Accepted, rep.AcceptedLat.Count, rep.Rate, len(run.Accepted))
	}
	t.Logf("merged: offered %d, sent %d, accepted %d, re-sends %d, p99 %.1f ms, %d deliveries", rep.Offered, rep.Sent, rep.Accepted, rep.Resends, rep.AcceptedLat.P99MS, rep.Deliveries)

	ok := runChatpipe(t, "check", "--run", merged)
	if ok.err != nil || !strings.Contains(ok.out, "PASS") {
		t.Fatalf("check of the merged run: %v\n%s", ok.err, ok.out)
	}
	t.Logf("check:\n%s", ok.out)

	// One accepted message of shard 2 removed from Postgres.
	var victim loadgen.Accepted
	for _, a := range parts[1].Accepted {
		if a.Op == "send" && !a.Dup {
			victim = a
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dev.EP.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tag, err := conn.Exec(ctx, `DELETE FROM events WHERE conversation_id = $1 AND seq = $2 AND kind = 'message'`, victim.Conv, victim.Seq)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("delete %s/%d: %v (%d rows)", victim.Conv, victim.Seq, err, tag.RowsAffected())
	}
	gone := runChatpipe(t, "check", "--run", merged, "--kafka", strings.Join(dev.EP.Kafka, ","), "--database-url", dev.EP.Postgres)
	if gone.err == nil || !strings.Contains(gone.out, "VIOLATION accepted-not-in-postgres") || !strings.Contains(gone.out, victim.MessageID) {
		t.Fatalf("check of the merged run after deleting an accepted message: %v\n%s", gone.err, gone.out)
	}
}
