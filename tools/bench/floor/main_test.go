package main

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary be the sink, as the command is for itself.
func TestMain(m *testing.M) {
	if mode := os.Getenv(sinkEnv); mode != "" {
		run := runSink
		if mode == "ws" {
			run = runWSSink
		}
		if err := run(os.Stdin, os.Stdout); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The writer paces its writes, the sink reads every byte of them, and
// both report a CPU cost per write.
func TestFloorReportsWhatItWrote(t *testing.T) {
	var out bytes.Buffer
	if err := runWriter(&out, 20, 2000, 4, 100, 200*time.Millisecond, time.Second); err != nil {
		t.Fatal(err)
	}
	kv := keyValues(t, out.String())
	// 2,000 frames a second at 4 per write: 500 writes a second.
	if w := kv["floor_writes_per_sec"]; w < 400 || w > 550 {
		t.Errorf("floor_writes_per_sec %v, want about 500", w)
	}
	if kv["floor_frames_per_write"] != 4 || kv["conns"] != 20 || kv["frame_bytes"] != 100 {
		t.Errorf("the run's shape is not reported: %v", kv)
	}
	for _, k := range []string{"floor_writer_us_per_write", "floor_writer_us_per_frame", "floor_sink_us_per_frame", "floor_sink_switches_per_frame"} {
		if kv[k] <= 0 {
			t.Errorf("%s = %v, want a cost", k, kv[k])
		}
	}
	if got, want := kv["floor_writer_us_per_frame"]*4, kv["floor_writer_us_per_write"]; got < 0.99*want || got > 1.01*want {
		t.Errorf("µs per frame × 4 = %v, µs per write %v", got, want)
	}
}

// The websocket floor writes one websocket message per frame, the sink
// reads every one of them, and both report a CPU cost per frame.
func TestWSFloorReportsWhatItWrote(t *testing.T) {
	var out bytes.Buffer
	if err := runWSWriter(&out, 20, 2000, 100, 200*time.Millisecond, time.Second); err != nil {
		t.Fatal(err)
	}
	kv := keyValues(t, out.String())
	if kv["floor_frames_per_write"] != 1 || kv["conns"] != 20 || kv["frame_bytes"] != 100 {
		t.Errorf("the run's shape is not reported: %v", kv)
	}
	for _, k := range []string{"floor_writes_per_sec", "floor_writer_us_per_write", "floor_writer_us_per_frame", "floor_sink_us_per_frame"} {
		if kv[k] <= 0 {
			t.Errorf("%s = %v, want a cost", k, kv[k])
		}
	}
}

// keyValues parses the command's "key value" lines.
func keyValues(t *testing.T, out string) map[string]float64 {
	t.Helper()
	kv := map[string]float64{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			t.Fatalf("line %q is not key value", line)
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		kv[f[0]] = v
	}
	return kv
}
