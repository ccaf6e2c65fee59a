package hotconv

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// keys returns n distinct conversation ids.
func keys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("conv-%06d", i)
	}
	return out
}

// TestHeavyHitterFound: one conversation at 500 events/s among 10 000
// that send 1 event/s between them each is found first, with its rate.
func TestHeavyHitterFound(t *testing.T) {
	c := New(32, 10*time.Second)
	ks := keys(10000)
	rng := rand.New(rand.NewPCG(1, 2))
	now := t0
	const step = time.Millisecond // 1000 events/s: half hot, half spread
	for i := 0; i < 25000; i++ {
		now = now.Add(step)
		if i%2 == 0 {
			c.Add(now, "hot")
		} else {
			c.Add(now, ks[rng.IntN(len(ks))])
		}
	}
	top := c.Top(now, 5)
	if len(top) == 0 || top[0].Key != "hot" {
		t.Fatalf("top = %+v, want hot first", top)
	}
	if got := top[0].PerSecond; math.Abs(got-500) > 25 {
		t.Errorf("hot's rate = %.1f/s, want about 500", got)
	}
	for _, e := range top[1:] {
		if e.PerSecond > 10 {
			t.Errorf("%s reads %.1f/s: noise should read as nearly nothing", e.Key, e.PerSecond)
		}
	}
}

// TestOrderAndRates: several steady conversations come out in order of
// rate with about their rates, also across a rotation.
func TestOrderAndRates(t *testing.T) {
	c := New(8, 10*time.Second)
	rates := map[string]int{"a": 50, "b": 20, "c": 5} // events per second
	now := t0
	for sec := 0; sec < 15; sec++ {
		for k, r := range rates {
			for i := 0; i < r; i++ {
				c.Add(now.Add(time.Duration(sec)*time.Second+time.Duration(i)*time.Second/time.Duration(r)), k)
			}
		}
	}
	now = now.Add(15 * time.Second)
	top := c.Top(now, 10)
	if len(top) != 3 || top[0].Key != "a" || top[1].Key != "b" || top[2].Key != "c" {
		t.Fatalf("top = %+v, want a, b, c", top)
	}
	for _, e := range top {
		if want := float64(rates[e.Key]); math.Abs(e.PerSecond-want) > want*0.1 {
			t.Errorf("%s = %.2f/s, want about %.0f", e.Key, e.PerSecond, want)
		}
	}
	if top := c.Top(now, 2); len(top) != 2 || top[1].Key != "b" {
		t.Errorf("Top(2) = %+v", top)
	}
}

// TestBounded: however many distinct conversations, a counter holds at
// most 2K keys.
func TestBounded(t *testing.T) {
	c := New(16, time.Second)
	now := t0
	for i := 0; i < 200000; i++ {
		now = now.Add(37 * time.Microsecond)
		c.Add(now, fmt.Sprintf("c%d", i))
		if c.Held() > 2*c.K() {
			t.Fatalf("holds %d keys after %d events, K=%d", c.Held(), i+1, c.K())
		}
	}
	if c.K() != 16 {
		t.Errorf("K = %d", c.K())
	}
	if top := c.Top(now, 100); len(top) > 32 {
		t.Errorf("Top returned %d entries, more than 2K", len(top))
	}
}

// TestDecay: a conversation that goes quiet reads lower after a rotation
// and is gone two windows later; a gap of two windows drops everything.
func TestDecay(t *testing.T) {
	c := New(4, 10*time.Second)
	for i := 0; i < 1000; i++ { // 100/s for 10 s
		c.Add(t0.Add(time.Duration(i)*10*time.Millisecond), "x")
	}
	at := func(d time.Duration) float64 {
		top := c.Top(t0.Add(d), 1)
		if len(top) == 0 {
			return 0
		}
		return top[0].PerSecond
	}
	if r := at(9999 * time.Millisecond); math.Abs(r-100) > 2 {
		t.Fatalf("rate while sending = %.1f, want 100", r)
	}
	r15 := at(15 * time.Second)
	if math.Abs(r15-1000.0/15) > 2 {
		t.Errorf("rate 5 s after going quiet = %.1f, want 1000/15", r15)
	}
	if r := at(19 * time.Second); r >= r15 {
		t.Errorf("rate did not keep falling: %.1f after %.1f", r, r15)
	}
	if r := at(20 * time.Second); r != 0 {
		t.Errorf("rate two windows later = %.1f, want gone", r)
	}
	c.Add(t0.Add(21*time.Second), "y")
	if c.Held() != 1 {
		t.Errorf("holds %d keys after the gap, want only y", c.Held())
	}
	// A gap of several windows at once.
	c.Add(t0.Add(95*time.Second), "z")
	if top := c.Top(t0.Add(95*time.Second), 5); len(top) != 1 || top[0].Key != "z" {
		t.Errorf("after a long gap top = %+v, want only z", top)
	}
}

// TestFirstEvent: a fresh counter does not read one event as a huge rate,
// and an empty one has nothing.
func TestFirstEvent(t *testing.T) {
	c := New(0, 0)
	if c.K() != DefaultK || c.width != DefaultWindow {
		t.Fatalf("defaults: K=%d width=%v", c.K(), c.width)
	}
	if top := c.Top(t0, 5); top != nil {
		t.Fatalf("empty counter: %+v", top)
	}
	c.Add(t0, "a")
	if top := c.Top(t0, 5); len(top) != 1 || top[0].PerSecond != 1 {
		t.Errorf("one event: %+v, want 1/s (span floored at 1 s)", top)
	}
	// Time going backwards is taken as no time passing.
	c.Add(t0.Add(-time.Minute), "a")
	if top := c.Top(t0, 5); len(top) != 1 || top[0].PerSecond != 2 {
		t.Errorf("after a clock step back: %+v", top)
	}
}

// TestNoAllocs: in steady state Add allocates nothing, hits and misses
// alike, across rotations.
func TestNoAllocs(t *testing.T) {
	c := New(32, 10*time.Millisecond)
	ks := keys(1000)
	now := t0
	for i := 0; i < 10000; i++ { // fill both windows
		now = now.Add(time.Microsecond)
		c.Add(now, ks[i%len(ks)])
	}
	i := 0
	allocs := testing.AllocsPerRun(20000, func() {
		now = now.Add(time.Microsecond)
		k := ks[i%len(ks)]
		if i%3 == 0 {
			k = "hot"
		}
		c.Add(now, k)
		i++
	})
	if allocs != 0 {
		t.Errorf("Add allocates %.2f times per event", allocs)
	}
}

// BenchmarkAdd is the per-event cost on the commit path, windows
// rotating: a skewed stream over 10 000 conversations (mostly hits), and a
// uniform one over 100 000 (nearly every event replaces a key).
func BenchmarkAdd(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	zipf := rand.NewZipf(rng, 1.1, 1, 10000-1)
	for _, bc := range []struct {
		name string
		n    int
		pick func() int
	}{
		{"zipf", 10000, func() int { return int(zipf.Uint64()) }},
		{"uniform", 100000, func() int { return rng.IntN(100000) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := New(DefaultK, 10*time.Millisecond)
			ks := keys(bc.n)
			stream := make([]string, 1<<16)
			for i := range stream {
				stream[i] = ks[bc.pick()]
			}
			now := t0
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				now = now.Add(time.Microsecond)
				c.Add(now, stream[i&(len(stream)-1)])
			}
		})
	}
}
