package e2e

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBenchTakeover measures (it asserts nothing about time) the takeover
// time claim → accepting, for one vshard moving by hand-off and for a
// frozen worker's whole share at once, and the send gap clients see after
// the freeze. Run it with CHATPIPE_BENCH=1 (go test ./e2e -run
// TestBenchTakeover -v); CI skips it.
func TestBenchTakeover(t *testing.T) {
	if os.Getenv("CHATPIPE_BENCH") == "" {
		t.Skip("set CHATPIPE_BENCH=1 to run the takeover benchmark")
	}
	dev := startDev(t, t.TempDir(), "--workers", "0", "--vshards", "256", "--partitions", "16")
	wa := startProc(t, dev.dir, "wa", nil, "worker", "--endpoints", dev.dir+"/endpoints.json", "--id", "wa")
	waitOwned(t, 60*time.Second, "wa to own every vshard", dev.ep, dev.ep.all(), "wa", dev.ep.all())
	wb := startProc(t, dev.dir, "wb", nil, "worker", "--endpoints", dev.dir+"/endpoints.json", "--id", "wb")
	wbStart := time.Now()
	waitOwned(t, 60*time.Second, "wb to get its half", dev.ep, dev.ep.all(), "wb", dev.ep.all()/2)
	waitFor(t, 60*time.Second, "wb to accept on its half", func() bool { return len(takeoverTimes(t, wb.log)) >= dev.ep.all()/2 })
	handoff := takeoverTimes(t, wb.log)
	t.Logf("hand-off of 128 of 256 vshards to a live worker, claim→accepting: %s", durStats(handoff))

	load := startLoad(t, dev, 10, 40)
	load.waitAbove(t, 60*time.Second, "load to flow", 300)
	before := len(takeoverTimes(t, wb.log))
	wa.signal(syscall.SIGSTOP)
	frozen := time.Now()
	waitOwned(t, 60*time.Second, "wb to take over every vshard", dev.ep, dev.ep.all(), "wb", dev.ep.all())
	waitFor(t, 60*time.Second, "wb to accept on all of them", func() bool { return len(takeoverTimes(t, wb.log)) >= before+128 })
	failover := takeoverTimes(t, wb.log)[before:]
	t.Logf("a frozen worker's 128 of 256 vshards taken over at once, claim→accepting: %s", durStats(failover))
	n := load.count()
	load.waitAbove(t, 60*time.Second, "load to go on", n+300)
	accepted := load.finish()
	wa.signal(syscall.SIGCONT)
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
		metric(t, adminURL(t, dev.ep, "wb"), "chatpipe_worker_lease_renewals_total"), time.Since(wbStart).Round(time.Second), dev.ep.VShards)
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
