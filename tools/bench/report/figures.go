package main

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/chatpipe/chatpipe/internal/promtext"
	"github.com/chatpipe/chatpipe/tools/loadgen"
)

// The figures of a measured run: the CPU and context switch windows of
// run.sh's snapshots, the gateway's counters in its metrics snapshots,
// and runFig, which the report's sections read them from.

// The chatpipe roles, each its own process; their sum is "chatpipe".
// persist stores the events and applies the read model.
var chatpipeRoles = []string{"gateway", "w1", "w2", "persist"}

// The other measured processes: dev hosts etcd (and Postgres, counted
// apart); broker is `chatpipe kafka`.
var otherProcs = []string{"dev", "broker", "postgres", "loadgen"}

// window is the CPU seconds each process used between two snapshots of
// run.sh (cpu/RUN.send and cpu/RUN.end), and the wall seconds between them.
type window struct {
	secs float64
	cpu  map[string]float64
}

func readSnap(path string) (float64, map[string]float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, nil, err
	}
	var wall float64
	m := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		if f[0] == "wall" {
			wall = v
		} else {
			m[f[0]] = v
		}
	}
	return wall, m, nil
}

// cpuWindow is the CPU of each process over run's window (cpu/RUN.send and
// .end). CPU counts never fall: a window where one does (a process's CPU
// left the count between the reads) is not measured, rather than priced
// below nothing.
func cpuWindow(dir, run string) (window, bool) {
	w, ok := snapWindow(dir, "cpu", run)
	for _, v := range w.cpu {
		if v < 0 {
			return window{}, false
		}
	}
	return w, ok
}

// switchWindow is the context switches of each process over run's window
// (switches/RUN.send and .end), in window's cpu field.
func switchWindow(dir, run string) (window, bool) { return snapWindow(dir, "switches", run) }

func snapWindow(dir, kind, run string) (window, bool) {
	w0, a, err := readSnap(filepath.Join(dir, kind, run+".send"))
	if err != nil {
		return window{}, false
	}
	w1, b, err := readSnap(filepath.Join(dir, kind, run+".end"))
	if err != nil || w1 <= w0 {
		return window{}, false
	}
	w := window{secs: w1 - w0, cpu: map[string]float64{}}
	for k, v := range b {
		if u, ok := a[k]; ok {
			w.cpu[k] = v - u
		}
	}
	return w, true
}

func (w window) sum(names ...string) float64 {
	var s float64
	for _, n := range names {
		s += w.cpu[n]
	}
	return s
}

func (w window) all() float64 {
	var s float64
	for _, v := range w.cpu {
		s += v
	}
	return s
}

// us is CPU seconds as µs per n.
func us(secs float64, n int64) float64 {
	if n <= 0 {
		return math.NaN()
	}
	return secs * 1e6 / float64(n)
}

// promSum sums the samples of a metric (all label sets) in a Prometheus
// text snapshot; NaN when the file is missing or unreadable or lacks the
// metric.
func promSum(path, metric string) float64 {
	fams, err := promtext.ParseFile(path)
	if err != nil || fams[metric] == nil {
		return math.NaN()
	}
	return promtext.Sum(fams, metric)
}

// deliveredEvents is the gateway's event frames queued to devices over a
// run's CPU window.
func deliveredEvents(dir, run string) int64 {
	return gatewayDelta(dir, run, "chatpipe_delivery_frames_total")
}

// gatewayDelta is how much the gateway's counter metric grew over run's
// send window (0 when a snapshot lacks it).
func gatewayDelta(dir, run, metric string) int64 {
	a := promSum(filepath.Join(dir, "metrics", run+".gateway.send"), metric)
	b := promSum(filepath.Join(dir, "metrics", run+".gateway.end"), metric)
	if math.IsNaN(a) || math.IsNaN(b) {
		return 0
	}
	return int64(b - a)
}

// keyValues reads "key value" lines.
func keyValues(path string) map[string]float64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	m := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				m[f[0]] = v
			}
		}
	}
	return m
}

func orNaN(m map[string]float64, k string) float64 {
	if v, ok := m[k]; ok {
		return v
	}
	return math.NaN()
}

// runFig is what the report needs of one measured run.
type runFig struct {
	name      string
	rep       *loadgen.Report
	win       window
	ok        bool // a CPU window was taken
	delivered int64
	wsMsgs    int64  // websocket messages the gateway wrote over the window
	wsFrames  int64  // the frames in them
	sw        window // context switches over the window
	swOK      bool
}

// writesPerMsg is the websocket messages the gateway wrote per accepted
// message, framesPerMsg the frames in them, framesPerWrite their ratio
// (NaN when not counted).
func (r runFig) writesPerMsg() float64   { return perOf(r.wsMsgs, r.rep.Accepted) }
func (r runFig) framesPerMsg() float64   { return perOf(r.wsFrames, r.rep.Accepted) }
func (r runFig) framesPerWrite() float64 { return perOf(r.wsFrames, r.wsMsgs) }

func perOf(n, of int64) float64 {
	if n <= 0 || of <= 0 {
		return math.NaN()
	}
	return float64(n) / float64(of)
}

// switchesPer is the named processes' context switches per accepted
// message (all processes when none is named).
func (r runFig) switchesPer(names ...string) float64 {
	if !r.swOK || r.rep.Accepted <= 0 {
		return math.NaN()
	}
	n := r.sw.all()
	if len(names) > 0 {
		n = r.sw.sum(names...)
	}
	return n / float64(r.rep.Accepted)
}

func (r runFig) chatpipeUS() float64 { return us(r.win.sum(chatpipeRoles...), r.rep.Accepted) }
func (r runFig) roleUS(n string) float64 {
	if !r.ok {
		return math.NaN()
	}
	return us(r.win.cpu[n], r.rep.Accepted)
}
func (r runFig) gatewayPerDelivery() float64 {
	if !r.ok {
		return math.NaN()
	}
	return us(r.win.cpu["gateway"], r.delivered)
}

// shape is what the gateway wrote in r, for a bare websocket server to
// write the same: the devices connected and the event frames a second it
// queued to them over the window.
func (r runFig) shape() (conns int, framesPerSec float64, ok bool) {
	conns = r.rep.Users * r.rep.Devices
	if !r.ok || r.win.secs <= 0 || r.delivered <= 0 || conns <= 0 {
		return 0, 0, false
	}
	return conns, float64(r.delivered) / r.win.secs, true
}

// cores is how many of the machine's cores the named processes kept busy
// over the window.
func (r runFig) cores(names ...string) float64 {
	if !r.ok || r.win.secs <= 0 {
		return math.NaN()
	}
	if len(names) == 0 {
		return r.win.all() / r.win.secs
	}
	return r.win.sum(names...) / r.win.secs
}

// readRun reads what the report needs of run: loadgen's report (status
// "missing" without one), the CPU and context switch windows and the
// gateway's counters.
func readRun(dir, run string) runFig {
	rep, err := readReport(dir, run)
	if err != nil {
		rep = &loadgen.Report{Status: "missing"}
	}
	w, ok := cpuWindow(dir, run)
	sw, swOK := switchWindow(dir, run)
	return runFig{name: run, rep: rep, win: w, ok: ok, delivered: deliveredEvents(dir, run), sw: sw, swOK: swOK,
		wsMsgs: gatewayDelta(dir, run, "chatpipe_gateway_ws_messages_total"), wsFrames: gatewayDelta(dir, run, "chatpipe_gateway_ws_frames_total")}
}
