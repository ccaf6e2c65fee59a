package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// workerPage is a worker's /metrics page with its two counters.
func workerPage(id, commits, events string) string {
	return "# HELP chatpipe_worker_commits_total Kafka transactions committed.\n# TYPE chatpipe_worker_commits_total counter\n" +
		"chatpipe_worker_commits_total{worker=\"" + id + "\"} " + commits + "\n" +
		"# HELP chatpipe_worker_events_total Events committed.\n# TYPE chatpipe_worker_events_total counter\n" +
		"chatpipe_worker_events_total{worker=\"" + id + "\"} " + events + "\n"
}

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// The workers' counters are read from each worker's own snapshot and
// added up; a worker without one (the sweep's all-in-one stack has only
// w1's) adds nothing, and a run without any is an error.
func TestWorkerDeltaAddsEachWorkersSnapshot(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"sat.w1.send": workerPage("w1", "100", "1000"),
		"sat.w2.send": workerPage("w2", "50", "400"),
		"sat.w1.end":  workerPage("w1", "300", "4000"),
		"sat.w2.end":  workerPage("w2", "1.5e+02", "2.4e+03"),
		"one.w1.send": workerPage("w1", "10", "10"),
		"one.w1.end":  workerPage("w1", "20", "50"),
	})
	d, err := workerDelta(filepath.Join(dir, "sat"), "send", "end")
	if err != nil || d.commits != 300 || d.events != 5000 || d.eventsPerTxn() != 5000.0/300 {
		t.Errorf("workerDelta(sat) = %+v, %v; want 300 commits and 5000 events", d, err)
	}
	if d, err := workerDelta(filepath.Join(dir, "one"), "send", "end"); err != nil || d.commits != 10 || d.events != 40 {
		t.Errorf("workerDelta(one) = %+v, %v; want 10 commits and 40 events", d, err)
	}
	if _, err := workerDelta(filepath.Join(dir, "none"), "send", "end"); err == nil {
		t.Error("workerDelta without snapshots: no error")
	}
}

// promSum adds up a metric's series in one snapshot, NaN when the file
// or the metric is missing.
func TestPromSum(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"gw": "# TYPE chatpipe_gateway_ws_frames_total counter\nchatpipe_gateway_ws_frames_total 12\n" +
			"# TYPE chatpipe_gateway_ws_frames_total_extra counter\nchatpipe_gateway_ws_frames_total_extra 5\n" +
			"# TYPE chatpipe_gateway_commands_total counter\nchatpipe_gateway_commands_total{op=\"send\"} 3\nchatpipe_gateway_commands_total{op=\"join\"} 4\n",
	})
	gw := filepath.Join(dir, "gw")
	if v := promSum(gw, "chatpipe_gateway_ws_frames_total"); v != 12 {
		t.Errorf("ws_frames_total = %v, want 12", v)
	}
	if v := promSum(gw, "chatpipe_gateway_commands_total"); v != 7 {
		t.Errorf("commands_total = %v, want 7", v)
	}
	if v := promSum(gw, "chatpipe_delivery_frames_total"); !math.IsNaN(v) {
		t.Errorf("a missing metric = %v, want NaN", v)
	}
	if v := promSum(filepath.Join(dir, "missing"), "chatpipe_gateway_ws_frames_total"); !math.IsNaN(v) {
		t.Errorf("a missing file = %v, want NaN", v)
	}
}

// The pgpause run's line: the workers' events between the pause and
// resume snapshots, per second of the pause; nothing when it did not run.
func TestWritePause(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	writePause(&b, dir)
	if b.Len() != 0 {
		t.Errorf("without a pgpause run: %q, want nothing", b.String())
	}
	metrics := writeFiles(t, map[string]string{
		"pgpause.w1.pause":  workerPage("w1", "100", "1000"),
		"pgpause.w2.pause":  workerPage("w2", "100", "1000"),
		"pgpause.w1.resume": workerPage("w1", "200", "8500"),
		"pgpause.w2.resume": workerPage("w2", "200", "8500"),
	})
	if err := os.Rename(metrics, filepath.Join(dir, "metrics")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pgpause-secs"), []byte("15\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	writePause(&b, dir)
	if !strings.Contains(b.String(), "for 15 s") || !strings.Contains(b.String(), ": 1000 events committed a second") {
		t.Errorf("pgpause line %q, want 15,000 events in 15 s: 1,000 a second", b.String())
	}
}
