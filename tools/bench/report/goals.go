package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// The goals are ratios to anchors: the bare pipeline's CPU per record
// (tools/bench/ceiling, measured in the same run), the write floor (same
// run), and a well-known Go real-time server measured on this kind of
// machine, whose figures are constants here.

// centrifuge v0.40.1 (the library under Centrifugo) on this kind of 2-core
// machine on 2026-12-04, with 4,000 connections (2,000 users × 2 devices)
// and a group-chat fan-out of 8.9 deliveries per message: server CPU per
// delivered frame at 1,000 msg/s, and per published message at its own
// saturation (12,300 msg/s). run.sh does not measure it again.
const (
	centrifugeUSPerFrame1000 = 31.4
	centrifugeFanout         = 8.9
	centrifugeSatUSPerMsg    = 93.0
	centrifugeWhen           = "centrifuge v0.40.1 on this kind of machine, 2026-12-04, not this run"
)

// centrifugeCores1000 is the cores centrifuge kept busy at 1,000 msg/s.
func centrifugeCores1000() float64 {
	return centrifugeUSPerFrame1000 * centrifugeFanout * 1000 / 1e6
}

// behindRoles are the processes behind the gateway.
var behindRoles = []string{"w1", "w2", "persist", "broker", "postgres"}

// stackProcs are every process of the stack but loadgen.
var stackProcs = append(append([]string{}, chatpipeRoles...), "dev", "broker", "postgres")

// bare is the ceiling's CPU per record reaching Postgres: its own process
// (producers and consumer), the broker and Postgres, and Postgres alone.
type bare struct {
	all, proc, broker, pg float64
}

func (res results) bare() bare { return res.ceil.bare() }

// pacedFor is the paced ceiling's bare parts for a run offered its rate;
// ok is false for any other run, or when the paced ceiling was not
// measured.
func (res results) pacedFor(r runFig) (b bare, ok bool) {
	b = res.paced.bare()
	return b, r.ok && !math.IsNaN(b.all) && r.rep.Rate == orNaN(res.paced.kv, "rate")
}

// bare is the run's CPU per record reaching Postgres (NaN when its CPU
// window or its records are missing).
func (c ceilRun) bare() bare {
	in := int64(orNaN(c.kv, "inserted"))
	if !c.ok || in <= 0 {
		return bare{math.NaN(), math.NaN(), math.NaN(), math.NaN()}
	}
	b := bare{proc: us(orNaN(c.kv, "cpu_secs"), in), broker: us(c.win.cpu["broker"], in), pg: us(c.win.cpu["postgres"], in)}
	b.all = b.proc + b.broker + b.pg
	return b
}

// parts names b's parts, for a sentence.
func (b bare) parts() string {
	return fmt.Sprintf("the ceiling process (producers and consumer) %s µs, broker %s µs, Postgres %s µs", num(b.proc), num(b.broker), num(b.pg))
}

func (b bare) String() string {
	return fmt.Sprintf("bare parts, same run: %s µs per record (producers and consumer %s, broker %s, Postgres %s)", num(b.all), num(b.proc), num(b.broker), num(b.pg))
}

// sumUS is the named processes' CPU per accepted message of r.
func (r runFig) sumUS(names ...string) float64 {
	if !r.ok {
		return math.NaN()
	}
	return us(r.win.sum(names...), r.rep.Accepted)
}

// pause is the pgpause run's figure: events the workers committed a second
// while Postgres was paused, and the pause's length.
func readPause(dir string) (perSec, secs float64, ok bool) {
	raw, err := os.ReadFile(filepath.Join(dir, "pgpause-secs"))
	if err != nil {
		return 0, 0, false
	}
	secs, err = strconv.ParseFloat(strings.TrimSpace(string(raw)), 64)
	d, derr := workerDelta(filepath.Join(dir, "metrics", "pgpause"), "pause", "resume")
	if err != nil || derr != nil || secs <= 0 {
		return 0, 0, false
	}
	return d.events / secs, secs, true
}

// pauseOffered is the pgpause run's offered rate (run.sh's).
const pauseOffered = 1000.0

// goalRows are the figures the goals set, each beside its same-run anchor.
func goalRows(res results) []goalRow {
	lat, mid, sat, fl := res.lat, res.mid, res.sat, res.floor
	bp := res.bare()
	idle := readIdle(res.dir)
	var rows []goalRow

	// 1. Behind the gateway ≤ 2× the bare parts.
	for _, r := range []runFig{lat, mid, sat} {
		rows = append(rows, goalRow{
			figure:   fmt.Sprintf("1. behind the gateway (w1 + w2 + persist + broker + Postgres; persist applies the read model too), CPU per accepted message, %s", rateName(r)),
			measured: r.sumUS(behindRoles...), unit: "µs", target: 2 * bp.all, atMost: true,
			beside: "2 × " + bp.String(),
			why:    behindWhy(res, r)})
	}
	// 2. Postgres ≤ 2× the ceiling's Postgres; nothing while idle.
	for _, r := range []runFig{lat, mid, sat} {
		rows = append(rows, goalRow{
			figure:   fmt.Sprintf("2. Postgres CPU per accepted message, %s", rateName(r)),
			measured: r.roleUS("postgres"), unit: "µs", target: 2 * bp.pg, atMost: true,
			beside: fmt.Sprintf("2 × the ceiling's Postgres per record, same run (%s µs)", num(bp.pg)),
			why:    pgWhy(res, r)})
	}
	idleTrips := math.NaN()
	if len(idle.trips) > 0 {
		idleTrips = idle.roleTrips
	}
	rows = append(rows, goalRow{
		figure:   fmt.Sprintf("2. round trips to Postgres from the chatpipe roles (and dev) while nothing is sent, %.0f s", idle.secs),
		measured: idleTrips, unit: "", target: 0, atMost: true, zeroOK: true,
		beside: fmt.Sprintf("pg_stat_statements over the same window, chatpipe's database: %s statements", num(orNaNIf(idle.pgCalls, idle.pgCallsOK))),
		why:    "see \"Idle\" below for who sent them"})
	// 3. The whole stack at 1,000 msg/s, and idle.
	stackTarget := centrifugeCores1000() + 2*bp.all*1000/1e6
	rows = append(rows, goalRow{
		figure:   "3. the whole stack (every process but loadgen) at 1,000 msg/s, cores kept busy",
		measured: lat.cores(stackProcs...), unit: "cores", target: stackTarget, atMost: true,
		beside: fmt.Sprintf("%s cores (%s) + 2 × the flat-out bare parts' CPU per record × 1,000 records/s (%s cores)", num(centrifugeCores1000()), centrifugeWhen, num(2*bp.all*1000/1e6)),
		why:    stackWhy(lat)})
	idleCores := math.NaN()
	if idle.ok {
		idleCores = idle.cores
	}
	rows = append(rows, goalRow{
		figure:   fmt.Sprintf("3. the idle stack (every process, nothing sent for %.0f s), cores kept busy", idle.secs),
		measured: idleCores, unit: "cores", target: 0.01, atMost: true,
		beside: "1 % of a core",
		why:    idleWhy(idle)})
	// 4. Latency at 1,000 msg/s.
	rows = append(rows,
		goalRow{figure: "4. `accepted` latency p99 at 1,000 msg/s", measured: lat.rep.AcceptedLat.P99MS, unit: "ms", target: 10, atMost: true,
			beside: fmt.Sprintf("p50 %.1f ms", lat.rep.AcceptedLat.P50MS),
			why:    fmt.Sprintf("every process together kept %s cores busy, chatpipe %s", num(lat.cores()), num(lat.cores(chatpipeRoles...)))},
		goalRow{figure: "4. delivery latency p99 at 1,000 msg/s (send → `event` at every member's device, after persist)", measured: lat.rep.DeliveryLat.P99MS, unit: "ms", target: 30, atMost: true,
			beside: fmt.Sprintf("p50 %.1f ms", lat.rep.DeliveryLat.P50MS),
			why:    "a delivery waits for persist's batch (events and read model in one transaction) and the gateway feed's read; see the persist and gateway profile tops"})
	// 5. The whole stack at saturation.
	rows = append(rows, goalRow{
		figure:   fmt.Sprintf("5. the whole stack (every process but loadgen) at saturation (%s accepted/s), CPU per accepted message", num(sat.rep.AcceptedPerSec)),
		measured: sat.sumUS(stackProcs...), unit: "µs", target: centrifugeSatUSPerMsg + 2*bp.all, atMost: true,
		beside: fmt.Sprintf("%s µs per message at 12,300 msg/s (%s) + 2 × the bare parts (%s µs)", num(centrifugeSatUSPerMsg), centrifugeWhen, num(bp.all)),
		why:    stackUSWhy(sat)})
	// 6. A Postgres outage is not a write outage.
	perSec, secs, ok := readPause(res.dir)
	if !ok {
		perSec = math.NaN()
	}
	rows = append(rows, goalRow{
		figure:   fmt.Sprintf("6. events committed a second while Postgres is paused (SIGSTOP, %.0f s), %.0f msg/s offered", secs, pauseOffered),
		measured: perSec, unit: "events/s", target: 0.95 * pauseOffered, atMost: false,
		beside: fmt.Sprintf("the offered rate (%.0f msg/s), less 5 %% for the second-to-second jitter of loadgen's schedule", pauseOffered),
		why:    "a send to a conversation its writer does not hold needs Postgres to load it"})
	// 7. The gateway stays at parity.
	for _, r := range []runFig{lat, mid} {
		ws, shaped := fl.wsFor(r.name)
		shape, also := "at the floor's rate", fmt.Sprintf("a bare TCP write: %s µs", num(fl.one))
		if shaped {
			shape, also = "in this run's shape", fmt.Sprintf("at %s frames/s to %.0f: %s µs", num(fl.ws.rate), fl.ws.conns, num(fl.ws.us))
		}
		rows = append(rows, goalRow{
			figure:   fmt.Sprintf("7. gateway CPU per delivered event (all its work, accepting included), %s", rateName(r)),
			measured: r.gatewayPerDelivery(), unit: "µs", target: ws.us, atMost: true,
			beside: fmt.Sprintf("a bare websocket server's CPU per frame %s (%.0f connections, %s frames/s), same run (\"Write floor\"; %s)", shape, ws.conns, num(ws.rate), also),
			why:    fmt.Sprintf("the gateway's whole CPU is %s µs per accepted message; ", num(r.roleUS("gateway"))) + strings.TrimPrefix(fl.gatewayWhy(r), "; ")})
	}
	return rows
}

func orNaNIf(v float64, ok bool) float64 {
	if !ok {
		return math.NaN()
	}
	return v
}

// rateName names a run by its load.
func rateName(r runFig) string {
	if r.name == "saturation" {
		return fmt.Sprintf("at saturation (%s accepted/s of %.0f offered)", num(r.rep.AcceptedPerSec), r.rep.Rate)
	}
	return fmt.Sprintf("at %s msg/s", strconv.FormatFloat(r.rep.Rate, 'f', -1, 64))
}

// share lists the named processes' µs per message of r, largest first.
func share(r runFig, names ...string) string {
	type part struct {
		n string
		v float64
	}
	var ps []part
	for _, n := range names {
		ps = append(ps, part{n, r.roleUS(n)})
	}
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].v > ps[j].v })
	var s []string
	for _, p := range ps {
		s = append(s, fmt.Sprintf("%s %s", p.n, num(p.v)))
	}
	return strings.Join(s, ", ")
}

func behindWhy(res results, r runFig) string {
	dir := res.dir
	if !r.ok {
		return "no CPU window"
	}
	w := fmt.Sprintf("µs per message: %s; context switches per message behind the gateway %s", share(r, behindRoles...), num(r.switchesPer(behindRoles...)))
	if d, err := workerDelta(filepath.Join(dir, "metrics", r.name), "send", "end"); err == nil && d.commits > 0 {
		// Each Kafka transaction is at least three requests to the broker
		// (add the partition, produce, end the transaction), whatever it
		// carries; the bare parts carry 50 records in one.
		w += fmt.Sprintf("; %s events per Kafka transaction (the ceiling: %.0f records)", num(d.eventsPerTxn()), orNaN(res.ceil.kv, "batch"))
	}
	if pb, ok := res.pacedFor(r); ok {
		w += fmt.Sprintf("; the bare parts paced at this rate in the writers' shape (a producer per vshard, one record per transaction, same run) cost %s µs per record, so this is %s× them (see the ceiling section)", num(pb.all), ratio(r.sumUS(behindRoles...), pb.all))
	}
	return w + "; see the profile tops and the Postgres section"
}

func pgWhy(res results, r runFig) string {
	trips := roleTrips(res.dir, r.name)
	pw := readPGWindow(res.dir, r.name)
	if len(trips) == 0 {
		return "the roles' round trips were not counted in this run"
	}
	s := fmt.Sprintf("%s statements and %s transactions per message from the roles", num(per(tripsOf(trips, "statement", pgRoles...), r.rep.Accepted)), num(per(txns(trips, pgRoles...), r.rep.Accepted)))
	if pw.ok {
		s += fmt.Sprintf(", %s transactions per message in pg_stat_database", num(per(pw.commits[chatpipeDB], r.rep.Accepted)))
	}
	if pb, ok := res.pacedFor(r); ok {
		s += fmt.Sprintf("; the bare parts paced at this rate in the writers' shape cost Postgres %s µs per record (same run)", num(pb.pg))
	}
	return s + "; see the Postgres section"
}

func stackWhy(r runFig) string {
	if !r.ok {
		return "no CPU window"
	}
	return fmt.Sprintf("cores by process: gateway %s, w1 %s, w2 %s, persist %s, dev %s, broker %s, Postgres %s; %s context switches per message",
		num(r.cores("gateway")), num(r.cores("w1")), num(r.cores("w2")), num(r.cores("persist")),
		num(r.cores("dev")), num(r.cores("broker")), num(r.cores("postgres")), num(r.switchesPer(stackProcs...)))
}

func stackUSWhy(r runFig) string {
	if !r.ok {
		return "no CPU window"
	}
	return "µs per message: " + share(r, stackProcs...)
}

func idleWhy(f idleFig) string {
	if !f.ok {
		return "not measured"
	}
	var s []string
	for _, n := range stackProcs {
		if v, ok := f.byProc[n]; ok {
			s = append(s, fmt.Sprintf("%s %.2f %%", n, 100*v))
		}
	}
	return "by process, % of a core: " + strings.Join(s, ", ")
}

// writeIdle writes the idle window: CPU by process and the round trips
// to Postgres by role.
func writeIdle(b *strings.Builder, res results) {
	f := readIdle(res.dir)
	if !f.ok {
		return
	}
	fmt.Fprintf(b, "## Idle\n\nThe stack with nothing sent for %.0f s (after the warm-up and 20 s to settle). %% of a core by process:\n\n| %s | all |\n|%s---|\n|", f.secs, strings.Join(stackProcs, " | "), strings.Repeat("---|", len(stackProcs)))
	for _, n := range stackProcs {
		fmt.Fprintf(b, " %.2f |", 100*f.byProc[n])
	}
	fmt.Fprintf(b, " **%.2f** |\n\n", 100*f.cores)
	var s []string
	for _, role := range pgRoles {
		if m, ok := f.trips[role]; ok {
			s = append(s, fmt.Sprintf("%s %.0f", role, m["statement"]+m["begin"]+m["commit"]+m["rollback"]))
		}
	}
	if len(s) > 0 {
		fmt.Fprintf(b, "Round trips to Postgres over the window, by role: %s. pg_stat_statements counted %s statements in chatpipe's database.\n\n", strings.Join(s, ", "), num(orNaNIf(f.pgCalls, f.pgCallsOK)))
	}
}
