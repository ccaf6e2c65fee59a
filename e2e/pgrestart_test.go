package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestPostgresRestartUnderLoad stops Postgres twice while clients send
// (docs/reliability.md): first with a fast shutdown, then with an
// immediate one (no checkpoint: the next start runs crash recovery), each
// time for 2 s before starting it again on the same data dir and port.
//
// A writer needs Postgres for a conversation it has not loaded, and for a
// client_message_id its memory and its filter of the conversation's known
// keys cannot rule out. A conversation it has cached needs none for a new
// send: the load's conversations, created after the writer took over,
// keep being accepted while Postgres is down (a Postgres outage is not a
// write outage). Probe conversations, created before the writer that now
// owns them took over, are ones it has never loaded: while Postgres is
// down it answers them unavailable (nothing written), and the gateway
// sends them again until Postgres is back (within its 5 s route timeout),
// so clients see a late answer, never a made-up one. Half the probes retry
// a send accepted then (load and dedupe lookup: the answer must be that
// first seq and message id), the others send a new message. Probes run
// from just before each stop to just after each start, so some are in the
// writer's hands when Postgres goes away. No answer may be wrong: no probe
// gets a rejection other than unavailable (the probes and the load send as
// members; the load fails the test on any other answer too). After each
// start persist must catch up with what was accepted before it (its events
// and the read model, stored in one transaction) within a bound, and at
// the end the world check holds (nothing lost, nothing doubled) and the
// read model equals the log's.
func TestPostgresRestartUnderLoad(t *testing.T) {
	sharing(t, 75, 18)
	dir := t.TempDir()
	pg := startTestPG(t, filepath.Join(dir, "pg"))
	dev := startDev(t, dir, "--workers", "0", "--database-url", pg.url)
	wa := dev.StartWorker(t, "wa")
	stacktest.WaitOwned(t, 120*time.Second, "wa to own every vshard", dev.EP, dev.EP.All(), "wa", dev.EP.All())
	probes := newPGProbes(t, dev, 240)
	stacktest.WaitFor(t, 60*time.Second, "persist to store the probe conversations", func() bool {
		return pgCountStored(t, pg.url, probes.firsts) == len(probes.firsts)
	})
	// wb takes over from a stopped wa: its replay starts at persist's
	// offsets, past the probes, so it holds none of them in memory.
	wa.Stop()
	wb := dev.StartWorker(t, "wb")
	stacktest.WaitOwned(t, 120*time.Second, "wb to own every vshard", dev.EP, dev.EP.All(), "wb", dev.EP.All())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("wb's log:\n%s\ndev's log:\n%s", stacktest.Tail(wb.Log), stacktest.Tail(filepath.Join(dev.Dir, "dev.log")))
		}
	})

	load := stacktest.StartLoad(t, dev.Dev, 10, 20)
	load.WaitAbove(t, 60*time.Second, "load to flow", 200)
	for phase, stop := range []struct {
		name string
		stop func()
		// in the server's log after the start that follows
		startLog string
	}{
		{"fast", pg.stopFast, "database system was shut down at"},
		{"immediate", pg.stopImmediate, "database system was not properly shut down; automatic recovery in progress"},
	} {
		const stateErr = "cannot load conversation state"
		errsBefore := countLines(wb.Log, stateErr)
		startsBefore := countLines(pg.logPath(), stop.startLog)
		probes.run(phase)
		time.Sleep(100 * time.Millisecond)
		stopAt := time.Now()
		stop.stop()
		downAt := time.Now()
		time.Sleep(2 * time.Second)
		upAt := time.Now()
		pg.start()
		upDone := time.Now()
		backlog := load.Snapshot()
		if countLines(pg.logPath(), stop.startLog) == startsBefore {
			t.Errorf("%s shutdown: the server did not log %q at the start after it", stop.name, stop.startLog)
		}
		caughtUp := pgCatchUp(t, pg.url, backlog, upDone)
		time.Sleep(time.Until(upDone.Add(time.Second))) // probes go on a little after the start
		probes.halt()
		n := load.Count()
		load.WaitAbove(t, 60*time.Second, "load to go on after the restart", n+300)
		// A send decided just before the stop may be answered a moment
		// after it (its commit): count from half a second after it.
		quiet := downAt.Add(500 * time.Millisecond)
		down := 0
		var again time.Duration // from the start to the first send accepted after it
		for _, a := range load.Snapshot() {
			if a.AcceptedAt.After(quiet) && a.AcceptedAt.Before(upAt) {
				down++
			}
			if d := a.AcceptedAt.Sub(upDone); d > 0 && (again == 0 || d < again) {
				again = d
			}
		}
		errs := countLines(wb.Log, stateErr) - errsBefore
		t.Logf("%s shutdown took %v, start %v; %d of the load's sends accepted while Postgres was down (%.0f/s); wb answered %d batches unavailable for want of state (Postgres down or starting); after the start: sends accepted again within %v, persist stored and projected the %d accepted before it within %v",
			stop.name, downAt.Sub(stopAt).Round(time.Millisecond), upDone.Sub(upAt).Round(time.Millisecond),
			down, float64(down)/upAt.Sub(quiet).Seconds(), errs, again.Round(time.Millisecond),
			len(backlog), caughtUp.Round(time.Millisecond))
		if down == 0 {
			t.Errorf("%s shutdown: no send to the load's conversations, which wb holds, was accepted while Postgres was down", stop.name)
		}
		if errs == 0 {
			t.Errorf("%s shutdown: wb logged no %q while Postgres was down", stop.name, stateErr)
		}
		// The bound: persist retries a failed batch with a backoff of at
		// most 5 s (1.6 s after 2 s of failures), and the backlog is small:
		// what was accepted before the stop and not yet stored, since
		// nothing is accepted while Postgres is down.
		if caughtUp > 20*time.Second {
			t.Errorf("%s shutdown: persist caught up %v after the start; want within 20 s", stop.name, caughtUp)
		}
		probes.judge(phase, stopAt, downAt, upAt, upDone)
	}
	accepted := append(load.Finish(), probes.accepted()...)
	t.Logf("%d sends accepted", len(accepted))
	checkWorld(t, dev.EP, accepted)
	checkReadModel(t, dev.EP)
}

// pgProbes sends to conversations the current writer holds no state of.
type pgProbes struct {
	t       *testing.T
	clients []*client // one per prober: user pu1..puN, members of every probe conversation
	firsts  []acceptedMsg
	phases  [2][][]int // per phase, per prober: the conversations it probes

	mu       sync.Mutex
	attempts []probeAttempt
	answered map[int]bool        // conversations with a final answer
	firstTry map[int]time.Time   // when a conversation's probe was first sent
	sent     map[int]acceptedMsg // accepted new sends
	stop     chan struct{}
	wg       sync.WaitGroup
}

type probeAttempt struct {
	conv      int
	sent, got time.Time
	reply     *protocol.Reply
}

const probers = 8 // probing clients, each as its own member

// newPGProbes creates n probe conversations pc0…, owned by po0… with
// members pu1…pu8; in each, its prober's user sends one message.
func newPGProbes(t *testing.T, dev *devProc, n int) *pgProbes {
	t.Helper()
	p := &pgProbes{t: t, firsts: make([]acceptedMsg, n), answered: map[int]bool{}, firstTry: map[int]time.Time{}, sent: map[int]acceptedMsg{}}
	var members []string
	for k := 0; k < probers; k++ {
		members = append(members, fmt.Sprintf("pu%d", k+1))
		p.clients = append(p.clients, dev.Dial(t, members[k]))
	}
	var wg sync.WaitGroup
	for k := 0; k < probers; k++ {
		owner := dev.Dial(t, fmt.Sprintf("po%d", k))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := k; i < n; i += probers {
				conv := fmt.Sprintf("pc%d", i)
				r, err := owner.Do(map[string]any{"op": "create", "conversation_id": conv, "members": members})
				for start := time.Now(); err == nil && (r.Code == protocol.CodeUnavailable || r.Code == protocol.CodeRateLimited) && time.Since(start) < time.Minute; {
					time.Sleep(time.Duration(r.RetryAfterMS) * time.Millisecond)
					r, err = owner.Do(map[string]any{"op": "create", "conversation_id": conv, "members": members})
				}
				if err != nil || (r.Op != protocol.OpAccepted && r.Code != protocol.CodeConflict) {
					t.Errorf("create %s: %+v %v", conv, r, err)
					return
				}
				sent := time.Now()
				r, err = p.clients[k].SendRetrying(conv, conv+"-first", "first")
				if err != nil || r.Op != protocol.OpAccepted {
					t.Errorf("first send in %s: %+v %v", conv, r, err)
					return
				}
				p.firsts[i] = acceptedMsg{Conv: conv, ClientMessageID: conv + "-first", MessageID: r.MessageID, Sender: members[k], Seq: r.Seq, SentAt: sent, AcceptedAt: time.Now()}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for ph := range p.phases {
		p.phases[ph] = make([][]int, probers)
		for i := ph * n / 2; i < (ph+1)*n/2; i++ {
			p.phases[ph][i%probers] = append(p.phases[ph][i%probers], i)
		}
	}
	return p
}

// request is conversation i's probe: a retry of its first send, or a new
// send.
func (p *pgProbes) request(i int) (map[string]any, bool) {
	conv := fmt.Sprintf("pc%d", i)
	if (i/probers)%2 == 0 {
		return map[string]any{"op": "send", "conversation_id": conv, "client_message_id": conv + "-first", "body": "first"}, true
	}
	return map[string]any{"op": "send", "conversation_id": conv, "client_message_id": conv + "-new", "body": "new"}, false
}

// run starts the probers of phase: each sends its conversations' probes in
// turn, 60 ms apart (under the gateway's 20 commands/s per user), and
// sends a conversation's probe again while it is answered unavailable (or
// rate_limited), until halt.
func (p *pgProbes) run(phase int) {
	p.stop = make(chan struct{})
	for k := 0; k < probers; k++ {
		pending := append([]int(nil), p.phases[phase][k]...)
		cl := p.clients[k]
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			time.Sleep(time.Duration(k) * 60 * time.Millisecond / probers) // spread out over the 60 ms
			for len(pending) > 0 {
				select {
				case <-p.stop:
					return
				case <-time.After(60 * time.Millisecond):
				}
				i := pending[0]
				pending = pending[1:]
				req, _ := p.request(i)
				sent := time.Now()
				r, err := cl.Do(req)
				if err != nil {
					p.t.Errorf("probe pc%d: %v", i, err)
					return
				}
				p.mu.Lock()
				if _, ok := p.firstTry[i]; !ok {
					p.firstTry[i] = sent
				}
				p.attempts = append(p.attempts, probeAttempt{conv: i, sent: sent, got: time.Now(), reply: r})
				p.mu.Unlock()
				if r.Code == protocol.CodeUnavailable || r.Code == protocol.CodeRateLimited {
					pending = append(pending, i)
					continue
				}
				p.final(i, r)
			}
		}()
	}
}

// halt stops the probers.
func (p *pgProbes) halt() {
	close(p.stop)
	p.wg.Wait()
}

// final checks conversation i's first answer that is not a retry-later.
func (p *pgProbes) final(i int, r *protocol.Reply) {
	_, retryFirst := p.request(i)
	f := p.firsts[i]
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answered[i] = true
	switch {
	case r.Op != protocol.OpAccepted:
		p.t.Errorf("probe pc%d (retry of its first send: %v) answered %+v: a wrong rejection", i, retryFirst, r)
	case retryFirst && (r.Seq != f.Seq || r.MessageID != f.MessageID):
		p.t.Errorf("retry of pc%d's first send accepted as seq %d %s, first accepted as seq %d %s", i, r.Seq, r.MessageID, f.Seq, f.MessageID)
	case !retryFirst:
		p.sent[i] = acceptedMsg{Conv: f.Conv, ClientMessageID: f.Conv + "-new", MessageID: r.MessageID, Sender: f.Sender, Seq: r.Seq, SentAt: p.firstTry[i], AcceptedAt: time.Now()}
	}
}

// judge checks phase's attempts: none was answered while Postgres was
// down but unavailable, and some were sent before Postgres came back and
// answered (after final checked the answer) only once it had; then it
// sends the probes that got no final answer until they get one.
func (p *pgProbes) judge(phase int, stopAt, downAt, upAt, upDone time.Time) {
	t := p.t
	inPhase := map[int]bool{}
	for _, is := range p.phases[phase] {
		for _, i := range is {
			inPhase[i] = true
		}
	}
	p.mu.Lock()
	var early, held, inFlight, late, retryLater int
	var heldFor time.Duration // the longest a held probe waited after the start
	for _, a := range p.attempts {
		if !inPhase[a.conv] {
			continue
		}
		// (An attempt sent before Postgres was down may have had its state
		// loaded before: its commit needs only Kafka, and accepted is
		// right. Only one sent while it was down must find it down.)
		if a.sent.After(downAt) && a.got.Before(upAt) {
			if a.reply.Code != protocol.CodeUnavailable && a.reply.Code != protocol.CodeRateLimited {
				t.Errorf("probe pc%d sent %v after the stop was answered while Postgres was down: %+v",
					a.conv, a.sent.Sub(stopAt).Round(time.Millisecond), a.reply)
			}
			retryLater++
		}
		switch {
		case a.got.Before(stopAt):
			early++
		case a.sent.Before(upAt) && a.got.After(upAt):
			held++
			if a.sent.Before(stopAt) {
				inFlight++
			}
			heldFor = max(heldFor, a.got.Sub(upDone))
		case !a.sent.Before(upAt):
			late++
		}
	}
	p.mu.Unlock()
	var open []int
	for i := range inPhase {
		p.mu.Lock()
		done := p.answered[i]
		_, tried := p.firstTry[i]
		p.mu.Unlock()
		if tried && !done {
			open = append(open, i)
		}
	}
	sort.Ints(open)
	for _, i := range open {
		req, _ := p.request(i)
		r, err := p.clients[i%probers].SendRetrying(fmt.Sprintf("pc%d", i), req["client_message_id"].(string), req["body"].(string))
		if err != nil {
			t.Fatalf("probe pc%d: %v", i, err)
		}
		p.final(i, r)
	}
	t.Logf("probes: %d answered before the stop; %d sent before the start (%d of them before the stop) and answered after it, at most %v after Postgres accepted connections again; %d answered unavailable while Postgres was down; %d sent after the start; %d finished after the probing",
		early, held, inFlight, heldFor.Round(time.Millisecond), retryLater, late, len(open))
	if held == 0 {
		t.Error("no probe was waiting for an answer while Postgres was down")
	}
}

// accepted is what the probes were told was accepted: the first sends and
// the new sends.
func (p *pgProbes) accepted() []acceptedMsg {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := append([]acceptedMsg(nil), p.firsts...)
	for _, a := range p.sent {
		out = append(out, a)
	}
	return out
}

// pgCountStored counts the accepted messages whose (conversation, seq) is
// in Postgres.
func pgCountStored(t *testing.T, dbURL string, msgs []acceptedMsg) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	convs, seqs := make([]string, len(msgs)), make([]int64, len(msgs))
	for i, m := range msgs {
		convs[i], seqs[i] = m.Conv, m.Seq
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM unnest($1::text[], $2::bigint[]) AS k(c, s)
		JOIN events e ON e.conversation_id = k.c AND e.seq = k.s`, convs, seqs).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// pgCatchUp waits until Postgres holds every message of backlog and the
// read model's last_seq of each conversation covers them (persist stores
// both in one transaction), and returns how long after since that took.
func pgCatchUp(t *testing.T, dbURL string, backlog []acceptedMsg, since time.Time) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	convs, seqs := make([]string, len(backlog)), make([]int64, len(backlog))
	last := map[string]int64{}
	for i, m := range backlog {
		convs[i], seqs[i] = m.Conv, m.Seq
		last[m.Conv] = max(last[m.Conv], m.Seq)
	}
	var lconvs []string
	var lseqs []int64
	for c, s := range last {
		lconvs, lseqs = append(lconvs, c), append(lseqs, s)
	}
	for {
		var have, covered int
		err := conn.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM unnest($1::text[], $2::bigint[]) AS k(c, s) JOIN events e ON e.conversation_id = k.c AND e.seq = k.s),
			(SELECT count(*) FROM unnest($3::text[], $4::bigint[]) AS k(c, s) JOIN conversations v ON v.conversation_id = k.c AND v.last_seq >= k.s)`,
			convs, seqs, lconvs, lseqs).Scan(&have, &covered)
		if err != nil {
			t.Fatal(err)
		}
		if have == len(backlog) && covered == len(lconvs) {
			return time.Since(since)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("60 s after the start: Postgres holds %d of the %d messages accepted before it; the read model covers %d of %d conversations",
				have, len(backlog), covered, len(lconvs))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// checkReadModel checks the read model against the committed log once
// persist has caught up with it, and returns the log's rows: membership
// periods equal those folded from the log, and the delivery rows cover
// each conversation's seqs from 1 to its last, each seq once. One
// exception: a batch whose commit succeeded but whose answer was lost (the
// connection closed by the shutdown) is applied again, harmlessly by
// design (logsink.Config.Handle) except that it adds a second delivery
// row, equal to the one before it, whose events devices drop as
// duplicates. Such rows are counted and left out.
func checkReadModel(t *testing.T, ep endpoints) []row {
	t.Helper()
	rows := readLog(t, ep)
	waitProjected(t, ep, len(rows))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := connectPG(ctx, t, ep.Postgres)

	got := readPeriods(ctx, t, conn)
	if g, w := fmt.Sprint(sortedPeriods(got)), fmt.Sprint(sortedPeriods(periods(rows))); g != w {
		t.Errorf("membership periods in Postgres differ from the log's:\n got %s\nwant %s", g, w)
	}

	lastSeq := map[string]int64{}
	for _, r := range rows {
		lastSeq[r.Conv] = max(lastSeq[r.Conv], r.Seq)
	}
	ranges := map[string][][2]int64{}
	var convs []string
	var from, to []int64
	drows, err := conn.Query(ctx, `SELECT conversation_ids, from_seqs, to_seqs FROM delivery_outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	deliveryRows, again := 0, 0
	prev := ""
	if _, err := pgx.ForEachRow(drows, []any{&convs, &from, &to}, func() error {
		deliveryRows++
		this := fmt.Sprint(convs, from, to)
		if this == prev {
			again++
			return nil
		}
		prev = this
		for i, c := range convs {
			ranges[c] = append(ranges[c], [2]int64{from[i], to[i]})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// A seq may be in two rows: delivery is at least once, and a batch is
	// applied again when a persist member that was gone (killed, or
	// dropped from the group) had committed it after the next member read
	// the stored offsets (docs/architecture.md rule 24). A seq in none is
	// an event no device is pushed.
	twice := 0
	for c, last := range lastSeq {
		rs := ranges[c]
		sort.Slice(rs, func(i, j int) bool { return rs[i][0] < rs[j][0] })
		next := int64(1)
		for _, r := range rs {
			switch {
			case r[0] > next:
				t.Errorf("%s: no delivery row covers seqs %d..%d", c, next, r[0]-1)
			case r[0] < next:
				twice += int(min(next-1, r[1]) - r[0] + 1)
			}
			next = max(next, r[1]+1)
		}
		if next != last+1 {
			t.Errorf("%s: delivery rows cover seqs up to %d, its last event is %d", c, next-1, last)
		}
	}
	t.Logf("read model: %d delivery rows for %d conversations; %d of them repeat the row before (a batch applied again after its commit's answer was lost); %d seqs in more than one row", deliveryRows, len(lastSeq), again, twice)
	return rows
}
