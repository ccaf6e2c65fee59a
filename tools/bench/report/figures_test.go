package main

import (
	"os"
	"path/filepath"
	"testing"
)

// A window whose CPU count falls for a process is not measured: the
// paced ceiling's Postgres once came out at −0.999 µs per record, when a
// backend's CPU left the count between the window's two reads.
func TestCPUWindowRefusesAFallingCount(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "cpu"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "cpu", name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("up.send", "wall 100\nbroker 42.37\npostgres 57.95\n")
	write("up.end", "wall 120\nbroker 46.53\npostgres 59.95\n")
	write("down.send", "wall 100\nbroker 42.37\npostgres 57.95\n")
	write("down.end", "wall 120\nbroker 46.53\npostgres 57.93\n")

	w, ok := cpuWindow(dir, "up")
	if !ok || w.secs != 20 || w.cpu["postgres"] < 1.99 || w.cpu["postgres"] > 2.01 {
		t.Fatalf("up: ok %v, %+v; want 20 s and Postgres 2.00 s", ok, w)
	}
	if w, ok := cpuWindow(dir, "down"); ok {
		t.Fatalf("down: measured %+v; want no window, since Postgres' CPU fell", w)
	}
}
