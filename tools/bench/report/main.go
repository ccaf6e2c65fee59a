// Command report turns the raw results of tools/bench/run.sh into BENCHMARKS.md:
// the goal table (each figure beside its target, the ratio, met or not, and
// the same-run bare-pipeline ceiling), CPU per message of every process per
// run, the roles' CPU profile tops, the other figures and ceilings, the
// group-commit trade-off when it was swept, the machine and the commands.
// `report -batch PREFIX` prints the events per Kafka transaction between
// the workers' metrics snapshots PREFIX.w1.before and PREFIX.w1.after (and
// w2's), which run.sh feeds to the produce ceiling. `report -dir DIR -shape
// RUN` prints the devices and the event frames a second the gateway wrote
// in RUN, which run.sh gives a bare websocket server to write the same.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/chatpipe/chatpipe/internal/atomicfile"
	"github.com/chatpipe/chatpipe/internal/promtext"
	"github.com/chatpipe/chatpipe/tools/loadgen"
)

func main() {
	dir := flag.String("dir", "", "results directory of tools/bench/run.sh")
	out := flag.String("out", "BENCHMARKS.md", "file to write")
	batch := flag.String("batch", "", "print events per transaction between the workers' snapshots PREFIX.<worker>.before and .after, and exit")
	shape := flag.String("shape", "", "print the devices and event frames a second the gateway wrote in this run of -dir, and exit")
	flag.Parse()
	if *shape != "" {
		conns, rate, ok := readRun(*dir, *shape).shape()
		if !ok {
			fail(fmt.Errorf("run %q: no window or no delivered events in %s", *shape, *dir))
		}
		fmt.Println(conns, int(math.Round(rate)))
		return
	}
	if *batch != "" {
		d, err := metricDelta(*batch)
		if err != nil {
			fail(err)
		}
		fmt.Println(max(1, int(math.Round(d.eventsPerTxn()))))
		return
	}
	if *dir == "" {
		fail(fmt.Errorf("-dir is required"))
	}
	md, err := render(*dir)
	if err != nil {
		fail(err)
	}
	if err := atomicfile.Write(*out, []byte(md), 0o644); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "report:", err)
	os.Exit(1)
}

// delta is what the workers' counters moved by during a run.
type delta struct{ commits, events float64 }

func (d delta) eventsPerTxn() float64 {
	if d.commits == 0 {
		return 0
	}
	return d.events / d.commits
}

func metricDelta(prefix string) (delta, error) {
	return workerDelta(prefix, "before", "after")
}

// workers are the workers whose counters the report reads, each from its
// own snapshot, metrics/RUN.<worker>.SUFFIX; in the sweep w1's is the page
// of the all-in-one dev, which holds both workers' counters.
var workers = []string{"w1", "w2"}

// workerDelta is what the workers' counters moved by from their snapshots
// PREFIX.<worker>.FROM to PREFIX.<worker>.TO.
func workerDelta(prefix, from, to string) (delta, error) {
	a, err := counters(prefix, from)
	if err != nil {
		return delta{}, err
	}
	b, err := counters(prefix, to)
	if err != nil {
		return delta{}, err
	}
	return delta{commits: b.commits - a.commits, events: b.events - a.events}, nil
}

// counters sums chatpipe_worker_commits_total and _events_total over the
// workers' snapshots PREFIX.<worker>.SUFFIX, each a page of its own. A
// worker without a snapshot adds nothing; without any it is an error.
func counters(prefix, suffix string) (delta, error) {
	var d delta
	found := false
	for _, w := range workers {
		fams, err := promtext.ParseFile(prefix + "." + w + "." + suffix)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return delta{}, fmt.Errorf("workers' counters: %w", err)
		}
		found = true
		d.commits += promtext.Sum(fams, "chatpipe_worker_commits_total")
		d.events += promtext.Sum(fams, "chatpipe_worker_events_total")
	}
	if !found {
		return delta{}, fmt.Errorf("workers' counters: no snapshot %s.{%s}.%s", prefix, strings.Join(workers, ","), suffix)
	}
	return d, nil
}

func readReport(dir, run string) (*loadgen.Report, error) {
	b, err := os.ReadFile(filepath.Join(dir, "runs", run, loadgen.ReportJSON))
	if err != nil {
		return nil, err
	}
	var r loadgen.Report
	return &r, json.Unmarshal(b, &r)
}

var benchRe = regexp.MustCompile(`^Benchmark(\S+?)-\d+\s+\d+\s+\S+ ns/op(.*)$`)

// benchLines parses `go test -bench` output: name → metric unit → value.
func benchLines(path string) (map[string]map[string]float64, []string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	out := map[string]map[string]float64{}
	var order []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := benchRe.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		fields := strings.Fields(m[2])
		vals := map[string]float64{}
		for i := 0; i+1 < len(fields); i += 2 {
			if v, err := strconv.ParseFloat(fields[i], 64); err == nil {
				vals[fields[i+1]] = v
			}
		}
		out[m[1]] = vals
		order = append(order, m[1])
	}
	return out, order, sc.Err()
}

var tookRe = regexp.MustCompile(`msg=accepting .* took=([0-9.]+[mµn]?s)`)

func takeovers(path string) []time.Duration {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []time.Duration
	for _, line := range strings.Split(string(b), "\n") {
		if m := tookRe.FindStringSubmatch(line); m != nil {
			if d, err := time.ParseDuration(m[1]); err == nil {
				out = append(out, d)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func ratio(a, b float64) string {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "—"
	}
	return fmt.Sprintf("%.2f", a/b)
}

func num(v float64) string {
	if math.IsNaN(v) {
		return "—"
	}
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	case v >= 0.1 || v == 0:
		return fmt.Sprintf("%.2f", v)
	default: // (three significant digits: a small count per message)
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

func numOr(v map[string]float64, unit string) string {
	x, ok := v[unit]
	if !ok {
		return "—"
	}
	return num(x)
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}
