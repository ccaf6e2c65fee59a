package testsched

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

func names(ws []*waiter) []string {
	var out []string
	for _, w := range ws {
		out = append(out, w.name)
	}
	return out
}

func TestNextRanksFitsAndWaitsOutPatience(t *testing.T) {
	t0 := time.Unix(1000, 0)
	w := func(name string, share, rank, seq int, since time.Time) *waiter {
		return &waiter{name: name, share: share, rank: rank, seq: seq, since: since}
	}
	cases := []struct {
		name    string
		waiting []*waiter
		free    int
		now     time.Time
		want    []string
	}{
		{"nothing before settling", []*waiter{w("a", 10, 0, 0, t0)}, 100, t0.Add(-time.Millisecond), nil},
		{"rank first, then arrival", []*waiter{w("a", 10, 0, 0, t0), w("b", 10, 5, 1, t0), w("c", 10, 0, 2, t0)}, 100, t0, []string{"b", "a", "c"}},
		{"only what fits", []*waiter{w("a", 60, 2, 0, t0), w("b", 60, 1, 1, t0), w("c", 30, 0, 2, t0)}, 100, t0, []string{"a", "c"}},
		{"a later one fits beside a large one still in patience", []*waiter{w("big", 100, 9, 0, t0), w("small", 10, 0, 1, t0)}, 50, t0.Add(time.Second), []string{"small"}},
		{"nothing past a large one out of patience", []*waiter{w("big", 100, 9, 0, t0), w("small", 10, 0, 1, t0)}, 50, t0.Add(time.Minute), nil},
		{"none fits", []*waiter{w("a", 40, 0, 0, t0)}, 30, t0, nil},
	}
	for _, c := range cases {
		got := names(next(c.waiting, c.free, c.now, t0, 10*time.Second))
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: started %v, want %v", c.name, got, c.want)
		}
	}
}

// TestPoolNeverExceedsCapacity runs many acquirers with random-ish shares
// and checks the shares in use never pass the capacity, every acquirer
// runs, and the highest rank waiting at the start is among the first.
func TestPoolNeverExceedsCapacity(t *testing.T) {
	p := New(100, 20*time.Millisecond, 50*time.Millisecond)
	var (
		mu    sync.Mutex
		used  int
		peak  int
		order []string
		done  int
		rDone = -1 // how many had finished when the ranked one started
		wg    sync.WaitGroup
	)
	for i := range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			share := []int{10, 30, 50, 100}[i%4]
			rank := 0
			if i == 17 {
				rank = 1
			}
			release, err := p.Acquire(context.Background(), string(rune('A'+i)), share, rank)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			used += share
			peak = max(peak, used)
			order = append(order, string(rune('A'+i)))
			if i == 17 {
				rDone = done
			}
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
			mu.Lock()
			used -= share
			done++
			mu.Unlock()
			release()
			release() // twice is once
		}()
	}
	wg.Wait()
	if peak > 100 {
		t.Errorf("shares in use reached %d of 100", peak)
	}
	if len(order) != 30 {
		t.Fatalf("%d of 30 ran", len(order))
	}
	if rDone != 0 {
		t.Errorf("the ranked one started after %d others had run (order %v), want among the first", rDone, order)
	}
}

func TestAcquireGivesUpWithItsContext(t *testing.T) {
	p := New(10, 0, time.Hour)
	release, err := p.Acquire(context.Background(), "holder", 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := p.Acquire(ctx, "waiter", 5, 0); err == nil {
		t.Fatal("Acquire returned without capacity or an error")
	}
	if got := p.Running(""); !slices.Equal(got, []string{"holder (10)"}) {
		t.Errorf("running %v, want the holder alone", got)
	}
	if got := p.Running("holder"); len(got) != 0 {
		t.Errorf("running beside the holder %v, want nothing", got)
	}
	release()
	r2, err := p.Acquire(context.Background(), "after", 10, 0)
	if err != nil {
		t.Fatalf("the gone waiter kept its place: %v", err)
	}
	r2()
	if got := p.Running(""); len(got) != 0 {
		t.Errorf("running %v after every release", got)
	}
}
