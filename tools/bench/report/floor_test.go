package main

import (
	"math"
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
