// Command report turns the raw results of bench/run.sh into BENCHMARKS.md:
// each figure beside its ceiling as a ratio, the group-commit trade-off,
// the machine and the commands. `report -batch PREFIX` prints the events
// per Kafka transaction between PREFIX.before and PREFIX.after (metrics
// snapshots), which run.sh feeds to the produce ceiling.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/chatpipe/chatpipe/atomicfile"
	"github.com/chatpipe/chatpipe/loadgen"
)

func main() {
	dir := flag.String("dir", "", "results directory of bench/run.sh")
	out := flag.String("out", "BENCHMARKS.md", "file to write")
	batch := flag.String("batch", "", "print events per transaction between PREFIX.before and PREFIX.after, and exit")
	flag.Parse()
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
	a, err := counters(prefix + ".before")
	if err != nil {
		return delta{}, err
	}
	b, err := counters(prefix + ".after")
	if err != nil {
		return delta{}, err
	}
	return delta{commits: b.commits - a.commits, events: b.events - a.events}, nil
}

// counters sums chatpipe_worker_commits_total and _events_total over
// workers in a Prometheus text snapshot.
func counters(path string) (delta, error) {
	f, err := os.Open(path)
	if err != nil {
		return delta{}, err
	}
	defer f.Close()
	var d delta
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(name, "chatpipe_worker_commits_total"):
			d.commits += v
		case strings.HasPrefix(name, "chatpipe_worker_events_total"):
			d.events += v
		}
	}
	return d, sc.Err()
}

func readReport(dir, run string) (*loadgen.Report, error) {
	b, err := os.ReadFile(filepath.Join(dir, "runs", run, loadgen.ReportJSON))
	if err != nil {
		return nil, err
	}
	var r loadgen.Report
	return &r, json.Unmarshal(b, &r)
}

// cpuFields reads cpu/RUN written by run.sh: broker CPU seconds before
// and after, wall seconds, chatpipe dev before and after, Postgres before
// and after, loadgen user and system seconds.
func cpuFields(dir, run string) []float64 {
	b, err := os.ReadFile(filepath.Join(dir, "cpu", run))
	if err != nil {
		return nil
	}
	var out []float64
	for _, f := range strings.Fields(string(b)) {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return nil
		}
		out = append(out, v)
	}
	return out
}

// brokerCores is the broker process's CPU over a run, in cores.
func brokerCores(dir, run string) float64 {
	f := cpuFields(dir, run)
	if len(f) < 3 || f[2] <= 0 {
		return math.NaN()
	}
	return (f[1] - f[0]) / f[2]
}

func runSecs(dir, run string) float64 {
	f := cpuFields(dir, run)
	if len(f) < 3 {
		return math.NaN()
	}
	return f[2]
}

// cpuPerMessage is CPU milliseconds per accepted message of each part:
// broker, chatpipe (gateway, workers, persist, delivery), Postgres, loadgen.
func cpuPerMessage(dir, run string, accepted int64) (broker, chatpipe, pg, lg float64, ok bool) {
	f := cpuFields(dir, run)
	if len(f) < 9 || accepted == 0 {
		return 0, 0, 0, 0, false
	}
	ms := func(s float64) float64 { return s * 1000 / float64(accepted) }
	return ms(f[1] - f[0]), ms(f[4] - f[3]), ms(f[6] - f[5]), ms(f[7] + f[8]), true
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
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func render(dir string) (string, error) {
	var b strings.Builder
	machine, _ := os.ReadFile(filepath.Join(dir, "machine.txt"))
	commands, _ := os.ReadFile(filepath.Join(dir, "commands.txt"))
	bench, order, err := benchLines(filepath.Join(dir, "bench.txt"))
	if err != nil {
		return "", fmt.Errorf("bench results: %w", err)
	}
	get := func(run string) *loadgen.Report {
		r, err := readReport(dir, run)
		if err != nil {
			return &loadgen.Report{}
		}
		return r
	}
	sat, lat, hot := get("saturation"), get("lat1000"), get("hot")
	satD, _ := metricDelta(filepath.Join(dir, "metrics", "saturation"))
	hotD, _ := metricDelta(filepath.Join(dir, "metrics", "hot"))

	// The produce ceiling at chatpipe's batching: the case run.sh added
	// (producers = vshards, batch = events per commit at saturation).
	var produceCase string
	for _, name := range order {
		if strings.HasPrefix(name, "TxnProduce/") {
			produceCase = name // the last one is the matching case
		}
	}
	produceCeil := bench[produceCase]["records/s"]
	pgCeil := math.NaN()
	for name, v := range bench {
		if strings.HasPrefix(name, "PersistWrite") {
			pgCeil = v["rows/s"]
		}
	}
	oneProducer := bench["TxnProduce/producers=1/batch=100/partitions=one"]["records/s"]
	oneTxn := bench["TxnProduce/producers=1/batch=1/partitions=one"]["txn/s"]
	tk := takeovers(filepath.Join(dir, "takeover.log"))

	fmt.Fprintf(&b, "# chatpipe benchmarks\n\nProduced by `bench/run.sh` on one machine in one run; every figure beside its ceiling, measured in the same run against the same broker and Postgres. Do not edit by hand: run the script again. Every stack is warmed up (5 s of load at 300 msg/s) and ANALYZEd before it is measured: a fresh database without statistics plans full scans of `events` until autovacuum's first ANALYZE, which an established deployment does not pay.\n\n")
	fmt.Fprintf(&b, "## Machine\n\n```\n%s```\n\n", machine)
	b.WriteString("## Figures\n\n| figure | measured | beside | ratio |\n|--------|----------|--------|-------|\n")
	fmt.Fprintf(&b, "| (b) end-to-end `accepted`/s at saturation (offered %.0f msg/s, peak mix, rate limits off) | %s msg/s (best second %d); %.1f events per Kafka transaction | (a) transactional produce ceiling, same broker, %s | %s |\n",
		sat.Rate, num(sat.AcceptedPerSec), sat.PeakPerSec, satD.eventsPerTxn(), strings.TrimPrefix(produceCase, "TxnProduce/")+": "+num(produceCeil)+" records/s", ratio(sat.AcceptedPerSec, produceCeil))
	fmt.Fprintf(&b, "| (b) the same against Postgres | %s msg/s | (a) persist write ceiling, same Postgres: %s rows/s | %s |\n",
		num(sat.AcceptedPerSec), num(pgCeil), ratio(sat.AcceptedPerSec, pgCeil))
	fmt.Fprintf(&b, "| (c) `accepted` latency at %.0f msg/s for %s (peak mix, %d users × %d devices, %d deliveries) | p50 %.1f ms, p99 %.1f ms (p99.9 %.1f, max %.1f) | seed anchor p99 146.9 ms at 1,000 msg/s; goal p99 < 20 ms | anchor ÷ ours %s; goal %s |\n",
		lat.Rate, lat.Duration, lat.Users, lat.Devices, lat.Deliveries, lat.AcceptedLat.P50MS, lat.AcceptedLat.P99MS, lat.AcceptedLat.P999MS, lat.AcceptedLat.MaxMS,
		ratio(146.9, lat.AcceptedLat.P99MS), met(lat.AcceptedLat.P99MS > 0 && lat.AcceptedLat.P99MS < 20))
	fmt.Fprintf(&b, "| (c) delivery latency at the same rate (send due → `event` at a member's device) | p50 %.1f ms, p99 %.1f ms | — | — |\n",
		lat.DeliveryLat.P50MS, lat.DeliveryLat.P99MS)
	fmt.Fprintf(&b, "| (d) one hot conversation (20 members, offered %.0f msg/s) | %s msg/s (best second %d), p99 %.1f ms, %.1f events per transaction | seed anchor 200 msg/s at a 5 ms commit; one transactional producer, 100 records per transaction: %s records/s | ÷ anchor %s; ÷ producer %s |\n",
		hot.Rate, num(hot.AcceptedPerSec), hot.PeakPerSec, hot.AcceptedLat.P99MS, hotD.eventsPerTxn(), num(oneProducer), ratio(hot.AcceptedPerSec, 200), ratio(hot.AcceptedPerSec, oneProducer))
	if len(tk) > 0 {
		oneCommit := 1 / oneTxn
		fmt.Fprintf(&b, "| (e) takeover, claim → accepting, a joining worker taking %d vshards by hand-off | p50 %v, max %v | one bare transaction: %s ms | p50 ÷ one transaction %s |\n",
			len(tk), tk[len(tk)/2].Round(time.Millisecond), tk[len(tk)-1].Round(time.Millisecond), num(oneCommit*1000), ratio(tk[len(tk)/2].Seconds(), oneCommit))
	} else {
		b.WriteString("| (e) takeover | not measured (no takeover in the worker's log) | — | — |\n")
	}
	goal := sat.AcceptedPerSec >= produceCeil/2
	fmt.Fprintf(&b, "\nGoal — end-to-end `accepted`/s ≥ ½ of the produce ceiling at the same batching: **%s** (%s). Goal — `accepted` p99 at 1,000 msg/s under 20 ms: **%s** (%.1f ms).\n\n",
		met(goal), ratio(sat.AcceptedPerSec, produceCeil), met(lat.AcceptedLat.P99MS > 0 && lat.AcceptedLat.P99MS < 20), lat.AcceptedLat.P99MS)

	b.WriteString("## Where the CPU goes\n\nCPU milliseconds per accepted message over a whole loadgen run (setup included), by process; everything shares the machine's cores.\n\n")
	b.WriteString("| run | accepted | broker (kfake) | chatpipe dev (gateway, workers, persist, delivery) | Postgres | loadgen | total |\n|---|---|---|---|---|---|---|\n")
	for _, run := range []string{"lat1000", "saturation", "hot"} {
		r := get(run)
		if br, cp, pg, lg, ok := cpuPerMessage(dir, run, r.Accepted); ok {
			fmt.Fprintf(&b, "| %s | %d | %.3f ms | %.3f ms | %.3f ms | %.3f ms | %.3f ms |\n", run, r.Accepted, br, cp, pg, lg, br+cp+pg+lg)
		}
	}
	b.WriteString("\n")

	b.WriteString("## (a) Ceilings of the bare parts\n\n| benchmark | records/s | transactions/s | rows/s |\n|-----------|-----------|----------------|--------|\n")
	for _, name := range order {
		v := bench[name]
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", name, numOr(v, "records/s"), numOr(v, "txn/s"), numOr(v, "rows/s"))
	}
	b.WriteString("\nRecords of 350 bytes (a message record with a 100-byte body); `one` keeps a producer's records in one partition as a vshard's are, `spread` spreads one transaction over all 8 partitions.\n\n")

	b.WriteString("## Group commit: vshards × linger budget at 1,000 msg/s\n\n")
	budget, _ := os.ReadFile(filepath.Join(dir, "sweep-budget.txt"))
	fmt.Fprintf(&b, "Each row is a fresh stack (`--vshards V --linger-max L --txn-budget %s`, 2 workers) with the peak mix at 1,000 msg/s. The small transaction budget makes every vshard's arrivals outpace its share, so a writer lingers up to L: the rows show what the linger budget buys in transactions and costs in latency. `off` never lingers (a batch is what queued during the previous commit).\n\n", strings.TrimSpace(string(budget)))
	b.WriteString("| vshards | linger budget | Kafka transactions/s | events per transaction | `accepted` p50 | `accepted` p99 | broker CPU (cores) |\n|---|---|---|---|---|---|---|\n")
	sweep, _ := os.ReadFile(filepath.Join(dir, "sweep.txt"))
	for _, line := range strings.Split(strings.TrimSpace(string(sweep)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		r := get(f[2])
		d, _ := metricDelta(filepath.Join(dir, "metrics", f[2]))
		l := f[1]
		if strings.HasPrefix(l, "-") {
			l = "off"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.2f | %.1f ms | %.1f ms | %s |\n", f[0], l, num(d.commits/runSecs(dir, f[2])), d.eventsPerTxn(),
			r.AcceptedLat.P50MS, r.AcceptedLat.P99MS, num(brokerCores(dir, f[2])))
	}
	b.WriteString("\nTransactions/s and broker CPU are averaged over the whole loadgen run (connect, create, send, drain), so they understate the send phase a little; the ratios between rows hold.\n\n")
	check, _ := os.ReadFile(filepath.Join(dir, "check-lat1000.txt"))
	if len(check) > 0 {
		fmt.Fprintf(&b, "## `chatpipe check` of the 1,000 msg/s run\n\n```\n%s```\n\n", check)
	}
	fmt.Fprintf(&b, "## Commands\n\n```\n%s```\n", commands)
	return b.String(), nil
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
