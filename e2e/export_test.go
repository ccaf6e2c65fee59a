package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/stacktest"
)

// TestExportKilledMidChunkResumes kills `chatpipe export` while a chunk is
// written but not renamed, resumes it under the same run name, and compares
// it with a clean run: no partial file under a final name, the same chunks
// and totals, one line in the daily ledger.
func TestExportKilledMidChunkResumes(t *testing.T) {
	parallel(t)
	dev := startDev(t, t.TempDir(), "--rate-user", "-1")
	alice := dev.Dial(t, "alice")
	for c := 0; c < 3; c++ {
		conv := fmt.Sprintf("x%d", c)
		alice.Must(map[string]any{"op": "create", "conversation_id": conv, "members": []string{"bob"}})
		for i := 0; i < 25; i++ {
			if r, err := alice.SendRetrying(conv, fmt.Sprintf("m%d", i), "x"); err != nil || r.Op != "accepted" {
				t.Fatalf("send: %+v %v", r, err)
			}
		}
	}
	readEvents(t, dev.EP.Postgres, 78)
	day := time.Now().UTC().Format("2006-01-02")
	ep := filepath.Join(dev.Dir, "endpoints.json")
	export := func(out string, env ...string) *exec.Cmd {
		cmd := exec.Command(binary, "export", "--endpoints", ep, "--day", day, "--out", out, "--chunk-size", "10", "--run", "nightly")
		cmd.Env = append(os.Environ(), env...)
		return cmd
	}
	clean := filepath.Join(t.TempDir(), "clean")
	if out, err := export(clean).CombinedOutput(); err != nil {
		t.Fatalf("clean export: %v\n%s", err, out)
	}

	resumed := filepath.Join(t.TempDir(), "resumed")
	mark := filepath.Join(t.TempDir(), "stalled")
	cmd := export(resumed, "CHATPIPE_FAULT_EXPORT_STALL_CHUNK=3", "CHATPIPE_FAULT_EXPORT_STALL_MARK="+mark)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, 60*time.Second, "the export to stall inside chunk 3", func() bool { _, err := os.Stat(mark); return err == nil })
	cmd.Process.Kill()
	cmd.Wait()
	dayDir := filepath.Join(resumed, day)
	if _, err := os.Stat(filepath.Join(dayDir, "chunk-00003.jsonl")); err == nil {
		t.Fatal("chunk 3 is visible under its final name though the export died writing it")
	}
	if tmps, _ := filepath.Glob(filepath.Join(dayDir, ".chunk-00003.jsonl.tmp-*")); len(tmps) != 1 {
		t.Errorf("want the killed chunk's temp file beside its target, found %v", tmps)
	}
	for k := 0; k < 3; k++ {
		if _, err := os.Stat(filepath.Join(dayDir, fmt.Sprintf("chunk-%05d.jsonl", k))); err != nil {
			t.Errorf("chunk %d finished before the kill is missing: %v", k, err)
		}
	}
	for i := 0; i < 2; i++ { // resume, then run once more: idempotent
		if out, err := export(resumed).CombinedOutput(); err != nil {
			t.Fatalf("resumed export: %v\n%s", err, out)
		}
	}

	read := func(dir, name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if a, b := read(filepath.Join(clean, day), "totals.json"), read(dayDir, "totals.json"); a != b {
		t.Errorf("totals differ: clean %s, resumed %s", a, b)
	}
	if !strings.Contains(read(dayDir, "totals.json"), `"events": 78`) {
		t.Errorf("totals: %s", read(dayDir, "totals.json"))
	}
	chunks, _ := filepath.Glob(filepath.Join(clean, day, "chunk-*.jsonl"))
	if len(chunks) != 8 {
		t.Errorf("%d chunks of 10 for 78 events", len(chunks))
	}
	for _, c := range chunks {
		if read(filepath.Join(clean, day), filepath.Base(c)) != read(dayDir, filepath.Base(c)) {
			t.Errorf("%s differs between the clean and the resumed run", filepath.Base(c))
		}
	}
	if n := strings.Count(read(resumed, "daily.ledger"), "\n"); n != 1 {
		t.Errorf("daily ledger has %d lines, want 1:\n%s", n, read(resumed, "daily.ledger"))
	}
	runs := read(resumed, "runs.ledger")
	if !strings.Contains(runs, `"status":"died","at"`) || !strings.Contains(runs, `"chunk":3`) || strings.Count(runs, `"status":"finished"`) != 2 {
		t.Errorf("run ledger:\n%s", runs)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(dayDir, ".*tmp-*")); len(leftovers) != 0 {
		t.Errorf("temp files left after the resumed run: %v", leftovers)
	}
}
