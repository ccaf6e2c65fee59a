package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestNemesis runs a seeded random schedule of faults against a stack
// whose roles are separate processes — three workers, persist, projection
// and the broker beside chatpipe dev (etcd, Postgres, the gateway) — while
// clients send, then heals everything and runs the world check: every
// accepted message in the log and exactly once in Postgres, no seq used
// twice, no client_message_id stored twice. The faults: kill -9 of a
// worker, a worker paused past its lease (so it is fenced when it
// resumes), a graceful worker restart, kill -9 of persist or of the
// projection, and a graceful broker restart.
//
// Beside the load, in three conversations of their own, an owner kicks a
// member (or the member leaves) and joins them again over and over while
// the member and two steady members send; at random moments one of those
// conversations is isolated to a dedicated vshard and later released
// (admin isolate / unisolate), whatever fault is active; and devices stay
// connected through the faults (reconnecting and syncing when dropped).
// Once the faults have healed and the churn has stopped, every
// conversation must take a send by a current member within a bound. Then
// countViolations counts every must-be-zero violation over the log,
// Postgres, the answers, the devices' views after a final sync, and what
// sync and history give each kicked member from a new device of theirs;
// each must be 0. Last, the read model's membership periods must be the
// log's.
//
// It runs only with CHATPIPE_E2E_LONG=1 (see long). The seed is logged;
// CHATPIPE_E2E_NEMESIS_SEED=N replays the same schedule
// (the same faults in the same order with the same gaps between them, and
// the moves drawn from the same numbers; what the processes do meanwhile
// is not deterministic), CHATPIPE_E2E_NEMESIS_DURATION
// sets how long faults are injected (default 2 minutes), and
// CHATPIPE_E2E_NEMESIS_REPORT=path writes the faults injected by kind, the
// counts and the longest send gap per fault kind as JSON (tools/bench/nemesis.sh).
func TestNemesis(t *testing.T) {
	long(t)
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("CHATPIPE_E2E_NEMESIS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHATPIPE_E2E_NEMESIS_SEED=%q: %v", v, err)
		}
		seed = s
	}
	dur := 2 * time.Minute
	if v := os.Getenv("CHATPIPE_E2E_NEMESIS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("CHATPIPE_E2E_NEMESIS_DURATION=%q: %v", v, err)
		}
		dur = d
	}
	watch(t).Extend(dur + 10*time.Minute) // the faults, then the heal and the checks
	t.Logf("nemesis seed %d (replay: CHATPIPE_E2E_NEMESIS_SEED=%d), faults for %v", seed, seed, dur)
	rng := rand.New(rand.NewPCG(seed, 0x6e656d))

	dir := t.TempDir()
	port := freePort(t)
	kargs := []string{"kafka", "--data-dir", filepath.Join(dir, "broker"), "--port", strconv.Itoa(port), "--partitions", "10", "--log-level", "warn"} // dev's 8 hashed partitions and its 2 dedicated vshards' own
	kn := 0
	startBroker := func() *proc {
		kn++
		p := startProc(t, dir, fmt.Sprintf("kafka%d", kn), nil, kargs...)
		deadline := time.Now().Add(60 * time.Second)
		for !dialable(port) {
			if time.Now().After(deadline) {
				t.Fatalf("the broker does not listen on %d after 60 s; its log:\n%s", port, tail(p.log))
			}
			time.Sleep(100 * time.Millisecond)
		}
		return p
	}
	broker := startBroker()
	dev := startDev(t, dir, "--kafka", fmt.Sprintf("127.0.0.1:%d", port), "--workers", "0", "--persist=false", "--projection=false",
		"--vshards", "64") // dev's own: the faults land on as many writers as a dev stack has
	ep := filepath.Join(dev.dir, "endpoints.json")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("dev log:\n%s", tail(filepath.Join(dir, "dev.log")))
		}
	})
	n := map[string]int{}
	start := func(role string) *proc {
		n[role]++
		name := fmt.Sprintf("%s-%d", role, n[role])
		switch {
		case strings.HasPrefix(role, "w"):
			return startProc(t, dir, name, nil, "worker", "--endpoints", ep, "--id", role, "--log-level", "warn")
		default:
			return startProc(t, dir, name, nil, role, "--endpoints", ep, "--log-level", "warn")
		}
	}
	procs := map[string]*proc{}
	for _, r := range []string{"w1", "w2", "w3", "persist", "projection"} {
		procs[r] = start(r)
	}
	t.Cleanup(func() { // (runs before the processes are stopped)
		if t.Failed() {
			for _, r := range []string{"persist", "projection"} {
				t.Logf("%s's log:\n%s", procs[r].name, tail(procs[r].log))
			}
		}
	})
	waitFor(t, 120*time.Second, "the workers to own every vshard", func() bool {
		v := etcdView(t, dev.ep)
		return ownedBy(v, dev.ep.all(), "w1")+ownedBy(v, dev.ep.all(), "w2")+ownedBy(v, dev.ep.all(), "w3") == dev.ep.all()
	})

	// Clients reconnect, as real ones do: the gateway closes a device whose
	// delivery fell behind or whose writes stall ("reconnect and sync").
	const loadUsers, loadConvs = 10, 20
	load, reconnects := startReconnectingLoad(t, dev, loadUsers, loadConvs)
	load.waitAbove(t, 60*time.Second, "load to flow", 200)
	// Beside the load: members kicked (or leaving) and joined again over
	// and over while they and others send (for the post-kick counts), the
	// conversations they are in moved to dedicated vshards and back, and
	// devices that stay connected through the faults, reconnect and sync
	// when dropped, and must end with what their user may see.
	churn := startMemberChurn(t, dev, 3)
	moves := startMoveChurn(t, dev, rand.New(rand.NewPCG(seed, 0x6d6f7665)), churn.convs)
	observers := startObservers(t, dev, churn.devices(), "lu1", "lu2")

	workers := []string{"w1", "w2", "w3"}
	// pausedAt holds the workers frozen by a pause and when; a worker is
	// resumed only once its pause has outlasted its lease (10 s), so every
	// pause moves its vshards and the resumed writer meets the fence.
	pausedAt := map[string]time.Time{}
	const pastLease = 12 * time.Second
	// A consumer is killed again only once the one started after its last
	// kill has been in the group for a while. The stand-in broker (kfake)
	// may never expire a member that joined and died before it was
	// answered, unless it was the leader (docs/reliability.md,
	// Assumptions), so a second kill during the rebalance the first one
	// began can leave that member holding its partitions for good; Kafka
	// expires it after the session timeout.
	consumerStarted := map[string]time.Time{}
	const consumerSettle = 20 * time.Second
	killConsumer := func(role string) bool {
		if at, ok := consumerStarted[role]; ok && time.Since(at) < consumerSettle {
			return false
		}
		procs[role].kill9()
		procs[role] = start(role)
		consumerStarted[role] = time.Now()
		return true
	}
	type fault struct {
		name string
		do   func() bool
	}
	// do reports whether the fault was injected (a pause of a worker
	// already paused, a resume with no pause past the lease, or a consumer
	// kill within consumerSettle of its last one, is not).
	faults := []fault{
		{"kill -9 a worker, start it again", func() bool {
			w := workers[rng.IntN(len(workers))]
			procs[w].kill9()
			delete(pausedAt, w)
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Millisecond)
			procs[w] = start(w)
			return true
		}},
		{"pause a worker past its lease", func() bool {
			w := workers[rng.IntN(len(workers))]
			if _, ok := pausedAt[w]; ok {
				return false
			}
			procs[w].signal(syscall.SIGSTOP)
			pausedAt[w] = time.Now()
			return true
		}},
		{"resume the workers paused past their lease", func() bool {
			resumed := false
			for w, at := range pausedAt {
				if time.Since(at) >= pastLease {
					procs[w].signal(syscall.SIGCONT)
					delete(pausedAt, w)
					resumed = true
				}
			}
			return resumed
		}},
		{"restart a worker gracefully", func() bool {
			w := workers[rng.IntN(len(workers))]
			if _, ok := pausedAt[w]; ok {
				return false
			}
			procs[w].stop()
			procs[w] = start(w)
			return true
		}},
		{"kill -9 persist, start it again", func() bool { return killConsumer("persist") }},
		{"kill -9 the projection, start it again", func() bool { return killConsumer("projection") }},
		{"restart the broker gracefully", func() bool {
			broker.stop()
			broker = startBroker()
			return true
		}},
	}
	counts := map[string]int{}
	var timeline []faultAt
	begin := time.Now()
	for time.Since(begin) < dur {
		f := faults[rng.IntN(len(faults))]
		t.Logf("t=%5.1fs %s", time.Since(begin).Seconds(), f.name)
		at := time.Now()
		if f.do() {
			counts[f.name]++
			timeline = append(timeline, faultAt{at, f.name})
		}
		time.Sleep(time.Duration(1000+rng.IntN(4000)) * time.Millisecond)
	}

	// Heal: every worker running and unpaused; then the load must go on.
	for w, at := range pausedAt {
		time.Sleep(time.Until(at.Add(pastLease)))
		procs[w].signal(syscall.SIGCONT)
	}
	waitFor(t, 120*time.Second, "the workers to own every vshard again", func() bool {
		v := etcdView(t, dev.ep)
		return ownedBy(v, dev.ep.all(), "w1")+ownedBy(v, dev.ep.all(), "w2")+ownedBy(v, dev.ep.all(), "w3") == dev.ep.all()
	})
	healed := load.count()
	load.waitAbove(t, 120*time.Second, "load to go on after the faults", healed+300)
	accepted := load.finish()
	moved, isolated := moves.finish()
	churned, rejected := churn.finish()
	observers.finish()
	var kinds []string
	for k, c := range counts {
		kinds = append(kinds, fmt.Sprintf("%s ×%d", k, c))
	}
	sort.Strings(kinds)
	t.Logf("%d sends accepted (%d client reconnects) under %s; %d kick cycles, %d sends of the kicked members accepted, %d refused; moves %v (%v isolated)",
		len(accepted), reconnects.Load(), strings.Join(kinds, ", "), churn.cycles.Load(), churn.sends.Load(), len(rejected), moved, isolated)

	if moved["isolate"] == 0 || churn.cycles.Load() == 0 {
		t.Errorf("the churn did not churn: moves %v, %d kick cycles", moved, churn.cycles.Load())
	}

	// Every conversation takes a send again, the moved ones included.
	senders := churn.senders()
	for c := 0; c < loadConvs; c++ { // lu1…lu9 are members of every lc (lu0 owns them); a few connections each
		senders[fmt.Sprintf("lc%d", c)] = fmt.Sprintf("lu%d", 1+c%(loadUsers-1))
	}
	written, unwritable := checkWritable(t, dev, senders, 2*time.Minute)

	all := append(append(append([]acceptedMsg(nil), accepted...), churned...), written...)
	rep := countViolationsOf(t, dev.ep, nemesisRun{dev: dev, accepted: all, rejected: rejected, devs: observers.devs, removed: churn.removed()})
	rep.Seed, rep.Duration, rep.Faults, rep.Accepted = seed, dur.String(), counts, len(all)
	rep.Reconnects, rep.KickCycles, rep.Moves = reconnects.Load(), churn.cycles.Load(), moved
	rep.Zero.Unwritable = unwritable
	rep.MaxSendGapMS = sendGaps(accepted, timeline)
	for _, z := range rep.zeros() {
		if z.n != 0 {
			t.Errorf("%s: %d (must be 0)", z.name, z.n)
		}
	}
	b, _ := json.MarshalIndent(rep, "", "  ")
	t.Logf("nemesis report: %s", b)
	if path := os.Getenv("CHATPIPE_E2E_NEMESIS_REPORT"); path != "" {
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Errorf("write the report: %v", err)
		}
	}
	checkWorld(t, dev.ep, all)
	// The read model: membership periods (the kicked members' above all,
	// across the moves) equal the log's, delivery rows cover every seq.
	checkReadModel(t, dev.ep)
}

// faultAt is one injected fault and when it began.
type faultAt struct {
	at   time.Time
	kind string
}

// nemesisReport is what a nemesis run writes to CHATPIPE_E2E_NEMESIS_REPORT
// (tools/bench/nemesis.sh turns it into a table). Every count under "zero" comes
// from a check over the committed log, Postgres and the devices' views.
type nemesisReport struct {
	Seed         uint64           `json:"seed,string"` // a string: a float64 reader (jq) would round it
	Duration     string           `json:"duration"`
	Faults       map[string]int   `json:"faults"`
	Accepted     int              `json:"accepted"`
	LogEvents    int              `json:"log_events"`
	Reconnects   int64            `json:"reconnects"`
	KickCycles   int64            `json:"kick_cycles"`
	Moves        map[string]int   `json:"moves,omitempty"` // admin isolate/unisolate commands run, by outcome
	Devices      int              `json:"devices"`
	MaxSendGapMS map[string]int64 `json:"max_send_gap_ms"`
	Zero         nemesisZeros     `json:"zero"`
}

// nemesisZeros are the counts that must be zero.
type nemesisZeros struct {
	// LostAccepted: accepted sends (and membership commands) missing from
	// the log or Postgres, or held there as another event.
	LostAccepted int `json:"lost_accepted"`
	// NotPersisted: an event of the committed log that Postgres lacks.
	NotPersisted int `json:"not_persisted"`
	// Duplicated: a (conversation, client_message_id) stored twice in the
	// log or in Postgres, or a message_id at two seqs.
	Duplicated int `json:"duplicated"`
	// SeqCollision: a (conversation, seq) twice in the log or Postgres, a
	// Postgres row whose message differs from the log's at its seq, rows in
	// seq_conflicts, or two accepted answers with one seq.
	SeqCollision int `json:"seq_collision"`
	// SeqGap: a conversation's seqs in the log not 1, 2, 3, ...
	SeqGap int `json:"seq_gap"`
	// Regression: a seq not above its conversation's previous one in its
	// partition's order (a moved conversation's events are in more than
	// one partition), or a send accepted before another was sent that has
	// the larger seq.
	Regression int `json:"regression"`
	// AbortedVisible: an event in Postgres or on a device that is not in
	// the committed (read_committed) log.
	AbortedVisible int `json:"aborted_visible"`
	// PostKick: a message in the log from a sender who was not a member at
	// its seq; a device holding an event outside its user's membership
	// periods (pushed, synced or read from history); or a removed user's
	// sync or history, from a new device at the end, giving one.
	PostKick int `json:"post_kick"`
	// RejectedStored: a send answered with a final rejection (forbidden:
	// its sender was out) that the log holds anyway.
	RejectedStored int `json:"rejected_stored"`
	// DeviceDivergence: after a final sync, an event a device's user may
	// see that it lacks or holds differently from the log; or a removed
	// user's sync or history at the end lacking one.
	DeviceDivergence int `json:"device_divergence"`
	// StaleEpoch: a vshard's record in the log with an older ownership
	// epoch than one before it.
	StaleEpoch int `json:"stale_epoch"`
	// Unwritable: a conversation that did not accept a send by a member
	// within the bound once the faults had healed and the churn stopped.
	Unwritable int `json:"unwritable"`
}

type namedCount struct {
	name string
	n    int
}

func (r *nemesisReport) zeros() []namedCount {
	z := r.Zero
	return []namedCount{{"lost accepted", z.LostAccepted}, {"not persisted", z.NotPersisted}, {"duplicated", z.Duplicated},
		{"seq collision", z.SeqCollision}, {"seq gap", z.SeqGap}, {"regression", z.Regression}, {"aborted visible", z.AbortedVisible},
		{"post-kick", z.PostKick}, {"rejected but stored", z.RejectedStored}, {"device divergence", z.DeviceDivergence},
		{"stale epoch after a newer one", z.StaleEpoch}, {"unwritable conversations", z.Unwritable}}
}

// countViolations reads the committed log and Postgres (once the projection
// has caught up) and counts every violation of I1–I6 it can see in them,
// in the accepted answers and in the devices' views after a final sync
// (TestReconnectStorm; TestNemesis checks more with countViolationsOf).
func countViolations(t *testing.T, ep endpoints, accepted []acceptedMsg, devs []*device) *nemesisReport {
	t.Helper()
	return countViolationsOf(t, ep, nemesisRun{accepted: accepted, devs: devs})
}

// nemesisRun is what a run did, for countViolationsOf to check against the
// world.
type nemesisRun struct {
	dev      *devProc      // the stack (for the removed users' new devices)
	accepted []acceptedMsg // sends and membership commands answered accepted
	rejected []rejectedSend
	devs     []*device // devices that ran through it
	// removed are users kicked or who left: what sync and history give
	// each of them from a new device at the end must be exactly what
	// their membership periods let them see.
	removed []string
}

// countViolationsOf is countViolations over everything run holds: what
// `chatpipe check` verifies of a loadgen run (cmd/chatpipe/check.go,
// loadcheck) is counted here too — every accepted event in the log and
// Postgres once, as answered; no seq collision or regression; no message
// stored twice; nobody sending after their removal; no finally rejected
// send stored; Postgres holding exactly the log; every device holding
// exactly what its user may see.
func countViolationsOf(t *testing.T, ep endpoints, run nemesisRun) *nemesisReport {
	t.Helper()
	accepted, devs := run.accepted, run.devs
	rep := &nemesisReport{Devices: len(devs)}
	z := &rep.Zero
	var logRows []row
	topEpoch := map[int]int64{}
	topAt := map[int]string{} // where the vshard's newest epoch was first seen, and by which producer
	// A conversation's last seq in each partition: a moved conversation's
	// events are in its hashed vshard's partition and a dedicated one's,
	// read in no fixed order between partitions.
	type convPart struct {
		conv string
		part int32
	}
	lastSeq := map[convPart]int64{}
	eachLogEvent(t, ep, func(r *kgo.Record, e *logrecord.Event) {
		at := fmt.Sprintf("%s at %d/%d (producer %d epoch %d)", e.Kind, r.Partition, r.Offset, r.ProducerID, r.ProducerEpoch)
		if e.Epoch < topEpoch[e.VShard] {
			z.StaleEpoch++
			t.Logf("stale epoch: vshard %d %s has ownership epoch %d after epoch %d's %s", e.VShard, at, e.Epoch, topEpoch[e.VShard], topAt[e.VShard])
		}
		if e.Epoch > topEpoch[e.VShard] || topAt[e.VShard] == "" {
			topEpoch[e.VShard], topAt[e.VShard] = e.Epoch, at
		}
		if !e.HasSeq() {
			return
		}
		cp := convPart{e.ConversationID, r.Partition}
		if prev, ok := lastSeq[cp]; ok && e.Seq <= prev {
			z.Regression++
			t.Logf("regression: %s seq %d after %d in partition %d of the log", e.ConversationID, e.Seq, prev, r.Partition)
		}
		lastSeq[cp] = e.Seq
		logRows = append(logRows, row{Conv: e.ConversationID, Kind: e.Kind, MessageID: e.MessageID, ClientMessageID: e.ClientMessageID,
			Sender: e.Sender, Seq: e.Seq, UserID: e.UserID, Body: e.Body, Members: e.Members})
	})
	rep.LogEvents = len(logRows)
	dbRows := readDB(t, ep, len(logRows))
	// A schedule may end with persist and the projection killed and
	// started again: each killed member holds its partitions until its
	// consumer group session times out (45 s), one after the other.
	waitProjectedFor(t, ep, len(logRows), 3*time.Minute)
	conflicts := 0
	func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, ep.Postgres)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM seq_conflicts`).Scan(&conflicts); err != nil {
			t.Fatal(err)
		}
	}()
	z.SeqCollision += conflicts

	key := func(conv string, seq int64) string { return fmt.Sprintf("%s/%d", conv, seq) }
	index := func(name string, rows []row) map[string]row {
		bySeq := map[string]row{}
		byCmid := map[string]bool{}
		byMID := map[string]string{}
		for _, r := range rows {
			k := key(r.Conv, r.Seq)
			if _, ok := bySeq[k]; ok {
				z.SeqCollision++
				t.Logf("seq collision: %s %s used twice", name, k)
			}
			bySeq[k] = r
			if at, ok := byMID[r.MessageID]; ok && r.MessageID != "" && at != k {
				z.Duplicated++
				t.Logf("duplicated: %s message %s stored at %s and at %s", name, r.MessageID, at, k)
			}
			byMID[r.MessageID] = k
			if r.Kind == logrecord.KindMessage {
				ck := r.Conv + "/" + r.ClientMessageID
				if byCmid[ck] {
					z.Duplicated++
					t.Logf("duplicated: %s %s stored twice", name, ck)
				}
				byCmid[ck] = true
			}
		}
		return bySeq
	}
	logBySeq, dbBySeq := index("log", logRows), index("postgres", dbRows)
	for k, d := range dbBySeq {
		l, ok := logBySeq[k]
		switch {
		case !ok:
			z.AbortedVisible++
			t.Logf("aborted visible: Postgres holds %s (%s), the committed log does not", k, d.MessageID)
		case l.MessageID != d.MessageID || l.ClientMessageID != d.ClientMessageID || l.Body != d.Body:
			z.SeqCollision++
			t.Logf("seq collision: Postgres %s holds %+v, the log %+v", k, d, l)
		}
	}
	for k, l := range logBySeq {
		if _, ok := dbBySeq[k]; !ok {
			z.NotPersisted++
			t.Logf("not persisted: the log holds %s (%s %s), Postgres does not", k, l.Kind, l.MessageID)
		}
	}
	storedSend := map[string]row{}
	for _, l := range logRows {
		if l.Kind == logrecord.KindMessage {
			storedSend[l.Conv+"/"+l.ClientMessageID] = l
		}
	}
	for _, r := range run.rejected {
		if l, ok := storedSend[r.Conv+"/"+r.ClientMessageID]; ok && l.Sender == r.Sender {
			z.RejectedStored++
			t.Logf("rejected but stored: %s %s by %s was answered %s, the log holds it at seq %d", r.Conv, r.ClientMessageID, r.Sender, r.Code, l.Seq)
		}
	}
	answered := map[string]string{}
	for _, a := range accepted {
		k := key(a.Conv, a.Seq)
		if prev, ok := answered[k]; ok && prev != a.ClientMessageID {
			z.SeqCollision++
			t.Logf("seq collision: %s answered to %s and %s", k, prev, a.ClientMessageID)
		}
		answered[k] = a.ClientMessageID
		l, inLog := logBySeq[k]
		d, inDB := dbBySeq[k]
		if !inLog || !inDB || l.MessageID != a.MessageID || l.ClientMessageID != a.ClientMessageID || d.MessageID != a.MessageID {
			z.LostAccepted++
			t.Logf("lost accepted: %s %s (in the log %v, in Postgres %v)", k, a.ClientMessageID, inLog, inDB)
		}
	}
	byConv := map[string][]acceptedMsg{}
	for _, a := range accepted {
		byConv[a.Conv] = append(byConv[a.Conv], a)
	}
	for _, as := range byConv {
		sort.Slice(as, func(i, j int) bool { return as[i].AcceptedAt.Before(as[j].AcceptedAt) })
		// a accepted before b was sent must have the smaller seq: compare
		// each b with the largest seq accepted before it was sent.
		top, j := int64(0), 0
		bySent := append([]acceptedMsg(nil), as...)
		sort.Slice(bySent, func(i, j int) bool { return bySent[i].SentAt.Before(bySent[j].SentAt) })
		for _, b := range bySent {
			for ; j < len(as) && as[j].AcceptedAt.Before(b.SentAt); j++ {
				top = max(top, as[j].Seq)
			}
			if j > 0 && top >= b.Seq {
				z.Regression++
				t.Logf("regression: %s %s got seq %d, a send accepted before it was sent has %d", b.Conv, b.ClientMessageID, b.Seq, top)
			}
		}
	}
	rowsByConv := map[string][]row{}
	for _, r := range logRows {
		rowsByConv[r.Conv] = append(rowsByConv[r.Conv], r)
	}
	per := periods(logRows)
	userConvs := map[string]map[string][][2]int64{} // user → conversation → periods
	for conv, m := range per {
		for u, ps := range m {
			if userConvs[u] == nil {
				userConvs[u] = map[string][][2]int64{}
			}
			userConvs[u][conv] = ps
		}
	}
	for conv, rows := range rowsByConv {
		seqs := make([]int64, len(rows))
		for i, r := range rows {
			seqs[i] = r.Seq
		}
		sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
		for i, s := range seqs {
			if s != int64(i+1) {
				z.SeqGap++
				t.Logf("seq gap: %s has seq %d at position %d", conv, s, i+1)
				break
			}
		}
		for _, r := range rows {
			if r.Kind == logrecord.KindMessage && !inPeriods(per[conv][r.Sender], r.Seq) {
				z.PostKick++
				t.Logf("post-kick: %s/%d from %s, not a member then", conv, r.Seq, r.Sender)
			}
		}
	}
	// Every device syncs once more (a few at a time: each sync is a
	// Postgres read), then must hold exactly what its user may see.
	var wg sync.WaitGroup
	next := make(chan *device)
	for w := 0; w < min(32, len(devs)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range next {
				if err := d.connect(); err != nil {
					t.Errorf("final connect of %s: %v", d.name, err)
				} else if err := d.syncAll(); err != nil {
					t.Errorf("final sync of %s: %v", d.name, err)
				}
			}
		}()
	}
	for _, d := range devs {
		next <- d
	}
	close(next)
	wg.Wait()
	for _, d := range devs {
		for _, conv := range d.convs() {
			for _, s := range d.seqs(conv) {
				e := d.get(conv, s)
				l, ok := logBySeq[key(conv, s)]
				switch {
				case !ok:
					z.AbortedVisible++
					t.Logf("aborted visible: %s holds %s/%d, the committed log does not", d.name, conv, s)
				case !inPeriods(per[conv][d.user], s):
					z.PostKick++
					t.Logf("post-kick: %s holds %s/%d, outside %s's periods", d.name, conv, s, d.user)
				case e.MessageID != l.MessageID || e.Body != l.Body || e.Kind != l.Kind || e.Sender != l.Sender:
					z.DeviceDivergence++
					t.Logf("device divergence: %s holds %s/%d = %+v, the log %+v", d.name, conv, s, e, l)
				}
			}
		}
		for conv, ps := range userConvs[d.user] {
			for s := range visibleTo(rowsByConv[conv], ps) {
				if d.get(conv, s) == nil {
					z.DeviceDivergence++
					t.Logf("device divergence: %s lacks %s/%d", d.name, conv, s)
				}
			}
		}
	}
	for _, u := range run.removed {
		checkRemovedUser(t, run.dev, u, userConvs[u], rowsByConv, z)
	}
	return rep
}

// checkRemovedUser reads, as user from a new device of theirs, a sync from
// nothing and the history of each conversation they were ever in, and
// counts what differs from what their membership periods (convs:
// conversation → periods) let them see: an event after a removal (and
// before a join that followed it) is post-kick, a missing one (the removal
// event itself above all) a divergence.
func checkRemovedUser(t *testing.T, dev *devProc, user string, convs map[string][][2]int64, rowsByConv map[string][]row, z *nemesisZeros) {
	t.Helper()
	d := newDevice(t, dev, user, user+".final")
	defer d.disconnect()
	if err := d.connect(); err != nil { // dials and syncs from empty cursors
		t.Errorf("sync as %s from a new device: %v", user, err)
		return
	}
	compare := func(what, conv string, got []int64) {
		want := visibleTo(rowsByConv[conv], convs[conv])
		have := map[int64]bool{}
		for _, s := range got {
			have[s] = true
			if _, ok := want[s]; !ok {
				z.PostKick++
				t.Logf("post-kick: %s's %s gave %s/%d, outside %s's periods %v", user, what, conv, s, user, convs[conv])
			}
		}
		var missing []int64
		for s := range want {
			if !have[s] {
				missing = append(missing, s)
			}
		}
		if len(missing) > 0 {
			sort.Slice(missing, func(i, j int) bool { return missing[i] < missing[j] })
			z.DeviceDivergence += len(missing)
			t.Logf("device divergence: %s's %s of %s lacks seqs %v (periods %v)", user, what, conv, missing, convs[conv])
		}
	}
	for _, conv := range d.convs() {
		if _, ok := convs[conv]; !ok {
			z.PostKick++
			t.Logf("post-kick: %s's sync gave events of %s, which they never were in", user, conv)
		}
	}
	var names []string
	for conv := range convs {
		names = append(names, conv)
	}
	sort.Strings(names)
	for _, conv := range names {
		compare("sync", conv, d.seqs(conv))
		got, err := d.history(conv, 200)
		if err != nil {
			t.Errorf("history of %s as %s: %v", conv, user, err)
			continue
		}
		compare("history", conv, got)
		t.Logf("%s from a new device: sync and history of %s checked against %d membership periods (%d of its %d events theirs to see)",
			user, conv, len(convs[conv]), len(visibleTo(rowsByConv[conv], convs[conv])), len(rowsByConv[conv]))
	}
}

func inPeriods(ps [][2]int64, seq int64) bool {
	for _, p := range ps {
		if seq >= p[0] && seq <= p[1] {
			return true
		}
	}
	return false
}

// sendGaps is, per fault kind, the longest time a load client waited
// between two of its accepted sends, the gap counted under the last fault
// injected before it ended ("none" before the first fault).
func sendGaps(accepted []acceptedMsg, timeline []faultAt) map[string]int64 {
	bySender := map[string][]time.Time{}
	for _, a := range accepted {
		bySender[a.Sender] = append(bySender[a.Sender], a.AcceptedAt)
	}
	out := map[string]int64{}
	for _, ts := range bySender {
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
		for i := 1; i < len(ts); i++ {
			kind := "none"
			if k := sort.Search(len(timeline), func(k int) bool { return timeline[k].at.After(ts[i]) }); k > 0 {
				kind = timeline[k-1].kind
			}
			out[kind] = max(out[kind], ts[i].Sub(ts[i-1]).Milliseconds())
		}
	}
	return out
}

// devOp sends a command from d until it is answered (reconnecting and
// syncing when the connection drops), as a client keeps a command's
// client_message_id across reconnects.
func devOp(d *device, req map[string]any) (*frame, error) {
	start := time.Now()
	for {
		err := d.connect()
		var f *frame
		if err == nil {
			r := map[string]any{}
			for k, v := range req {
				r[k] = v
			}
			if f, err = d.doRetrying(r); err == nil {
				return f, nil
			}
		}
		if time.Since(start) > 2*time.Minute {
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// rejectedSend is a send answered with a final rejection: the log must
// not hold it.
type rejectedSend struct {
	Conv, ClientMessageID, Sender, Code string
}

// memberChurn is, in each of its conversations, an owner kicking a member
// (or the member leaving) and joining them again, over and over, while
// the member sends to it and two steady members send to every one of
// them. Every membership command carries a key, and every command is sent
// again with its ids while it is answered unavailable or rate_limited, or
// its connection drops, as a client does.
type memberChurn struct {
	t       *testing.T
	convs   []string
	owners  []*device // per conversation
	members []*device // per conversation: the one kicked
	steady  []*device
	stop    chan struct{}
	stopped sync.Once
	wg      sync.WaitGroup
	cycles  atomic.Int64

	mu       sync.Mutex
	accepted []acceptedMsg // sends, and membership commands that wrote an event
	rejected []rejectedSend
	sends    atomic.Int64 // the kicked members' sends accepted
}

// churnWriteBound is how long a churn command is sent again while it is
// answered retry: longer than any stall the faults cause (a conversation
// moving while persist's killed member holds its partitions, up to twice
// the consumer session timeout of 45 s).
const churnWriteBound = 3 * time.Minute

var errChurnStopped = errors.New("the churn stopped")

func startMemberChurn(t *testing.T, dev *devProc, n int) *memberChurn {
	t.Helper()
	k := &memberChurn{t: t, stop: make(chan struct{})}
	t.Cleanup(func() { k.stopped.Do(func() { close(k.stop) }); k.wg.Wait() }) // a test that fails before finish
	for i := 0; i < 2; i++ {
		u := fmt.Sprintf("nks%d", i)
		k.steady = append(k.steady, newDevice(t, dev, u, u+".d0"))
	}
	for i := 0; i < n; i++ {
		conv := fmt.Sprintf("nk%d", i)
		owner := newDevice(t, dev, fmt.Sprintf("nko%d", i), fmt.Sprintf("nko%d.d0", i))
		member := newDevice(t, dev, fmt.Sprintf("nkm%d", i), fmt.Sprintf("nkm%d.d0", i))
		f, err := devOp(owner, map[string]any{"op": "create", "conversation_id": conv, "members": []string{member.user, "nks0", "nks1"}, "client_message_id": conv + "-create"})
		if err != nil || f.Op != protocol.OpAccepted {
			t.Fatalf("create %s: %v %+v", conv, err, f)
		}
		k.convs, k.owners, k.members = append(k.convs, conv), append(k.owners, owner), append(k.members, member)
	}
	for i, conv := range k.convs {
		owner, member := k.owners[i], k.members[i]
		k.wg.Add(2)
		go func() { // every third cycle the member leaves, else the owner kicks them
			defer k.wg.Done()
			for c := 0; ; c++ {
				remover, removal := owner, map[string]any{"op": "kick", "conversation_id": conv, "user_id": member.user, "client_message_id": fmt.Sprintf("%s-kick-%d", conv, c)}
				if c%3 == 2 {
					remover, removal = member, map[string]any{"op": "leave", "conversation_id": conv, "client_message_id": fmt.Sprintf("%s-leave-%d", conv, c)}
				}
				join := map[string]any{"op": "join", "conversation_id": conv, "user_id": member.user, "client_message_id": fmt.Sprintf("%s-join-%d", conv, c)}
				for _, step := range []struct {
					d   *device
					req map[string]any
				}{{remover, removal}, {owner, join}} {
					select {
					case <-k.stop:
						return
					case <-time.After(150 * time.Millisecond):
					}
					if !k.command(step.d, conv, step.req) {
						return
					}
				}
				k.cycles.Add(1)
			}
		}()
		go func() { // the member sends: accepted while a member, forbidden while out
			defer k.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-k.stop:
					return
				case <-time.After(80 * time.Millisecond):
				}
				if !k.send(member, conv, fmt.Sprintf("%s-%d", member.user, i)) {
					return
				}
			}
		}()
	}
	for _, d := range k.steady {
		k.wg.Add(1)
		go func() {
			defer k.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-k.stop:
					return
				case <-time.After(60 * time.Millisecond): // under the gateway's 20 commands/s per user
				}
				if !k.send(d, k.convs[i%len(k.convs)], fmt.Sprintf("%s-%d", d.user, i)) {
					return
				}
			}
		}()
	}
	return k
}

// write sends req from d until it is answered other than unavailable or
// rate_limited, with the same ids, for at most churnWriteBound; it gives
// up (errChurnStopped) once the churn stops.
func (k *memberChurn) write(d *device, req map[string]any) (*frame, error) {
	start := time.Now()
	for {
		f, err := devOp(d, req)
		if err != nil {
			return nil, err
		}
		if f.Code != string(protocol.CodeUnavailable) && f.Code != string(protocol.CodeRateLimited) {
			return f, nil
		}
		if time.Since(start) > churnWriteBound {
			return f, fmt.Errorf("still answered %s %q after %v", f.Code, f.Message, churnWriteBound)
		}
		select {
		case <-k.stop:
			return nil, errChurnStopped
		case <-time.After(time.Duration(max(f.RetryAfterMS, 10)) * time.Millisecond):
		}
	}
}

// command sends a membership command (kick, leave or join) and records it
// if it wrote an event; false: the goroutine stops.
func (k *memberChurn) command(d *device, conv string, req map[string]any) bool {
	sent := time.Now()
	f, err := k.write(d, req)
	switch {
	case errors.Is(err, errChurnStopped):
		return false
	case err != nil:
		k.t.Errorf("%s %s by %s: %v; %s", req["op"], conv, d.user, err, convWhere(d.dev.ep, conv))
		return false
	case f.Op != protocol.OpAccepted:
		k.t.Errorf("%s %s by %s (%s) answered %s %q", req["op"], conv, d.user, req["client_message_id"], f.Code, f.Message)
		return false
	case f.MessageID != "": // not a join of a current member, which writes nothing
		k.mu.Lock()
		k.accepted = append(k.accepted, acceptedMsg{Conv: conv, ClientMessageID: req["client_message_id"].(string), MessageID: f.MessageID, Sender: d.user, Seq: f.Seq, SentAt: sent, AcceptedAt: time.Now()})
		k.mu.Unlock()
	}
	return true
}

// send sends a message and records the answer: accepted, or forbidden
// (the sender is out); false: the goroutine stops.
func (k *memberChurn) send(d *device, conv, cmid string) bool {
	sent := time.Now()
	f, err := k.write(d, map[string]any{"op": "send", "conversation_id": conv, "client_message_id": cmid, "body": "churn"})
	switch {
	case errors.Is(err, errChurnStopped):
		return false
	case err != nil:
		k.t.Errorf("send %s to %s by %s: %v; %s", cmid, conv, d.user, err, convWhere(d.dev.ep, conv))
		return false
	case f.Op == protocol.OpAccepted:
		k.mu.Lock()
		k.accepted = append(k.accepted, acceptedMsg{Conv: conv, ClientMessageID: cmid, MessageID: f.MessageID, Sender: d.user, Seq: f.Seq, SentAt: sent, AcceptedAt: time.Now()})
		k.mu.Unlock()
		if strings.HasPrefix(d.user, "nkm") {
			k.sends.Add(1)
		}
	case f.Code == string(protocol.CodeForbidden):
		k.mu.Lock()
		k.rejected = append(k.rejected, rejectedSend{Conv: conv, ClientMessageID: cmid, Sender: d.user, Code: f.Code})
		k.mu.Unlock()
	default:
		k.t.Errorf("send %s to %s by %s answered %s %q", cmid, conv, d.user, f.Code, f.Message)
		return false
	}
	return true
}

// devices are every device of the churn: owners, kicked members, steady
// members.
func (k *memberChurn) devices() []*device {
	return append(append(append([]*device(nil), k.owners...), k.members...), k.steady...)
}

// removed are the users the churn kicks or who leave.
func (k *memberChurn) removed() []string {
	var out []string
	for _, d := range k.members {
		out = append(out, d.user)
	}
	return out
}

// senders names a current member of each churn conversation: its owner.
func (k *memberChurn) senders() map[string]string {
	out := map[string]string{}
	for i, c := range k.convs {
		out[c] = k.owners[i].user
	}
	return out
}

// finish stops the churn and returns what was accepted and what was
// finally rejected.
func (k *memberChurn) finish() ([]acceptedMsg, []rejectedSend) {
	k.stopped.Do(func() { close(k.stop) })
	k.wg.Wait()
	return k.accepted, k.rejected
}

// observerSet is devices that stay connected: dropped by the gateway (a
// stalled write, delivery fallen behind) they reconnect and sync.
type observerSet struct {
	devs []*device
	stop chan struct{}
	wg   sync.WaitGroup
}

func startObservers(t *testing.T, dev *devProc, devs []*device, users ...string) *observerSet {
	t.Helper()
	o := &observerSet{devs: devs, stop: make(chan struct{})}
	for _, u := range users {
		o.devs = append(o.devs, newDevice(t, dev, u, u+".observer"))
	}
	t.Cleanup(func() {
		for _, d := range o.devs {
			d.disconnect()
		}
	})
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		for {
			for _, d := range o.devs {
				// an error is tried again on the next round
				d.connect()
			}
			select {
			case <-o.stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()
	return o
}

func (o *observerSet) finish() {
	close(o.stop)
	o.wg.Wait()
}
