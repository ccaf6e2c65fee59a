package main

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/chatpipe/chatpipe/tools/loadgen"
)

// A write of k frames is priced linearly between the floor's one-frame and
// batch-frame runs, never below the one-frame cost; the gateway's writes
// per message are priced from its counted messages and frames.
func TestFloorPricesWritesByFramesPerWrite(t *testing.T) {
	f := floor{one: 10, sinkOne: 12, batch: 10, batchW: 55, sinkBatch: 3}
	for _, c := range []struct{ k, want float64 }{{1, 10}, {10, 55}, {4, 25}, {19, 100}, {0.5, 10}} {
		if got := f.linear(c.k, f.one, f.batchW); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("linear(%v) = %v, want %v", c.k, got, c.want)
		}
	}
	// 100 messages: 200 websocket messages carrying 800 frames, 4 per write.
	r := runFig{rep: &loadgen.Report{Accepted: 100}, wsMsgs: 200, wsFrames: 800}
	least, priced := f.writesUS(r)
	if least != 20 || priced != 50 {
		t.Errorf("writesUS = %v, %v; want 20 (2 writes × 10 µs) and 50 (2 writes × 25 µs)", least, priced)
	}
	// The reader: 12 µs at one frame, 30 µs for ten (3 per frame), so 18 µs for four.
	if got := f.readsUS(r); math.Abs(got-36) > 1e-9 {
		t.Errorf("readsUS = %v, want 36 (2 reads × 18 µs)", got)
	}
	// Without the gateway's counters there is nothing to price.
	if least, _ := f.writesUS(runFig{rep: &loadgen.Report{Accepted: 100}}); !math.IsNaN(least) {
		t.Errorf("writesUS without counters = %v, want NaN", least)
	}
}

// readFloor takes the bare websocket server at the floor's rate and in
// each run's shape from their files; goal 7 prices a run by its own shape,
// and by the floor's rate only for a run that has none.
func TestFloorReadsTheWebsocketServerInEachShape(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"floor-1.txt":          "floor_writer_us_per_write 8\nfloor_sink_us_per_frame 9\nfloor_writes_per_sec 30000\nconns 1200\n",
		"floor-10.txt":         "floor_writer_us_per_write 30\nfloor_sink_us_per_frame 2\n",
		"floor-ws.txt":         "floor_writer_us_per_frame 10\nfloor_sink_us_per_frame 11\nfloor_writes_per_sec 29990\nconns 1200\n",
		"floor-ws-lat1000.txt": "floor_writer_us_per_frame 13\nfloor_sink_us_per_frame 14\nfloor_writes_per_sec 9000\nconns 400\n",
		"floor-ws-r3000.txt":   "floor_sink_us_per_frame 14\n", // the server did not run
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f := readFloor(dir)
	if f.one != 8 || f.batch != 10 || f.batchW != 30 {
		t.Errorf("TCP floor = %v µs, batch %d at %v µs; want 8, 10 at 30", f.one, f.batch, f.batchW)
	}
	if s, shaped := f.wsFor("lat1000"); !shaped || s.us != 13 || s.conns != 400 || s.rate != 9000 {
		t.Errorf("lat1000's anchor = %+v (shaped %v), want its own shape at 13 µs", s, shaped)
	}
	if s, shaped := f.wsFor("r3000"); shaped || s.us != 10 || s.rate != 29990 {
		t.Errorf("r3000's anchor = %+v (shaped %v), want the floor -ws row at 10 µs", s, shaped)
	}
}
