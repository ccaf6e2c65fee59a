package main

import (
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// floor is tools/bench/floor's runs: what one small loopback write costs
// this machine at one frame per write and at batch frames per write, and
// what a bare websocket server costs per frame (floor -ws).
type floor struct {
	one       float64 // the writer's µs per write, one frame per write
	sinkOne   float64 // the reader's µs per frame, one frame per write
	batch     int     // frames per write of the second run
	batchW    float64 // the writer's µs per write at batch frames per write
	sinkBatch float64 // the reader's µs per frame at batch frames per write
	rate      float64 // frames/s of the first run
	conns     float64
	bytes     float64
	secs      float64
	// ws is the bare websocket server at the floor's own rate
	// (floor-ws.txt); wsAt in a run's shape (floor-ws-RUN.txt), as many
	// connections and frames a second as the gateway wrote there.
	ws   wsShape
	wsAt map[string]wsShape
}

// wsShape is one run of the bare websocket server: its connections, frames
// a second, and the writer's and reader's µs per frame (us NaN: not run).
type wsShape struct {
	conns, rate, us, sink float64
}

// readWS reads one run of the bare websocket server.
func readWS(path string) wsShape {
	kv := keyValues(path)
	return wsShape{conns: orNaN(kv, "conns"), rate: orNaN(kv, "floor_writes_per_sec"), us: orNaN(kv, "floor_writer_us_per_frame"), sink: orNaN(kv, "floor_sink_us_per_frame")}
}

// readFloor reads results/floor-1.txt, the other floor-N.txt, floor-ws.txt
// and floor-ws-RUN.txt.
func readFloor(dir string) floor {
	f := floor{one: math.NaN(), sinkOne: math.NaN(), batchW: math.NaN(), sinkBatch: math.NaN(), wsAt: map[string]wsShape{}}
	f.ws = readWS(filepath.Join(dir, "floor-ws.txt"))
	one := keyValues(filepath.Join(dir, "floor-1.txt"))
	f.one, f.sinkOne = orNaN(one, "floor_writer_us_per_write"), orNaN(one, "floor_sink_us_per_frame")
	f.rate, f.conns, f.bytes, f.secs = orNaN(one, "floor_writes_per_sec"), orNaN(one, "conns"), orNaN(one, "frame_bytes"), orNaN(one, "window_secs")
	names, _ := filepath.Glob(filepath.Join(dir, "floor-*.txt"))
	sort.Strings(names)
	for _, n := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(n), "floor-"), ".txt")
		if run, ok := strings.CutPrefix(name, "ws-"); ok {
			if s := readWS(n); !math.IsNaN(s.us) {
				f.wsAt[run] = s
			}
			continue
		}
		b, err := strconv.Atoi(name)
		if err != nil || b <= 1 {
			continue
		}
		kv := keyValues(n)
		f.batch, f.batchW, f.sinkBatch = b, orNaN(kv, "floor_writer_us_per_write"), orNaN(kv, "floor_sink_us_per_frame")
	}
	return f
}

func (f floor) ok() bool { return !math.IsNaN(f.one) && f.one > 0 }

// linear estimates the cost of one write (or read) of k frames from its
// cost at one frame and at f.batch frames: linear between the floor's two
// runs, extended past them, and never below the one-frame cost.
func (f floor) linear(k, atOne, atBatch float64) float64 {
	if f.batch < 2 || math.IsNaN(atBatch) {
		return atOne
	}
	return max(atOne, atOne+(atBatch-atOne)*(k-1)/float64(f.batch-1))
}

// writesUS is what r's websocket writes cost the floor's writer per
// accepted message: at least (every write at the one-frame write's cost),
// and priced by their frames per write (linear). NaN when not counted.
func (f floor) writesUS(r runFig) (least, priced float64) {
	if !f.ok() {
		return math.NaN(), math.NaN()
	}
	return r.writesPerMsg() * f.one, r.writesPerMsg() * f.linear(r.framesPerWrite(), f.one, f.batchW)
}

// readsUS is what reading them cost the floor's reader per accepted
// message, priced the same way.
func (f floor) readsUS(r runFig) float64 {
	if !f.ok() || math.IsNaN(f.sinkOne) {
		return math.NaN()
	}
	return r.writesPerMsg() * f.linear(r.framesPerWrite(), f.sinkOne, f.sinkBatch*float64(f.batch))
}

// wsFor is the bare websocket server in run's shape, else at the floor's
// own rate, and which of the two it is.
func (f floor) wsFor(run string) (s wsShape, shaped bool) {
	if s, ok := f.wsAt[run]; ok {
		return s, true
	}
	return f.ws, false
}

// batchedPerFrame is the writer's µs per frame at f.batch frames per write.
func (f floor) batchedPerFrame() float64 {
	if f.batch < 1 {
		return math.NaN()
	}
	return f.batchW / float64(f.batch)
}

// gatewayWhy says what a bare write costs beside the gateway in run r,
// and what joining frames into one write would cost its devices in delay.
func (f floor) gatewayWhy(r runFig) string {
	conns, rate, ok := r.shape()
	if !f.ok() || f.batch < 2 || !ok {
		return ""
	}
	perDevice := rate / float64(conns)
	shared := ""
	if k := r.framesPerWrite(); !math.IsNaN(k) {
		shared = fmt.Sprintf("; the gateway's writes carried %s frames each in this run (what was queued for a device when its writer woke)", num(k))
	}
	return fmt.Sprintf("; a bare write alone costs %s µs per frame at one frame per write and %s at %d frames per write (tools/bench/floor, below); a device received %s event frames a second in this run, so joining %d of them into one write would hold each device's frames about %s ms%s",
		num(f.one), num(f.batchedPerFrame()), f.batch, num(perDevice), f.batch, num(1000*float64(f.batch-1)/perDevice), shared)
}

// writeFloor writes the floor's section, and what the gateway wrote in
// each of runs.
func writeFloor(b *strings.Builder, f floor, runs ...runFig) {
	b.WriteString("## Write floor (same machine, same run)\n\n")
	if !f.ok() {
		b.WriteString("Not measured (see logs/floor-1.log).\n\n")
		return
	}
	fmt.Fprintf(b, "`tools/bench/floor`, run after the stack is stopped: one process writes frames of %.0f bytes to %.0f loopback TCP connections, round robin, paced at %s frames a second, from one goroutine (no websocket framing, no encoding, no fan-out); a second process reads them, one goroutine per connection, as devices do. CPU is utime + stime of every thread over %.0f s. A websocket message costs the gateway at least such a write and its device such a read; a plain device gets one message per event frame, a batching one (loadgen's devices ask for `chatpipe.v1.batch`) may get several frames in one, which the second row prices.\n\n",
		f.bytes, f.conns, num(f.rate), f.secs)
	b.WriteString("| frames per write | writer µs per write | writer µs per frame | reader µs per frame |\n|---|---|---|---|\n")
	fmt.Fprintf(b, "| 1 | %s | %s | %s |\n", num(f.one), num(f.one), num(f.sinkOne))
	if f.batch > 1 {
		fmt.Fprintf(b, "| %d | %s | %s | %s |\n", f.batch, num(f.batchW), num(f.batchedPerFrame()), num(f.sinkBatch))
	}
	if !math.IsNaN(f.ws.us) {
		fmt.Fprintf(b, "| 1, a bare websocket server (`floor -ws`, %.0f connections, %s frames/s) | %s | %s | %s |\n", f.ws.conns, num(f.ws.rate), num(f.ws.us), num(f.ws.us), num(f.ws.sink))
	}
	shaped := make([]string, 0, len(f.wsAt))
	for n := range f.wsAt {
		shaped = append(shaped, n)
	}
	sort.Strings(shaped)
	for _, n := range shaped {
		s := f.wsAt[n]
		fmt.Fprintf(b, "| 1, the bare websocket server in %s's shape (%.0f connections, %s frames/s) | %s | %s | %s |\n", n, s.conns, num(s.rate), num(s.us), num(s.us), num(s.sink))
	}
	b.WriteString("\n")
	if !math.IsNaN(f.ws.us) || len(f.wsAt) > 0 {
		b.WriteString("The websocket rows are a bare server on the gateway's websocket library (github.com/coder/websocket): one goroutine per connection, fed by a channel, and one websocket message per frame, no protocol; its reader is the library's client, one goroutine per connection. A run's shape is its devices and the event frames a second the gateway queued to them over its window (`chatpipe_delivery_frames_total`); what a frame costs depends on both (at a lower rate fewer frames find their goroutine and thread awake). The row in a run's shape is the anchor of goal 7 for that run; the `floor -ws` row, for a run that has none.\n\n")
	}
	var rows []string
	for _, r := range runs {
		least, priced := f.writesUS(r)
		if math.IsNaN(least) {
			continue
		}
		rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s |", r.name, num(r.framesPerMsg()), num(r.writesPerMsg()),
			num(r.framesPerWrite()), num(least), num(priced), num(r.roleUS("gateway"))))
	}
	if len(rows) > 0 {
		fmt.Fprintf(b, "What the gateway wrote in each run's window (`chatpipe_gateway_ws_frames_total`, `chatpipe_gateway_ws_messages_total`), per accepted message, and what those writes would cost the floor's writer: at least (every write priced as a one-frame write), and priced by their frames per write, linear between the two rows above (an estimate; past %d frames per write, extended):\n\n", f.batch)
		b.WriteString("| run | frames per message | websocket messages per message | frames per websocket message | floor µs per message, at least | floor µs per message, priced by frames per write | gateway µs per message, measured |\n|---|---|---|---|---|---|---|\n")
		b.WriteString(strings.Join(rows, "\n") + "\n\n")
	}
}
