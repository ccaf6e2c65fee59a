package bench

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/stacktest"
)

// TestBenchTakeover measures (it asserts nothing about time) the takeover
// time claim → accepting, for one vshard moving by hand-off and for a
// frozen worker's whole share at once, and the send gap clients see after
// the freeze, on a stack of processes (internal/stacktest). Run it with
// CHATPIPE_BENCH=1 (go test ./tools/bench -run TestBenchTakeover -v); CI
// skips it.
func TestBenchTakeover(t *testing.T) {
	if os.Getenv("CHATPIPE_BENCH") == "" {
		t.Skip("set CHATPIPE_BENCH=1 to run the takeover benchmark")
	}
	dev := stacktest.StartDev(t, t.TempDir(), "--workers", "0", "--vshards", "256", "--partitions", "16")
	wa := stacktest.StartProc(t, dev.Dir, "wa", nil, "worker", "--endpoints", dev.Dir+"/endpoints.json", "--id", "wa")
	stacktest.WaitOwned(t, 60*time.Second, "wa to own every vshard", dev.EP, dev.EP.All(), "wa", dev.EP.All())
	wb := stacktest.StartProc(t, dev.Dir, "wb", nil, "worker", "--endpoints", dev.Dir+"/endpoints.json", "--id", "wb")
	wbStart := time.Now()
	stacktest.WaitOwned(t, 60*time.Second, "wb to get its half", dev.EP, dev.EP.All(), "wb", dev.EP.All()/2)
	stacktest.WaitFor(t, 60*time.Second, "wb to accept on its half", func() bool { return len(takeoverTimes(t, wb.Log)) >= dev.EP.All()/2 })
	handoff := takeoverTimes(t, wb.Log)
	t.Logf("hand-off of 128 of 256 vshards to a live worker, claim→accepting: %s", durStats(handoff))

	load := stacktest.StartLoad(t, dev, 10, 40)
	load.WaitAbove(t, 60*time.Second, "load to flow", 300)
	before := len(takeoverTimes(t, wb.Log))
	wa.Signal(syscall.SIGSTOP)
	frozen := time.Now()
	stacktest.WaitOwned(t, 60*time.Second, "wb to take over every vshard", dev.EP, dev.EP.All(), "wb", dev.EP.All())
	stacktest.WaitFor(t, 60*time.Second, "wb to accept on all of them", func() bool { return len(takeoverTimes(t, wb.Log)) >= before+128 })
	failover := takeoverTimes(t, wb.Log)[before:]
	t.Logf("a frozen worker's 128 of 256 vshards taken over at once, claim→accepting: %s", durStats(failover))
	n := load.Count()
	load.WaitAbove(t, 60*time.Second, "load to go on", n+300)
	accepted := load.Finish()
	wa.Signal(syscall.SIGCONT)
	// the send gap: the longest wait between a send and its accepted, for
	// sends made after the freeze
	var gap time.Duration
	for _, a := range accepted {
		if a.SentAt.After(frozen.Add(-time.Second)) && a.AcceptedAt.Sub(a.SentAt) > gap {
			gap = a.AcceptedAt.Sub(a.SentAt)
		}
	}
	t.Logf("longest send → accepted after the freeze: %v (lease TTL 10 s)", gap.Round(time.Millisecond))
	t.Logf("wb's lease renewals: %v in %v while owning up to %d vshards (one keep-alive stream per worker)",
		stacktest.Metric(t, stacktest.AdminURL(t, dev.EP, "wb"), "chatpipe_worker_lease_renewals_total"), time.Since(wbStart).Round(time.Second), dev.EP.VShards)
}

var tookRe = regexp.MustCompile(`msg=accepting .* took=([0-9.]+[mµn]?s)`)

func takeoverTimes(t *testing.T, logPath string) []time.Duration {
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	var out []time.Duration
	for _, line := range strings.Split(string(b), "\n") {
		if m := tookRe.FindStringSubmatch(line); m != nil {
			d, err := time.ParseDuration(m[1])
			if err == nil {
				out = append(out, d)
			}
		}
	}
	return out
}

func durStats(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return fmt.Sprintf("n=%d", len(s)) + " p50 " + s[len(s)/2].String() + " p99 " + s[len(s)*99/100].String() + " max " + s[len(s)-1].String()
}
