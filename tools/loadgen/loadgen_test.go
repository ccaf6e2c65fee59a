package loadgen

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/atomicfile"
)

func TestPeakRate(t *testing.T) {
	exact := 50e6 * 40 / 86400 * 10
	if PeakRate > exact || exact-PeakRate >= 10 {
		t.Fatalf("PeakRate %v is not 50 M × 40 ÷ 86,400 × 10 = %v rounded down to tens", PeakRate, exact)
	}
}

func TestSizeKeepsUnderTheDefaultLimits(t *testing.T) {
	for _, rate := range []float64{10, 200, 2314.8, PeakRate} {
		s, err := Size(Profiles["peak"], rate)
		if err != nil {
			t.Fatal(err)
		}
		if perUser := rate / float64(s.Users); perUser > DefaultUserRate/4 {
			t.Errorf("rate %v: %v msg/s per user", rate, perUser)
		}
		if perConv := rate / float64(s.Conversations); perConv > DefaultConvRate/10 {
			t.Errorf("rate %v: %v msg/s per conversation", rate, perConv)
		}
	}
	if _, err := Size(Profiles["peak"], 0); err == nil {
		t.Error("rate 0 accepted")
	}
}

func TestPlan(t *testing.T) {
	p := Profiles["peak"]
	s := Shape{Users: 300, Conversations: 2000}
	a, b := NewPlan("r", s, p, 7), NewPlan("r", s, p, 7)
	if len(a.Conversations) != 2000 || len(a.Users) != 300 {
		t.Fatalf("plan has %d users, %d conversations", len(a.Users), len(a.Conversations))
	}
	groups := 0
	for i, c := range a.Conversations {
		if c.ID != b.Conversations[i].ID || strings.Join(c.Members, ",") != strings.Join(b.Conversations[i].Members, ",") {
			t.Fatal("the same seed made different plans")
		}
		if len(c.Members) < 2 || len(c.Members) > 100 || c.Members[0] != c.Owner {
			t.Fatalf("%s: %d members, owner %s first %s", c.ID, len(c.Members), c.Owner, c.Members[0])
		}
		seen := map[string]bool{}
		for _, m := range c.Members {
			if seen[m] {
				t.Fatalf("%s lists %s twice", c.ID, m)
			}
			seen[m] = true
		}
		if len(c.Members) > 2 {
			groups++
		}
	}
	if share := float64(groups) / 2000; share < 0.15 || share > 0.25 {
		t.Errorf("group share %v, profile %v", share, p.GroupShare)
	}
	hot := NewPlan("h", Shape{Users: 20, Conversations: 1}, Profiles["hot"], 1)
	if len(hot.Conversations) != 1 || len(hot.Conversations[0].Members) != 20 {
		t.Errorf("hot plan: %+v", hot.Conversations)
	}
}

func TestScheduleIsOpenLoop(t *testing.T) {
	s := Schedule{Rate: 1000}
	if got := s.DueBy(0); got != 1 {
		t.Errorf("due at 0: %d", got)
	}
	if got := s.DueBy(1.0005); got != 1001 {
		t.Errorf("due by 1.0005 s: %d", got)
	}
	if s.Due(500) != 0.5 {
		t.Errorf("message 500 due at %v", s.Due(500))
	}
}

func TestBodyCarriesDueTime(t *testing.T) {
	due := time.Unix(1700000000, 123456789)
	b := messageBody("m42", due, 100)
	if len(b) != 100 {
		t.Errorf("body of %d bytes", len(b))
	}
	got, ok := bodyDue(b)
	if !ok || !got.Equal(due) {
		t.Errorf("due %v %v, want %v", got, ok, due)
	}
	if _, ok := bodyDue("hello"); ok {
		t.Error("a foreign body parsed")
	}
}

func TestLedger(t *testing.T) {
	out := t.TempDir()
	ledger := filepath.Join(out, LedgerFile)
	dir := filepath.Join(out, "r1")
	now := time.Unix(1700000000, 0)
	if err := BeginRun(ledger, "r1", dir, now); err != nil {
		t.Fatal(err)
	}
	// The process dies in the send phase; the next attempt notes it.
	os.MkdirAll(dir, 0o755)
	if err := atomicfile.Write(filepath.Join(dir, PhaseFile), []byte("send\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := BeginRun(ledger, "r1", dir, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	end := now.Add(2 * time.Minute)
	fin := LedgerLine{Run: "r1", Status: StatusFinished, Start: now.Add(time.Minute), End: &end}
	if err := EndRun(ledger, fin); err != nil {
		t.Fatal(err)
	}
	// Ending again, or starting a finished run again, appends nothing.
	if err := EndRun(ledger, fin); err != nil {
		t.Fatal(err)
	}
	if err := BeginRun(ledger, "r1", dir, end); !errors.Is(err, ErrRunFinished) {
		t.Fatalf("re-running a finished run: %v", err)
	}
	lines, err := ReadLedger(ledger)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range lines {
		got = append(got, l.Status+":"+l.Phase)
	}
	if strings.Join(got, " ") != "started: died:send started: finished:" {
		t.Fatalf("ledger: %v", got)
	}
}

func TestReportMarkdown(t *testing.T) {
	r := &Report{Run: "r", Profile: "peak", Status: StatusFailed, Phase: "create", Error: "boom", Rate: 100, Duration: "10s",
		Rejects: map[string]int64{"forbidden": 2}, AcceptedLat: Latency{Count: 3, P50MS: 1, P99MS: 2}}
	md := r.Markdown()
	for _, want := range []string{"| status | failed (in phase create: boom) |", "forbidden 2", "| 1.0 / 0.0 / 2.0 / 0.0 / 0.0 ms (n=3) |"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

func TestLatencyHistogram(t *testing.T) {
	l := newLatency()
	for i := 1; i <= 100; i++ {
		l.record(time.Duration(i) * time.Millisecond)
	}
	s := l.summary()
	if s.Count != 100 || s.P50MS < 49 || s.P50MS > 51 || s.P99MS < 98 || s.P99MS > 100 || s.HDR == "" {
		t.Fatalf("summary %+v", s)
	}
	p99, n := l.takeInterval()
	if n != 100 || p99 < 98*time.Millisecond {
		t.Fatalf("interval p99 %v n %d", p99, n)
	}
	if _, n := l.takeInterval(); n != 0 {
		t.Fatal("interval not reset")
	}
}
