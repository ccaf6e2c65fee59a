package bench

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestHotConversationBench measures what isolating a hot conversation buys
// the conversations that share its vshard. It asserts nothing about time;
// it reports. Run it with tools/bench/hot.sh, or
// CHATPIPE_E2E_HOT_BENCH=1 CHATPIPE_E2E_NORACE=1 go test ./tools/bench -run
// TestHotConversationBench -v; CI skips it.
//
// One `chatpipe dev` (per-user limit off, the per-conversation limit at its
// default). 500 ordinary conversations whose ids hash to the vshard of the
// hot conversation are driven at a steady, paced rate (500 msg/s in total
// from 40 websocket clients, each on a time.Ticker, every send on its own
// so a slow answer does not slow the pace), and their `accepted` latency
// (first send → accepted answer, retries of `unavailable` included) is
// taken in three phases and a control:
//
//	0  no hot conversation
//	1  the hot conversation sending at its limit on the shared vshard
//	2  the hot conversation isolated (admin isolate), still sending
//	3  after a release (admin unisolate), the hot conversation silent
//	   again: a control for the run's own drift and noise
//
// The hot conversation's clients are paced at 1.5× its limit, so the
// writer's bucket, not the clients, sets its rate; `rate_limited` answers
// are counted apart and not retried (the next tick sends the next
// message). Around the isolate, and around the release after phase 2,
// the longest time between consecutive accepted sends of the hot
// conversation is the gap its clients saw.
//
// Knobs: CHATPIPE_E2E_HOT_BENCH_PHASE (20s), CHATPIPE_E2E_HOT_BENCH_RATE (500),
// CHATPIPE_E2E_HOT_BENCH_CLIENTS (40), CHATPIPE_E2E_HOT_BENCH_CONVS (500),
// CHATPIPE_E2E_HOT_BENCH_OUT (a file for the markdown table and notes).
func TestHotConversationBench(t *testing.T) {
	if os.Getenv("CHATPIPE_E2E_HOT_BENCH") != "1" {
		t.Skip("set CHATPIPE_E2E_HOT_BENCH=1 to run the hot conversation benchmark (tools/bench/hot.sh)")
	}
	phaseLen := stacktest.EnvDuration(t, "CHATPIPE_E2E_HOT_BENCH_PHASE", 20*time.Second)
	rate := stacktest.EnvInt(t, "CHATPIPE_E2E_HOT_BENCH_RATE", 500)
	nClients := stacktest.EnvInt(t, "CHATPIPE_E2E_HOT_BENCH_CLIENTS", 40)
	nConvs := stacktest.EnvInt(t, "CHATPIPE_E2E_HOT_BENCH_CONVS", 500)
	const hotClients = 4
	convRate, convBurst := hbConvLimit(t)

	dev := stacktest.StartDev(t, t.TempDir(), "--rate-user", "-1")
	if dev.EP.Dedicated == 0 {
		t.Fatal("chatpipe dev has no dedicated vshards")
	}
	const hot = "hot"
	home := logrecord.VShard(hot, dev.EP.VShards)
	var convs []string
	for i := 0; len(convs) < nConvs; i++ {
		if id := fmt.Sprintf("oc%d", i); logrecord.VShard(id, dev.EP.VShards) == home {
			convs = append(convs, id)
		}
	}

	// The ordinary clients: user ou<k> owns conversations k, k+n, k+2n, …
	// (the next user is their other member) and sends to them in turn.
	clients := make([]*stacktest.Client, nClients)
	for k := range clients {
		clients[k] = dev.Dial(t, fmt.Sprintf("ou%d", k))
	}
	var cwg sync.WaitGroup
	for k := range clients {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			for i := k; i < len(convs); i += nClients {
				hbCreate(t, clients[k], convs[i], fmt.Sprintf("ou%d", (k+1)%nClients))
			}
		}()
	}
	hotCl := make([]*stacktest.Client, hotClients)
	for k := range hotCl {
		hotCl[k] = dev.Dial(t, fmt.Sprintf("hu%d", k))
	}
	hbCreate(t, hotCl[0], hot, "hu1", "hu2", "hu3")
	cwg.Wait()
	if t.Failed() {
		return
	}

	var ord, hotRec hbRecorder
	var wg sync.WaitGroup
	stopOrd, stopHot := make(chan struct{}), make(chan struct{})
	every := time.Duration(float64(time.Second) * float64(nClients) / float64(rate))
	for k, cl := range clients {
		var mine []string
		for i := k; i < len(convs); i += nClients {
			mine = append(mine, convs[i])
		}
		wg.Add(1)
		go hbPaced(&wg, cl, every, time.Duration(k)*every/time.Duration(nClients), mine, cl.User, &ord, stopOrd)
	}

	admin := func(args ...string) (string, time.Time, time.Time) {
		t.Helper()
		start := time.Now()
		out, err := exec.Command(stacktest.Binary(t), append([]string{"admin", args[0], "--endpoints", filepath.Join(dev.Dir, "endpoints.json")}, args[1:]...)...).CombinedOutput()
		end := time.Now()
		t.Logf("admin %v (%v): %s", args, end.Sub(start).Round(time.Millisecond), out)
		if err != nil {
			t.Fatalf("admin %v: %v", args, err)
		}
		return strings.TrimSpace(string(out)), start, end
	}

	var phases [4][2]time.Time
	measure := func(p int) {
		phases[p][0] = time.Now()
		time.Sleep(phaseLen)
		phases[p][1] = time.Now()
	}
	time.Sleep(10 * time.Second) // every conversation loaded, the stack warm
	measure(0)
	hotOffered := 1.5 * convRate
	hotEvery := time.Duration(float64(time.Second) * hotClients / hotOffered)
	for k, cl := range hotCl {
		wg.Add(1)
		go hbPaced(&wg, cl, hotEvery, time.Duration(k)*hotEvery/hotClients, []string{hot}, cl.User, &hotRec, stopHot)
	}
	// The bucket's burst drains at (offered − limit)/s; then the limit rules.
	time.Sleep(time.Duration(float64(convBurst)/(hotOffered-convRate)*float64(time.Second)) + time.Second)
	measure(1)
	isoOut, isoStart, isoEnd := admin("isolate", hot)
	time.Sleep(3 * time.Second)
	measure(2)
	relOut, relStart, relEnd := admin("unisolate", hot)
	time.Sleep(3 * time.Second)
	close(stopHot)
	time.Sleep(2 * time.Second)
	measure(3) // a control: no hot conversation again, after everything
	close(stopOrd)
	wg.Wait()

	// Ordinary conversations, per phase (by the time of their first send).
	type phaseStats struct {
		n, rateLimited, other     int
		p50, p99, max             time.Duration
		hotAccepted, hotLimited   int
		hotPerSec, hotLimitPerSec float64
	}
	var st [4]phaseStats
	for p, w := range phases {
		var lat []time.Duration
		for _, s := range ord.all() {
			if s.sent.Before(w[0]) || !s.sent.Before(w[1]) {
				continue
			}
			switch s.code {
			case "":
				lat = append(lat, s.done.Sub(s.sent))
			case protocol.CodeRateLimited:
				st[p].rateLimited++
			default:
				st[p].other++
			}
		}
		slices.Sort(lat)
		st[p].n = len(lat)
		st[p].p50, st[p].p99 = hbPct(lat, 0.50), hbPct(lat, 0.99)
		if len(lat) > 0 {
			st[p].max = lat[len(lat)-1]
		}
		for _, s := range hotRec.all() {
			if s.done.Before(w[0]) || !s.done.Before(w[1]) {
				continue
			}
			switch s.code {
			case "":
				st[p].hotAccepted++
			case protocol.CodeRateLimited:
				st[p].hotLimited++
			}
		}
		secs := w[1].Sub(w[0]).Seconds()
		st[p].hotPerSec, st[p].hotLimitPerSec = float64(st[p].hotAccepted)/secs, float64(st[p].hotLimited)/secs
	}
	for _, s := range ord.all() {
		if s.code != "" && s.code != protocol.CodeRateLimited {
			t.Errorf("ordinary send to %s answered %s: %s", s.conv, s.code, s.msg)
			break
		}
	}

	// The hot conversation around each move.
	var hotAt []time.Time
	for _, s := range hotRec.all() {
		if s.code == "" {
			hotAt = append(hotAt, s.done)
		}
	}
	slices.SortFunc(hotAt, func(a, b time.Time) int { return a.Compare(b) })
	type moveStats struct {
		gap          time.Duration
		gapFrom      time.Duration // the gap's start, after the command started
		unavailable  int           // answers unavailable (then retried) of sends made around it
		slowest      time.Duration // the slowest accepted hot send made around it
		took, ordP99 time.Duration // the admin command's run; ordinary p99 around it
		out          string
		from, to     time.Time
	}
	around := func(out string, start, end time.Time) moveStats {
		m := moveStats{out: out, took: end.Sub(start), from: start.Add(-time.Second), to: end.Add(time.Second)}
		for i := 1; i < len(hotAt); i++ {
			if hotAt[i].After(m.from) && hotAt[i-1].Before(m.to) && hotAt[i].Sub(hotAt[i-1]) > m.gap {
				m.gap, m.gapFrom = hotAt[i].Sub(hotAt[i-1]), hotAt[i-1].Sub(start)
			}
		}
		for _, s := range hotRec.all() {
			if s.sent.Before(m.from) || !s.sent.Before(m.to) {
				continue
			}
			m.unavailable += s.retries
			if s.code == "" {
				m.slowest = max(m.slowest, s.done.Sub(s.sent))
			}
		}
		var lat []time.Duration
		for _, s := range ord.all() {
			if s.code == "" && !s.sent.Before(m.from) && s.sent.Before(m.to) {
				lat = append(lat, s.done.Sub(s.sent))
			}
		}
		slices.Sort(lat)
		m.ordP99 = hbPct(lat, 0.99)
		return m
	}
	iso, rel := around(isoOut, isoStart, isoEnd), around(relOut, relStart, relEnd)

	ratio := float64(st[2].p99) / float64(st[0].p99)
	met := func(ok bool) string {
		if ok {
			return "**met**"
		}
		return "**not met**"
	}
	ms := func(d time.Duration) string {
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + " ms"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Setup: `chatpipe dev --rate-user -1` (%d hashed vshards, %d dedicated; per-conversation limit at its default, %g msg/s with a burst of %d). "+
		"%d ordinary conversations whose ids hash to vshard %d, the hot conversation's, each with 2 members, driven at %d msg/s in total by %d websocket clients (one send every %v each, paced by a ticker, not closed-loop). "+
		"The hot conversation's %d clients offer %g msg/s in total (1.5× its limit), so its writer's bucket sets its rate. Phases of %v; latency from a client's first send to its `accepted` answer (a retry after `unavailable` included).\n\n",
		dev.EP.VShards, dev.EP.Dedicated, convRate, convBurst, len(convs), home, rate, nClients, every, hotClients, hotOffered, phaseLen)
	b.WriteString("| phase | ordinary accepted | ordinary p50 | ordinary p99 | ordinary max | ordinary rate_limited | hot accepted msg/s | hot rate_limited/s |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	names := [4]string{"0: no hot conversation", "1: hot at its limit, shared vshard", "2: hot isolated (dedicated vshard)", "3: no hot conversation again (control, after the release)"}
	for p := range st {
		hotCol, limCol := "—", "—"
		if p == 1 || p == 2 {
			hotCol, limCol = fmt.Sprintf("%.1f", st[p].hotPerSec), fmt.Sprintf("%.1f", st[p].hotLimitPerSec)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %d | %s | %s |\n", names[p], st[p].n, ms(st[p].p50), ms(st[p].p99), ms(st[p].max), st[p].rateLimited, hotCol, limCol)
	}
	b.WriteString("\n| figure | measured | goal | met? |\n|---|---|---|---|\n")
	fmt.Fprintf(&b, "| ordinary p99, isolated ÷ no hot conversation (phase 2 ÷ phase 0) | %.2f (%s ÷ %s) | ≤ 1.20 | %s |\n", ratio, ms(st[2].p99), ms(st[0].p99), met(ratio <= 1.2))
	fmt.Fprintf(&b, "| ordinary p99, hot on the shared vshard ÷ no hot conversation (phase 1 ÷ phase 0) | %.2f | — | — |\n", float64(st[1].p99)/float64(st[0].p99))
	fmt.Fprintf(&b, "| ordinary p99, control ÷ no hot conversation (phase 3 ÷ phase 0: the run's own drift and noise) | %.2f | — | — |\n", float64(st[3].p99)/float64(st[0].p99))
	fmt.Fprintf(&b, "| hot conversation's accepted msg/s, shared vshard / dedicated vshard | %.1f / %.1f | its limit, %g | — |\n", st[1].hotPerSec, st[2].hotPerSec, convRate)
	fmt.Fprintf(&b, "| gap the hot conversation's clients saw, isolate | %s | ≤ 250 ms | %s |\n", ms(iso.gap), met(iso.gap <= 250*time.Millisecond))
	fmt.Fprintf(&b, "| gap the hot conversation's clients saw, release (unisolate) | %s | ≤ 250 ms | %s |\n", ms(rel.gap), met(rel.gap <= 250*time.Millisecond))
	b.WriteString("\nThe gap is the longest time between consecutive accepted sends of the hot conversation (all its clients together) from 1 s before the admin command started to 1 s after it returned.\n\n")
	for _, m := range []struct {
		name string
		s    moveStats
	}{{"isolate", iso}, {"release", rel}} {
		fmt.Fprintf(&b, "- %s: `admin` ran %s (%q); the gap began %s after the command started; %d `unavailable` answers reached the hot conversation's clients (each retried after its `retry_after_ms`); its slowest accepted send %s; ordinary p99 in the same window %s.\n",
			m.name, ms(m.s.took), strings.ReplaceAll(m.s.out, "\n", "; "), ms(m.s.gapFrom), m.s.unavailable, ms(m.s.slowest), ms(m.s.ordP99))
	}
	section := b.String()
	t.Log("\n" + section)

	// Second by second, for reading a run: ordinary p99 and the hot
	// conversation's accepted sends, from the first phase's start.
	var tl strings.Builder
	t0 := phases[0][0]
	secs := int(phases[3][1].Sub(t0)/time.Second) + 1
	lat := make([][]time.Duration, secs)
	hotN := make([]int, secs)
	for _, s := range ord.all() {
		if i := int(s.sent.Sub(t0) / time.Second); s.code == "" && !s.sent.Before(t0) && i < secs {
			lat[i] = append(lat[i], s.done.Sub(s.sent))
		}
	}
	for _, at := range hotAt {
		if i := int(at.Sub(t0) / time.Second); !at.Before(t0) && i < secs {
			hotN[i]++
		}
	}
	fmt.Fprintf(&tl, "second, ordinary accepted, ordinary p99 ms, hot accepted (isolate at %.1f s, release at %.1f s, phases start at", isoStart.Sub(t0).Seconds(), relStart.Sub(t0).Seconds())
	for _, w := range phases {
		fmt.Fprintf(&tl, " %.1f", w[0].Sub(t0).Seconds())
	}
	tl.WriteString(" s)\n")
	for i := range lat {
		slices.Sort(lat[i])
		fmt.Fprintf(&tl, "%d %d %.1f %d\n", i, len(lat[i]), float64(hbPct(lat[i], 0.99))/float64(time.Millisecond), hotN[i])
	}
	t.Log("\n" + tl.String())
	if out := os.Getenv("CHATPIPE_E2E_HOT_BENCH_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(section), 0o644); err != nil {
			t.Fatal(err)
		}
		// The timeline and dev's log beside it.
		os.WriteFile(strings.TrimSuffix(out, ".md")+".timeline.txt", []byte(tl.String()), 0o644)
		if log, err := os.ReadFile(filepath.Join(dev.Dir, "dev.log")); err == nil {
			os.WriteFile(strings.TrimSuffix(out, ".md")+".dev.log", log, 0o644)
		}
	}
}

// hbSend is one message's outcome: code "" is accepted.
type hbSend struct {
	conv       string
	sent, done time.Time
	code       protocol.Code
	msg        string
	retries    int
}

type hbRecorder struct {
	mu    sync.Mutex
	sends []hbSend
}

func (r *hbRecorder) add(s hbSend) {
	r.mu.Lock()
	r.sends = append(r.sends, s)
	r.mu.Unlock()
}

func (r *hbRecorder) all() []hbSend {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sends
}

// hbPaced sends one message per tick (after offset), to convs in turn,
// each send in its own goroutine, until stop; wg covers the sends too.
func hbPaced(wg *sync.WaitGroup, cl *stacktest.Client, every, offset time.Duration, convs []string, prefix string, rec *hbRecorder, stop chan struct{}) {
	defer wg.Done()
	select {
	case <-stop:
		return
	case <-time.After(offset):
	}
	tk := time.NewTicker(every)
	defer tk.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-tk.C:
		}
		conv, cmid := convs[i%len(convs)], fmt.Sprintf("%s-%d", prefix, i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec.add(hbSendOnce(cl, conv, cmid))
		}()
	}
}

// hbSendOnce sends a message, retrying (same ids) after `unavailable` as a
// client should; `rate_limited` and any other answer end it.
func hbSendOnce(cl *stacktest.Client, conv, cmid string) hbSend {
	s := hbSend{conv: conv, sent: time.Now()}
	for {
		r, err := cl.Do(map[string]any{"op": "send", "conversation_id": conv, "client_message_id": cmid, "body": "hello from the bench"})
		s.done = time.Now()
		switch {
		case err != nil:
			s.code, s.msg = "error", err.Error()
			return s
		case r.Op == protocol.OpAccepted:
			return s
		case r.Code == protocol.CodeUnavailable && time.Since(s.sent) < time.Minute:
			s.retries++
			time.Sleep(time.Duration(r.RetryAfterMS) * time.Millisecond)
		default:
			s.code, s.msg = r.Code, r.Message
			return s
		}
	}
}

// hbCreate creates conversation conv owned by cl's user, retrying while
// it is unavailable.
func hbCreate(t *testing.T, cl *stacktest.Client, conv string, members ...string) {
	for start := time.Now(); ; {
		r, err := cl.Do(map[string]any{"op": "create", "conversation_id": conv, "members": members})
		if err == nil && r.Code == protocol.CodeUnavailable && time.Since(start) < time.Minute {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if err != nil || (r.Op != protocol.OpAccepted && r.Code != protocol.CodeConflict) {
			t.Errorf("create %s: %+v %v", conv, r, err)
		}
		return
	}
}

// hbConvLimit reads the per-conversation limit's defaults (msg/s, burst)
// from `chatpipe dev -h`.
func hbConvLimit(t *testing.T) (float64, int) {
	out, _ := exec.Command(stacktest.Binary(t), "dev", "-h").CombinedOutput()
	get := func(name string) string {
		m := regexp.MustCompile(`(?m)^\s*-` + name + ` \w+\n.*\(default ([0-9.]+)\)`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("no default for --%s in `chatpipe dev -h`:\n%s", name, out)
		}
		return string(m[1])
	}
	r, err := strconv.ParseFloat(get("rate-conv"), 64)
	if err != nil || r <= 0 {
		t.Fatalf("--rate-conv default %v: %v", r, err)
	}
	b, err := strconv.Atoi(get("rate-conv-burst"))
	if err != nil {
		t.Fatal(err)
	}
	return r, b
}

func hbPct(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(math.Ceil(q*float64(len(sorted))))-1)]
}
