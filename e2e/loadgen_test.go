package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chatpipe/chatpipe/tools/loadgen"
)

// TestLoadgenThenCheck runs `chatpipe loadgen` against `chatpipe dev` (rate
// limits on: loadgen spreads its load under them; devices reconnect on
// purpose twice a second) and `chatpipe check` on
// the run directory: it passes. Then it shows the check can fail: on a
// copy of the run directory where one accepted seq is duplicated, and on
// the world after one accepted event was deleted from Postgres.
func TestLoadgenThenCheck(t *testing.T) {
	sharing(t, 20, 21)
	dev := startDev(t, t.TempDir())
	out := filepath.Join(t.TempDir(), "runs")
	lg := runChatpipe(t, "loadgen", "--endpoints", filepath.Join(dev.Dir, "endpoints.json"), "--rate", "60", "--duration", "10s",
		"--out", out, "--run", "e2e", "--progress=false", "--drain", "90s", "--reconnects", "2")
	if lg.err != nil {
		t.Fatalf("loadgen: %v\n%s", lg.err, lg.out)
	}
	runDir := filepath.Join(out, "e2e")
	for _, f := range []string{loadgen.ReportJSON, loadgen.ReportMD, loadgen.RunFile, loadgen.AcceptedFile} {
		if _, err := os.Stat(filepath.Join(runDir, f)); err != nil {
			t.Fatalf("run dir: %v", err)
		}
	}
	run, err := loadgen.ReadRun(runDir)
	if err != nil {
		t.Fatal(err)
	}
	rep := run.Report
	if rep.Status != loadgen.StatusFinished || rep.Accepted == 0 || rep.Unanswered != 0 || rep.Reconnects == 0 {
		t.Fatalf("report: status %s, accepted %d, unanswered %d, reconnects %d", rep.Status, rep.Accepted, rep.Unanswered, rep.Reconnects)
	}
	t.Logf("loadgen: %d sent, %d accepted, p99 %.1f ms, %d deliveries (%s)", rep.Sent, rep.Accepted, rep.AcceptedLat.P99MS, rep.Deliveries, rep.DeliveryMode)

	ok := runChatpipe(t, "check", "--run", runDir)
	if ok.err != nil || !strings.Contains(ok.out, "PASS") {
		t.Fatalf("check of a good run: %v\n%s", ok.err, ok.out)
	}
	t.Logf("check:\n%s", ok.out)

	// The same run name again appends nothing to the ledger.
	again := runChatpipe(t, "loadgen", "--endpoints", filepath.Join(dev.Dir, "endpoints.json"), "--rate", "10", "--duration", "1s",
		"--out", out, "--run", "e2e", "--progress=false")
	if again.err == nil {
		t.Fatal("a second run with a finished run's name was accepted")
	}
	lines, err := loadgen.ReadLedger(filepath.Join(out, loadgen.LedgerFile))
	if err != nil || len(lines) != 2 || lines[1].Status != loadgen.StatusFinished {
		t.Fatalf("ledger: %+v %v", lines, err)
	}

	// One seq duplicated: a copy of the run where another message was
	// "accepted" with an accepted send's seq.
	accepted := run.Accepted
	var victim loadgen.Accepted
	for _, a := range accepted {
		if a.Op == "send" && !a.Dup {
			victim = a
			break
		}
	}
	dupDir := filepath.Join(out, "dupseq")
	copyRunDir(t, runDir, dupDir)
	forged := victim
	forged.MessageID, forged.ClientMessageID = "01FORGED0000000000000000000", "forged"
	appendJSONLine(t, filepath.Join(dupDir, loadgen.AcceptedFile), forged)
	dup := runChatpipe(t, "check", "--run", dupDir)
	if dup.err == nil || !strings.Contains(dup.out, "VIOLATION seq-collision") || !strings.Contains(dup.out, victim.Conv) {
		t.Fatalf("check of a run with a duplicated seq: %v\n%s", dup.err, dup.out)
	}

	// One accepted event removed from Postgres.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dev.EP.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tag, err := conn.Exec(ctx, `DELETE FROM events WHERE conversation_id = $1 AND seq = $2`, victim.Conv, victim.Seq)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("delete %s/%d: %v (%d rows)", victim.Conv, victim.Seq, err, tag.RowsAffected())
	}
	gone := runChatpipe(t, "check", "--run", runDir)
	if gone.err == nil || !strings.Contains(gone.out, "VIOLATION accepted-not-in-postgres") || !strings.Contains(gone.out, victim.MessageID) {
		t.Fatalf("check after deleting an accepted event from Postgres: %v\n%s", gone.err, gone.out)
	}
}

type cmdResult struct {
	out string
	err error
}

func runChatpipe(t *testing.T, args ...string) cmdResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, err := exec.CommandContext(ctx, binary, args...).CombinedOutput()
	return cmdResult{string(b), err}
}

func copyRunDir(t *testing.T, from, to string) {
	t.Helper()
	if err := os.CopyFS(to, os.DirFS(from)); err != nil {
		t.Fatal(err)
	}
}

func appendJSONLine(t *testing.T, path string, v any) {
	t.Helper()
	b, _ := json.Marshal(v)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
}
