package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/chatpipe/chatpipe/internal/promtext"
)

// What Postgres was asked over a window: run.sh's pgstat snapshots
// (pg_stat_database's transactions and pg_stat_statements' calls, per
// database) and each role's own count of its round trips
// (chatpipe_postgres_statements_total in its metrics snapshots).

// chatpipeDB is the database the stack writes; the ceiling writes a
// scratch database it drops when done.
const chatpipeDB = "chatpipe"

// pgRoles are the processes whose round trips to Postgres are counted:
// the chatpipe roles and dev (its idle gateway's delivery feed and its
// operations page).
var pgRoles = append(append([]string{}, chatpipeRoles...), "dev")

// stmt is one statement's calls and execution time over a window.
type stmt struct {
	db, text string
	calls    float64
	ms       float64
}

// pgSnap is one pgstat snapshot: commits per database, and statements by
// database and query id.
type pgSnap struct {
	commits map[string]float64
	stmts   map[string]stmt // db + " " + queryid
}

func readPGSnap(path string) (pgSnap, bool) {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return pgSnap{}, false
	}
	s := pgSnap{commits: map[string]float64{}, stmts: map[string]stmt{}}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, " ", 6)
		switch {
		case len(f) >= 4 && f[0] == "xact":
			c, _ := strconv.ParseFloat(f[2], 64)
			s.commits[f[1]] = c
		case len(f) == 6 && f[0] == "stmt":
			calls, _ := strconv.ParseFloat(f[3], 64)
			ms, _ := strconv.ParseFloat(f[4], 64)
			s.stmts[f[1]+" "+f[2]] = stmt{db: f[1], text: f[5], calls: calls, ms: ms}
		}
	}
	return s, true
}

// pgWindow is what Postgres was asked between two snapshots.
type pgWindow struct {
	ok      bool
	commits map[string]float64 // transactions committed, per database
	stmts   []stmt             // calls and time over the window, most calls first
}

// readPGWindow reads pgstat/RUN.send and .end. A statement evicted from
// pg_stat_statements in between is left out; one first seen in between
// counts from zero.
func readPGWindow(dir, run string) pgWindow {
	a, ok1 := readPGSnap(filepath.Join(dir, "pgstat", run+".send"))
	b, ok2 := readPGSnap(filepath.Join(dir, "pgstat", run+".end"))
	if !ok1 || !ok2 {
		return pgWindow{}
	}
	w := pgWindow{ok: true, commits: map[string]float64{}}
	for db, c := range b.commits {
		w.commits[db] = c - a.commits[db]
	}
	for k, s := range b.stmts {
		s.calls -= a.stmts[k].calls
		s.ms -= a.stmts[k].ms
		if s.calls > 0 {
			w.stmts = append(w.stmts, s)
		}
	}
	sort.Slice(w.stmts, func(i, j int) bool {
		if w.stmts[i].calls != w.stmts[j].calls {
			return w.stmts[i].calls > w.stmts[j].calls
		}
		return w.stmts[i].text < w.stmts[j].text
	})
	return w
}

// isTxnControl tells a transaction's begin or end, which
// pg_stat_statements counts as statements of their own.
func isTxnControl(text string) bool {
	t := strings.ToLower(strings.TrimSpace(text))
	for _, w := range []string{"begin", "commit", "rollback", "start transaction", "end"} {
		if t == w || strings.HasPrefix(t, w+" ") {
			return true
		}
	}
	return false
}

// calls is the window's statements in the databases db selects, without
// transaction control.
func (w pgWindow) calls(db func(string) bool) float64 {
	var n float64
	for _, s := range w.stmts {
		if db(s.db) && !isTxnControl(s.text) {
			n += s.calls
		}
	}
	return n
}

// batches is the calls of the most-called statement in the databases db
// selects, without transaction control: a consumer that runs each batch
// as one transaction (its insert once per batch) made about that many.
func (w pgWindow) batches(db func(string) bool) float64 {
	var n float64
	for _, s := range w.stmts {
		if db(s.db) && !isTxnControl(s.text) {
			n = max(n, s.calls)
		}
	}
	return n
}

func isChatpipeDB(db string) bool  { return db == chatpipeDB }
func notChatpipeDB(db string) bool { return db != chatpipeDB }

// roleTrips is each pgRole's round trips to Postgres over run's window,
// by kind, from its metrics snapshots; a role without both snapshots is
// left out.
func roleTrips(dir, run string) map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	for _, role := range pgRoles {
		a, err1 := promtext.ParseFile(filepath.Join(dir, "metrics", run+"."+role+".send"))
		b, err2 := promtext.ParseFile(filepath.Join(dir, "metrics", run+"."+role+".end"))
		if err1 != nil || err2 != nil || b["chatpipe_postgres_statements_total"] == nil {
			continue
		}
		m := map[string]float64{}
		for _, kind := range tripKinds {
			l := `kind="` + kind + `"`
			m[kind] = promtext.Sum(b, "chatpipe_postgres_statements_total", l) - promtext.Sum(a, "chatpipe_postgres_statements_total", l)
		}
		out[role] = m
	}
	return out
}

// tripKinds are the kinds of chatpipe_postgres_statements_total.
var tripKinds = []string{"statement", "begin", "commit", "rollback", "implicit"}

// txns is the transactions among trips: those begun, and the statements
// and batches sent outside one.
func txns(trips map[string]map[string]float64, roles ...string) float64 {
	return tripsOf(trips, "begin", roles...) + tripsOf(trips, "implicit", roles...)
}

// tripsOf sums kind over the roles.
func tripsOf(trips map[string]map[string]float64, kind string, roles ...string) float64 {
	var n float64
	for _, r := range roles {
		n += trips[r][kind]
	}
	return n
}

// per is n per accepted message of r (NaN without a count).
func per(n float64, accepted int64) float64 {
	if accepted <= 0 || math.IsNaN(n) {
		return math.NaN()
	}
	return n / float64(accepted)
}

// writePostgres writes, per run, the statements and transactions each
// role sent per accepted message (its own count), pg_stat_statements'
// and pg_stat_database's totals beside them, the same for the ceiling
// per record, and the statements that lat1000 called most.
func writePostgres(b *strings.Builder, res results) {
	b.WriteString("## Postgres: statements and transactions per accepted message, by role\n\n")
	b.WriteString("Each role counts the round trips its pools send (`chatpipe_postgres_statements_total{kind}`): its statements, and its transactions, begun explicitly or implicit (a statement or batch sent outside a transaction); dev is etcd's host and an idle gateway's delivery feed. **pg_stat_statements** is the server's count of statements in chatpipe's database over the same window (without BEGIN and COMMIT), **xact** its committed transactions (`pg_stat_database`, autovacuum's and these reads' own included). The ceiling's row is per record reaching Postgres, from pg_stat_statements over its scratch database; its transactions are its consumer's batches (the calls of its insert, once per batch).\n\n")
	cols := pgRoles
	b.WriteString("| run | " + strings.Join(cols, " | ") + " | roles' statements | roles' transactions | pg_stat_statements | xact |\n|---|" + strings.Repeat("---|", len(cols)+4) + "\n")
	for _, r := range res.runs() {
		trips := roleTrips(res.dir, r.name)
		pw := readPGWindow(res.dir, r.name)
		if len(trips) == 0 && !pw.ok {
			continue
		}
		fmt.Fprintf(b, "| %s |", r.name)
		for _, role := range cols {
			if _, ok := trips[role]; !ok {
				b.WriteString(" — |")
				continue
			}
			fmt.Fprintf(b, " %s / %s |", num(per(trips[role]["statement"], r.rep.Accepted)), num(per(txns(trips, role), r.rep.Accepted)))
		}
		pgCalls, xact := math.NaN(), math.NaN()
		if pw.ok {
			pgCalls, xact = pw.calls(isChatpipeDB), pw.commits[chatpipeDB]
		}
		fmt.Fprintf(b, " **%s** | **%s** | %s | %s |\n",
			num(per(tripsOf(trips, "statement", cols...), r.rep.Accepted)), num(per(txns(trips, cols...), r.rep.Accepted)),
			num(per(pgCalls, r.rep.Accepted)), num(per(xact, r.rep.Accepted)))
	}
	if cw := readPGWindow(res.dir, "ceiling"); cw.ok {
		in := int64(orNaN(res.ceil.kv, "inserted"))
		fmt.Fprintf(b, "| ceiling (per record) |%s — | — | %s | %s |\n", strings.Repeat(" — |", len(cols)),
			num(per(cw.calls(notChatpipeDB), in)), num(per(cw.batches(notChatpipeDB), in)))
	}
	b.WriteString("\nEach role's cell is statements / transactions per accepted message.\n\n")
	writeTopStatements(b, res, res.lat, 12)
}

// writeTopStatements writes the n statements run r called most in
// chatpipe's database, per accepted message, with their mean time.
func writeTopStatements(b *strings.Builder, res results, r runFig, n int) {
	pw := readPGWindow(res.dir, r.name)
	if !pw.ok {
		return
	}
	fmt.Fprintf(b, "The statements %s called most (pg_stat_statements, chatpipe's database):\n\n| calls per message | mean ms | statement |\n|---|---|---|\n", r.name)
	shown := 0
	for _, s := range pw.stmts {
		if s.db != chatpipeDB || shown == n {
			continue
		}
		text := s.text
		if len(text) > 140 {
			text = text[:140] + "…"
		}
		text = strings.ReplaceAll(text, "|", `\|`)
		fmt.Fprintf(b, "| %s | %.3f | `%s` |\n", num(per(s.calls, r.rep.Accepted)), s.ms/s.calls, text)
		shown++
	}
	b.WriteString("\n")
}

// idleFig is the stack with nothing sent: the cores every process kept
// busy and the round trips to Postgres over the window.
type idleFig struct {
	ok        bool
	secs      float64
	cores     float64            // every process of the stack
	byProc    map[string]float64 // cores per process
	roleTrips float64            // every pgRole's round trips
	pgCalls   float64            // pg_stat_statements, chatpipe's database
	pgCallsOK bool
	trips     map[string]map[string]float64 // each pgRole's round trips, by kind
}

func readIdle(dir string) idleFig {
	w, ok := cpuWindow(dir, "idle")
	if !ok || w.secs <= 0 {
		return idleFig{}
	}
	f := idleFig{ok: true, secs: w.secs, cores: w.all() / w.secs, byProc: map[string]float64{}}
	for k, v := range w.cpu {
		f.byProc[k] = v / w.secs
	}
	trips := roleTrips(dir, "idle")
	f.trips = trips
	for _, kind := range tripKinds {
		if kind != "implicit" { // (counted besides its statements)
			f.roleTrips += tripsOf(trips, kind, pgRoles...)
		}
	}
	if pw := readPGWindow(dir, "idle"); pw.ok {
		f.pgCalls, f.pgCallsOK = pw.calls(isChatpipeDB), true
	}
	return f
}
