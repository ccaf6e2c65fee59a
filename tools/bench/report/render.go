package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// render writes BENCHMARKS.md from the results directory dir: each
// section in the order the page shows them.
func render(dir string) (string, error) {
	res := readResults(dir)
	var b strings.Builder
	writeIntro(&b, res)
	writeGoal(&b, res)
	writeCPU(&b, res)
	writeRuns(&b, res)
	writePostgres(&b, res)
	writeIdle(&b, res)
	writeFloor(&b, res.floor, res.runs()...)
	writeCeiling(&b, res)
	writeProfiles(&b, res)
	writeOtherFigures(&b, res)
	writeSweep(&b, dir)
	writeChecks(&b, dir)
	fmt.Fprintf(&b, "## Commands\n\n```\n%s```\n", res.commands)
	return b.String(), nil
}

// results is what render reads of a results directory.
type results struct {
	dir      string
	machine  []byte // machine.txt
	commands []byte // commands.txt
	knobs    map[string]float64
	bench    map[string]map[string]float64 // bench.txt: name → unit → value
	order    []string                      // bench.txt's names, in order
	// The measured runs: latency at 1,000 msg/s, the profiled peak mix,
	// saturation, 1:1 conversations and one hot conversation.
	lat, mid, sat, one, hot runFig
	floor                   floor
	// The bare pipeline flat out (ceiling), and the same bare parts paced
	// at lat1000's rate in the writers' light-load shape (ceiling1000).
	ceil, paced ceilRun
	profRunName string // the run the roles were profiled in
}

// ceilRun is one run of tools/bench/ceiling: its output (NAME.txt), and
// every process's CPU over its window.
type ceilRun struct {
	kv  map[string]float64
	win window
	ok  bool // the CPU window was taken
}

func readCeiling(dir, name string) ceilRun {
	r := ceilRun{kv: keyValues(filepath.Join(dir, name+".txt"))}
	r.win, r.ok = cpuWindow(dir, name)
	return r
}

// readResults reads the results directory dir; a file that is missing
// leaves its part empty.
func readResults(dir string) results {
	machine, _ := os.ReadFile(filepath.Join(dir, "machine.txt"))
	commands, _ := os.ReadFile(filepath.Join(dir, "commands.txt"))
	bench, order, _ := benchLines(filepath.Join(dir, "bench.txt"))
	profRun, _ := os.ReadFile(filepath.Join(dir, "prof", "run.txt"))
	return results{
		dir:         dir,
		machine:     machine,
		commands:    commands,
		knobs:       keyValues(filepath.Join(dir, "knobs.txt")),
		bench:       bench,
		order:       order,
		lat:         readRun(dir, "lat1000"),
		mid:         readRun(dir, "r3000"),
		sat:         readRun(dir, "saturation"),
		one:         readRun(dir, "one1"),
		hot:         readRun(dir, "hot"),
		floor:       readFloor(dir),
		ceil:        readCeiling(dir, "ceiling"),
		paced:       readCeiling(dir, "ceiling1000"),
		profRunName: strings.Fields(string(profRun) + " r3000")[0],
	}
}

// runs are the measured runs in the order the tables list them.
func (res results) runs() []runFig { return []runFig{res.lat, res.mid, res.sat, res.one, res.hot} }

// writeIntro writes the title, how the figures are measured, and the
// machine.
func writeIntro(b *strings.Builder, res results) {
	fmt.Fprintf(b, "# chatpipe benchmarks\n\nProduced by `tools/bench/run.sh` on one machine in one run; do not edit by hand: run the script again. The roles run as separate processes — `chatpipe gateway`, `chatpipe worker` ×2 (w1, w2), `chatpipe persist` (which stores the events and applies the read model in one transaction) — beside the broker (`chatpipe kafka`), `chatpipe dev` hosting etcd and Postgres (its own roles off), and `chatpipe loadgen`, all sharing the machine's cores. The stack is warmed up (5 s at 300 msg/s) and ANALYZEd before it is measured.\n\n")
	fmt.Fprintf(b, "CPU is read per process from /proc (utime + stime) over each run's send window: from the start of loadgen's send phase until its last answer is in (send + drain; connect, conversation setup and the final device sync are not counted). **chatpipe** is gateway + w1 + w2 + persist; it does not include dev (etcd, and the delivery feed of dev's own idle gateway), the broker or Postgres, which are shown apart. µs per message are over `accepted` messages; the gateway's µs per delivered event are over the event frames it queued to devices in the same window (`chatpipe_delivery_frames_total`), its whole CPU (accepting included) divided by them.\n\n")
	fmt.Fprintf(b, "## Machine\n\n```\n%s```\n\n", res.machine)
}

// goalRow is one figure of the goal table, measured against its target.
type goalRow struct {
	figure   string
	measured float64
	unit     string
	target   float64
	atMost   bool   // the target is a ceiling (≤), else a floor (≥)
	zeroOK   bool   // a measured 0 is a figure, not a missing one
	beside   string // the same-run comparison, if any
	why      string // where it falls short
}

func (g goalRow) met() (bool, bool) {
	if math.IsNaN(g.measured) || g.measured < 0 || (g.measured == 0 && !g.zeroOK) {
		return false, false
	}
	if g.atMost {
		return g.measured <= g.target, true
	}
	return g.measured >= g.target, true
}

// writeGoal writes the goal table: each figure beside its target, whether
// it is met and, for those that are not, where they fall short.
func writeGoal(b *strings.Builder, res results) {
	rows := goalRows(res)
	b.WriteString("## Goals: the pipeline behind the gateway at the price of the bare parts\n\nEach goal is a ratio to an anchor measured in this run (the bare pipeline's ceiling, the write floor), except the real-time server's figures, which are constants of an earlier measurement on this kind of machine.\n\n| figure | measured | target | measured ÷ target | met? | beside |\n|---|---|---|---|---|---|\n")
	var unmet []goalRow
	for _, g := range rows {
		op := "≥"
		if g.atMost {
			op = "≤"
		}
		m, known := g.met()
		verdict := "not measured"
		if known {
			verdict = met(m)
			if !m {
				verdict = "**not met**"
				unmet = append(unmet, g)
			}
		}
		beside := g.beside
		if beside == "" {
			beside = "—"
		}
		fmt.Fprintf(b, "| %s | %s %s | %s %s %s | %s | %s | %s |\n", g.figure, num(g.measured), g.unit, op, num(g.target), g.unit, ratio(g.measured, g.target), verdict, beside)
	}
	if len(unmet) > 0 {
		b.WriteString("\nWhere a goal is not met:\n\n")
		for _, g := range unmet {
			fmt.Fprintf(b, "- %s: %s.\n", g.figure, g.why)
		}
	}
	fmt.Fprintf(b, "\nThe profiled run (%s) carries the profiler's own cost (a few per cent).\n\n", res.profRunName)
}

// writeCPU writes each run's CPU per accepted message by process, the
// cores each process kept busy and its context switches per message.
func writeCPU(b *strings.Builder, res results) {
	b.WriteString("## CPU per accepted message, by process\n\nµs of CPU per accepted message over the send window of each run.\n\n")
	cols := append(append([]string{}, chatpipeRoles...), "chatpipe")
	cols = append(cols, otherProcs...)
	b.WriteString("| run | offered msg/s | accepted | window s | " + strings.Join(cols, " | ") + " | all | gateway µs per delivered event (events) |\n")
	b.WriteString("|---|---|---|---|" + strings.Repeat("---|", len(cols)+2) + "\n")
	for _, r := range res.runs() {
		if !r.ok {
			fmt.Fprintf(b, "| %s | %.0f | %d | — |%s — | — |\n", r.name, r.rep.Rate, r.rep.Accepted, strings.Repeat(" — |", len(cols)))
			continue
		}
		fmt.Fprintf(b, "| %s | %.0f | %d | %.1f |", r.name, r.rep.Rate, r.rep.Accepted, r.win.secs)
		for _, c := range cols {
			v := r.roleUS(c)
			if c == "chatpipe" {
				fmt.Fprintf(b, " **%s** |", num(r.chatpipeUS()))
				continue
			}
			fmt.Fprintf(b, " %s |", num(v))
		}
		fmt.Fprintf(b, " %s | %s (%d) |\n", num(us(r.win.all(), r.rep.Accepted)), num(r.gatewayPerDelivery()), r.delivered)
	}
	b.WriteString("\nCores kept busy over the same windows (CPU seconds ÷ wall seconds):\n\n")
	perProcess(b, cols, res.runs(), func(r runFig) bool { return r.ok }, runFig.cores)
	b.WriteString("\nContext switches per accepted message over the same windows (every thread's voluntary and involuntary switches, from /proc/PID/task/*/status). Each is a thread that slept, waiting for a socket, a lock or a timer, or was taken off its core, and ran again; at light load nearly every round trip of a message (websocket, link, broker, Postgres) costs some. A CPU profile does not show what they cost in the kernel, and on a virtual machine a switch can cost much more than the work it waits for.\n\n")
	perProcess(b, cols, res.runs(), func(r runFig) bool { return r.swOK }, runFig.switchesPer)
	b.WriteString("\n")
}

// perProcess writes a table of one figure per run and process: fig of the
// process named by each column ("chatpipe": of its roles together), then of
// all processes, for the runs that have it.
func perProcess(b *strings.Builder, cols []string, runs []runFig, has func(runFig) bool, fig func(runFig, ...string) float64) {
	b.WriteString("| run | " + strings.Join(cols, " | ") + " | all |\n|---|" + strings.Repeat("---|", len(cols)+1) + "\n")
	for _, r := range runs {
		if !has(r) {
			continue
		}
		fmt.Fprintf(b, "| %s |", r.name)
		for _, c := range cols {
			if c == "chatpipe" {
				fmt.Fprintf(b, " **%s** |", num(fig(r, chatpipeRoles...)))
				continue
			}
			fmt.Fprintf(b, " %s |", num(fig(r, c)))
		}
		fmt.Fprintf(b, " %s |\n", num(fig(r)))
	}
}

// writeRuns writes every run's load, throughput and latency, and whether
// the saturation run saturated.
func writeRuns(b *strings.Builder, res results) {
	sat := res.sat
	b.WriteString("## Runs\n\n| run | load | sent / accepted | accepted/s (best second) | accepted p50 / p99 | delivery p50 / p99 | deliveries (loadgen) | re-sends | status |\n|---|---|---|---|---|---|---|---|---|\n")
	loads := map[string]string{"lat1000": "peak mix", "r3000": "peak mix", "saturation": "peak mix, above capacity", "one1": "1:1, one device", "hot": "one hot conversation"}
	for _, r := range res.runs() {
		fmt.Fprintf(b, "| %s | %s, %.0f msg/s for %s, %d users × %d devices | %d / %d | %s (%d) | %.1f / %.1f ms | %.1f / %.1f ms | %d | %d | %s |\n",
			r.name, loads[r.name], r.rep.Rate, r.rep.Duration, r.rep.Users, r.rep.Devices, r.rep.Sent, r.rep.Accepted, num(r.rep.AcceptedPerSec), r.rep.PeakPerSec,
			r.rep.AcceptedLat.P50MS, r.rep.AcceptedLat.P99MS, r.rep.DeliveryLat.P50MS, r.rep.DeliveryLat.P99MS, r.rep.Deliveries, r.rep.Resends, r.rep.Status)
	}
	if sat.rep.GivenUp > 0 {
		fmt.Fprintf(b, "\n**The saturation run collapsed**: %d commands were given up and %d re-sent after timeouts (its backlog outgrew loadgen's answer timeout), so its %s accepted/s of %.0f offered measure the collapse, not the capacity; run again with a lower BENCH_SAT_RATE or a shorter BENCH_SAT_SECS.\n", sat.rep.GivenUp, sat.rep.Resends, num(sat.rep.AcceptedPerSec), sat.rep.Rate)
	} else if sat.rep.Rate > 0 && sat.rep.AcceptedPerSec >= 0.95*sat.rep.Rate {
		fmt.Fprintf(b, "\n**The saturation run did not saturate**: %s accepted/s of %.0f offered, so its figure is a floor of the capacity, not the capacity; run again with a higher BENCH_SAT_RATE.\n", num(sat.rep.AcceptedPerSec), sat.rep.Rate)
	} else if sat.rep.Rate > 0 {
		fmt.Fprintf(b, "\nThe saturation run saturated: %s accepted/s of %.0f offered.\n", num(sat.rep.AcceptedPerSec), sat.rep.Rate)
	}
	b.WriteString("\n")
}

// writeCeiling writes the bare pipeline's ceiling, measured in the same
// run, beside chatpipe at saturation.
func writeCeiling(b *strings.Builder, res results) {
	ceil, sat := res.ceil.kv, res.sat
	rate := orNaN(ceil, "ceiling_msgs_per_sec")
	b.WriteString("## Bare-pipeline ceiling (same broker, same Postgres, same run)\n\n")
	if len(ceil) == 0 {
		b.WriteString("Not measured (see logs/ceiling.log).\n\n")
	} else {
		fmt.Fprintf(b, "`tools/bench/ceiling`: %.0f transactional producers, %.0f records of %.0f bytes per transaction, one partition each → the broker → persist's own consumer (read_committed group consumer, one multi-row `INSERT … ON CONFLICT` per poll plus the offsets in one Postgres transaction) → a scratch database with chatpipe's schema. Producers wait while Postgres is more than 20,000 records behind, so the rate is sustained.\n\n",
			orNaN(ceil, "producers"), orNaN(ceil, "batch"), orNaN(ceil, "record_bytes"))
		fmt.Fprintf(b, "| records reaching Postgres/s | produced/s | transactions/s | window | beside: chatpipe at saturation | chatpipe ÷ ceiling |\n|---|---|---|---|---|---|\n| **%s** | %s | %s | %.0f s | %s msg/s | %s |\n\n",
			num(rate), num(orNaN(ceil, "produced_per_sec")), num(orNaN(ceil, "txn_per_sec")), orNaN(ceil, "window_secs"), num(sat.rep.AcceptedPerSec), ratio(sat.rep.AcceptedPerSec, rate))
		if bp := res.ceil.bare(); !math.IsNaN(bp.all) {
			fmt.Fprintf(b, "CPU per record over the tool's own window (its setup, warm-up and teardown left out): %s; the idle chatpipe roles %s µs.\n\n",
				bp.parts(), num(us(res.ceil.win.sum(chatpipeRoles...), int64(orNaN(ceil, "inserted")))))
		}
	}
	if pb := res.paced.bare(); !math.IsNaN(pb.all) {
		p := res.paced.kv
		fmt.Fprintf(b, "**Paced in the writers' light-load shape** (`-rate %s -producers %.0f -batch %.0f`): the same bare parts, a producer per vshard and one record per transaction, as lat1000 gives chatpipe's writers (each vshard sees a few messages a second, so nearly every transaction carries one). %s records reached Postgres a second in %s transactions over %.0f s. CPU per record over the tool's own window: %s: **%s µs in all**, %s× the flat-out ceiling's.\n\n",
			strconv.FormatFloat(orNaN(p, "rate"), 'f', -1, 64), orNaN(p, "producers"), orNaN(p, "batch"),
			num(orNaN(p, "ceiling_msgs_per_sec")), num(orNaN(p, "txn_per_sec")), orNaN(p, "window_secs"),
			pb.parts(), num(pb.all), ratio(pb.all, res.ceil.bare().all))
	}
}

// writeProfiles writes each role's CPU profile top, flat and cumulative.
func writeProfiles(b *strings.Builder, res results) {
	dir, profRunName := res.dir, res.profRunName
	fmt.Fprintf(b, "## CPU profile tops, by role (during %s)\n\n", profRunName)
	fmt.Fprintf(b, "Each role's `/debug/pprof/profile` for %.0f s inside the send phase of %s: `go tool pprof -top -nodecount=15` (flat: where the CPU is spent), then the same with `-cum` (which calls it is spent under). The raw profiles are in results/prof/. dev's profile is etcd's, and the idle gateway inside dev polling the delivery outbox. loadgen's (`--cpuprofile`) covers its whole run, connecting and conversation setup included.\n\n", orNaN(res.knobs, "prof_secs"), profRunName)
	for _, role := range append(append([]string{}, chatpipeRoles...), "dev", "loadgen") {
		top, err := os.ReadFile(filepath.Join(dir, "prof", role+".top"))
		if err != nil || len(top) == 0 {
			fmt.Fprintf(b, "### %s\n\nno profile\n\n", role)
			continue
		}
		fmt.Fprintf(b, "### %s\n\n```\n%s```\n\n", role, top)
		if cum, err := os.ReadFile(filepath.Join(dir, "prof", role+".cum")); err == nil && len(cum) > 0 {
			// (the header repeats the flat top's)
			lines := strings.Split(string(cum), "\n")
			for i, l := range lines {
				if strings.Contains(l, "flat%") {
					lines = lines[i:]
					break
				}
			}
			fmt.Fprintf(b, "%s, by cumulative time:\n\n```\n%s```\n\n", role, strings.Join(lines, "\n"))
		}
	}
}

// writeOtherFigures writes events per transaction at saturation and in
// the hot conversation, takeover times and the bare parts' benchmarks.
func writeOtherFigures(b *strings.Builder, res results) {
	dir, bench, order, hot := res.dir, res.bench, res.order, res.hot
	b.WriteString("## Other figures\n\n")
	hotD, _ := workerDelta(filepath.Join(dir, "metrics", "hot"), "send", "end")
	satD, _ := workerDelta(filepath.Join(dir, "metrics", "saturation"), "send", "end")
	oneProducer, oneTxnMS := math.NaN(), math.NaN()
	if v, ok := bench["TxnProduce/producers=1/batch=100/partitions=one"]["records/s"]; ok {
		oneProducer = v
	}
	if v, ok := bench["TxnProduce/producers=1/batch=1/partitions=one"]["txn/s"]; ok && v > 0 {
		oneTxnMS = 1000 / v
	}
	fmt.Fprintf(b, "- Saturation: %.1f events per Kafka transaction.\n", satD.eventsPerTxn())
	fmt.Fprintf(b, "- One hot conversation (20 members, offered %.0f msg/s): %s msg/s (best second %d), p99 %.1f ms, %.1f events per transaction; one transactional producer at 100 records per transaction: %s records/s.\n",
		hot.rep.Rate, num(hot.rep.AcceptedPerSec), hot.rep.PeakPerSec, hot.rep.AcceptedLat.P99MS, hotD.eventsPerTxn(), num(oneProducer))
	writePause(b, dir)
	if tk := takeovers(filepath.Join(dir, "takeover.log")); len(tk) > 0 {
		fmt.Fprintf(b, "- Takeover, claim → accepting, a joining worker taking %d vshards by hand-off: p50 %v, max %v (one bare transaction: %s ms).\n",
			len(tk), tk[len(tk)/2].Round(time.Millisecond), tk[len(tk)-1].Round(time.Millisecond), num(oneTxnMS))
	} else {
		b.WriteString("- Takeover: not measured (no takeover in the worker's log).\n")
	}
	b.WriteString("\n")
	if len(order) > 0 {
		b.WriteString("### Ceilings of the bare parts (`go test ./tools/bench -bench`)\n\n| benchmark | records/s | transactions/s | rows/s |\n|-----------|-----------|----------------|--------|\n")
		for _, name := range order {
			v := bench[name]
			fmt.Fprintf(b, "| %s | %s | %s | %s |\n", name, numOr(v, "records/s"), numOr(v, "txn/s"), numOr(v, "rows/s"))
		}
		b.WriteString("\nRecords of 350 bytes (a message record with a 100-byte body); `one` keeps a producer's records in one partition as a vshard's are, `spread` spreads one transaction over all 8 partitions; the last TxnProduce case matches the saturation run (producers = vshards, batch = its events per transaction).\n\n")
	}
}

// writeSweep writes the group-commit sweep, vshards × linger budget, when
// it was run (sweep.txt: vshards, linger budget and run name per line).
func writeSweep(b *strings.Builder, dir string) {
	if sweep, err := os.ReadFile(filepath.Join(dir, "sweep.txt")); err == nil && len(strings.TrimSpace(string(sweep))) > 0 {
		b.WriteString("## Group commit: vshards × linger budget at 1,000 msg/s\n\n")
		budget, _ := os.ReadFile(filepath.Join(dir, "sweep-budget.txt"))
		fmt.Fprintf(b, "Each row is a fresh all-in-one stack (`chatpipe dev --vshards V --linger-max L --txn-budget %s`, 2 workers in it) with the peak mix at 1,000 msg/s; the rows compare with one another, not with the figures above. The small transaction budget makes every vshard's arrivals outpace its share, so a writer lingers up to L. `off` never lingers.\n\n", strings.TrimSpace(string(budget)))
		b.WriteString("| vshards | linger budget | Kafka transactions/s | events per transaction | `accepted` p50 | `accepted` p99 | broker CPU (cores) |\n|---|---|---|---|---|---|---|\n")
		for _, line := range strings.Split(strings.TrimSpace(string(sweep)), "\n") {
			f := strings.Fields(line)
			if len(f) != 3 {
				continue
			}
			r := readRun(dir, f[2])
			d, _ := workerDelta(filepath.Join(dir, "metrics", f[2]), "send", "end")
			l := f[1]
			if strings.HasPrefix(l, "-") {
				l = "off"
			}
			tps := math.NaN()
			if r.ok {
				tps = d.commits / r.win.secs
			}
			fmt.Fprintf(b, "| %s | %s | %s | %.2f | %.1f ms | %.1f ms | %s |\n", f[0], l, num(tps), d.eventsPerTxn(),
				r.rep.AcceptedLat.P50MS, r.rep.AcceptedLat.P99MS, num(r.cores("broker")))
		}
		b.WriteString("\n")
	}
}

// writePause writes what the workers committed a second while the
// pgpause run had Postgres paused, if it ran.
func writePause(b *strings.Builder, dir string) {
	if _, err := os.Stat(filepath.Join(dir, "pgpause-secs")); err != nil {
		return
	}
	perSec, secs, ok := readPause(dir)
	if !ok {
		b.WriteString("- Postgres paused: not measured (no pause window in the snapshots).\n")
		return
	}
	fmt.Fprintf(b, "- Postgres paused (SIGSTOP) for %.0f s, %.0f msg/s offered: %s events committed a second while it did not answer (a send to a conversation its writer has cached needs no Postgres).\n",
		secs, pauseOffered, num(perSec))
}

// writeChecks writes the result of `chatpipe check` of every run, with
// the start of a failed check's output.
func writeChecks(b *strings.Builder, dir string) {
	b.WriteString("## `chatpipe check` of every run\n\n| run | result |\n|---|---|\n")
	var failed []string
	checked := []string{"lat1000", "r3000", "saturation", "one1", "hot", "pgpause"}
	if sweep, err := os.ReadFile(filepath.Join(dir, "sweep.txt")); err == nil {
		for _, line := range strings.Split(strings.TrimSpace(string(sweep)), "\n") {
			if f := strings.Fields(line); len(f) == 3 {
				checked = append(checked, f[2])
			}
		}
	}
	for _, run := range checked {
		rc, err := os.ReadFile(filepath.Join(dir, "check-"+run+".rc"))
		res := "not run"
		if err == nil {
			if strings.TrimSpace(string(rc)) == "0" {
				res = "passed"
			} else {
				res = "**failed** (exit " + strings.TrimSpace(string(rc)) + ")"
				failed = append(failed, run)
			}
		}
		fmt.Fprintf(b, "| %s | %s |\n", run, res)
	}
	b.WriteString("\n")
	for _, run := range failed {
		out, _ := os.ReadFile(filepath.Join(dir, "check-"+run+".txt"))
		lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
		if len(lines) > 20 {
			lines = lines[:20]
		}
		fmt.Fprintf(b, "`chatpipe check` of %s:\n\n```\n%s\n```\n\n", run, strings.Join(lines, "\n"))
	}
	if out, err := os.ReadFile(filepath.Join(dir, "check-lat1000.txt")); err == nil && len(out) > 0 && len(failed) == 0 {
		fmt.Fprintf(b, "`chatpipe check` of lat1000:\n\n```\n%s```\n\n", out)
	}
}
