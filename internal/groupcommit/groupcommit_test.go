package groupcommit

import (
	"testing"
	"time"
)

// feed runs n batches of a batcher receiving rate items/s with batches
// of the given size and commit time.
func feed(g *Pacer, rate float64, size int, took time.Duration, n int) {
	cycle := time.Duration(float64(size) / rate * float64(time.Second))
	for i := 0; i < n; i++ {
		g.Observe(size, cycle, took)
	}
}

func TestLingerIsZeroUnderTheBudget(t *testing.T) {
	g := &Pacer{Max: 20 * time.Millisecond}
	feed(g, 10, 1, time.Millisecond, 100) // 10/s, share 50 txn/s
	if l := g.Linger(50); l != 0 {
		t.Fatalf("linger %v at 10 commands/s with a 50 txn/s share", l)
	}
	if l := (&Pacer{}).Linger(1); l != 0 {
		t.Fatalf("no budget, linger %v", l)
	}
}

func TestLingerGrowsWithLoadWithinTheBudget(t *testing.T) {
	share := 100.0 // txn/s for this vshard: 1/T = 10 ms
	var last time.Duration
	for _, rate := range []float64{150, 300, 1000, 10000} {
		g := &Pacer{Max: 20 * time.Millisecond}
		feed(g, rate, 1, time.Millisecond, int(rate)) // one second of batches
		l := g.Linger(share)
		if l < last {
			t.Errorf("linger fell from %v to %v as load rose to %v/s", last, l, rate)
		}
		// 1/T − 1/λ − c
		want := time.Duration((1/share - 1/rate - 0.001) * float64(time.Second))
		if d := l - want; d > 200*time.Microsecond || d < -200*time.Microsecond {
			t.Errorf("rate %v: linger %v, want about %v", rate, l, want)
		}
		// the resulting transaction rate stays near the share
		if txn := rate / (1 + rate*(l.Seconds()+0.001)); txn > share*1.05 {
			t.Errorf("rate %v: %v txn/s over a share of %v", rate, txn, share)
		}
		last = l
	}
	g := &Pacer{Max: 2 * time.Millisecond}
	feed(g, 10000, 1, time.Millisecond, 10000)
	if l := g.Linger(share); l != 2*time.Millisecond {
		t.Errorf("linger %v past the 2 ms budget", l)
	}
}

func TestRateIsSmoothedOverWindows(t *testing.T) {
	g := &Pacer{Max: time.Second}
	// 100 batches of 5 every 10 ms: 500/s
	feed(g, 500, 5, 2*time.Millisecond, 100)
	if g.rate < 450 || g.rate > 550 {
		t.Fatalf("rate %v, want about 500", g.rate)
	}
	if g.commit < 0.0019 || g.commit > 0.0021 {
		t.Fatalf("commit %v", g.commit)
	}
	// an idle minute pulls the estimate down
	g.Observe(1, time.Minute, time.Millisecond)
	if g.rate > 400 {
		t.Fatalf("rate %v after an idle minute", g.rate)
	}
}
