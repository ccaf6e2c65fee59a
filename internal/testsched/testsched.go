// Package testsched shares a machine among a package's parallel tests by
// how much of it each keeps busy, and starts the longest first.
//
// go test's -parallel N counts tests: N tests that mostly wait leave the
// machine idle, and N load tests overload it. A Pool instead has a
// capacity in percent of the machine (150 lets the tests together ask
// for one and a half of its cores) and each test asks for its own share
// (what it keeps busy when it runs alone). A test whose timing must not be
// stretched by a neighbour asks for the whole capacity and runs alone.
//
// Among the tests waiting, the one with the highest rank goes first (the
// caller ranks the longest highest, so that none of them starts last and
// makes the package's tail), and a later one may start beside the running
// ones whenever its share fits, unless an earlier one has waited longer
// than the pool's patience: then nothing starts past it, so that a large
// share is not kept waiting by a stream of small ones.
//
// The decisions are in Pool's pure part (next); Acquire adds the waiting.
package testsched

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Pool shares a capacity among tests. The zero value is not usable; use New.
type Pool struct {
	capacity int
	settle   time.Duration
	patience time.Duration
	now      func() time.Time

	mu      sync.Mutex
	first   time.Time // the first Acquire: nothing starts before settle has passed
	waiting []*waiter
	running map[*waiter]bool
	seq     int
	timer   *time.Timer
}

type waiter struct {
	name  string
	share int
	rank  int
	seq   int
	since time.Time
	ready chan struct{}
}

// New returns a pool of capacity (in the callers' units, e.g. percent of
// the machine). Nothing starts until settle has passed since the first
// Acquire, so that the tests go test releases together are all ranked
// before the first starts. A waiter passed over for longer than patience
// stops later ones from starting until it has.
func New(capacity int, settle, patience time.Duration) *Pool {
	if capacity < 1 {
		capacity = 1
	}
	return &Pool{capacity: capacity, settle: settle, patience: patience, now: time.Now, running: map[*waiter]bool{}}
}

// Capacity is the pool's capacity.
func (p *Pool) Capacity() int { return p.capacity }

// Acquire waits until name may run with share of the capacity (clamped to
// 1..capacity) and returns the function that gives the share back. Higher
// rank goes first; ties go in the order of Acquire.
func (p *Pool) Acquire(ctx context.Context, name string, share, rank int) (release func(), err error) {
	share = min(max(share, 1), p.capacity)
	p.mu.Lock()
	now := p.now()
	if p.first.IsZero() {
		p.first = now
	}
	w := &waiter{name: name, share: share, rank: rank, seq: p.seq, since: now, ready: make(chan struct{})}
	p.seq++
	p.waiting = append(p.waiting, w)
	p.grantLocked()
	p.mu.Unlock()

	select {
	case <-w.ready:
		var once sync.Once
		return func() {
			once.Do(func() {
				p.mu.Lock()
				delete(p.running, w)
				p.grantLocked()
				p.mu.Unlock()
			})
		}, nil
	case <-ctx.Done():
		p.mu.Lock()
		defer p.mu.Unlock()
		select {
		case <-w.ready: // granted meanwhile: give it back
			delete(p.running, w)
			p.grantLocked()
		default:
			p.remove(w)
		}
		return nil, fmt.Errorf("waiting to run %s with %d of %d: %w", name, share, p.capacity, ctx.Err())
	}
}

// grantLocked starts every waiter next allows and, while some wait, arms a
// timer for the moment the answer can change by time alone (settling over,
// a waiter's patience out).
func (p *Pool) grantLocked() {
	now := p.now()
	free := p.capacity
	for w := range p.running {
		free -= w.share
	}
	for _, w := range next(p.waiting, free, now, p.first.Add(p.settle), p.patience) {
		p.remove(w)
		p.running[w] = true
		close(w.ready)
	}
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	if len(p.waiting) == 0 {
		return
	}
	wake := p.first.Add(p.settle)
	if !now.Before(wake) {
		wake = time.Time{}
		for _, w := range p.waiting {
			if t := w.since.Add(p.patience); t.After(now) && (wake.IsZero() || t.Before(wake)) {
				wake = t
			}
		}
	}
	if !wake.IsZero() {
		p.timer = time.AfterFunc(wake.Sub(now), func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.grantLocked()
		})
	}
}

// Running lists what runs now but except, each as "name (share)", sorted:
// for a test to say what ran beside it.
func (p *Pool) Running(except string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for w := range p.running {
		if w.name != except {
			out = append(out, fmt.Sprintf("%s (%d)", w.name, w.share))
		}
	}
	sort.Strings(out)
	return out
}

func (p *Pool) remove(w *waiter) {
	for i, x := range p.waiting {
		if x == w {
			p.waiting = append(p.waiting[:i], p.waiting[i+1:]...)
			return
		}
	}
}

// next returns the waiters to start now, with free capacity left: none
// before settled; otherwise in rank order (then arrival), each whose share
// fits what the earlier ones left, stopping at the first that does not fit
// and has waited past patience.
func next(waiting []*waiter, free int, now, settled time.Time, patience time.Duration) []*waiter {
	if now.Before(settled) {
		return nil
	}
	order := append([]*waiter(nil), waiting...)
	sort.SliceStable(order, func(i, j int) bool {
		if order[i].rank != order[j].rank {
			return order[i].rank > order[j].rank
		}
		return order[i].seq < order[j].seq
	})
	var out []*waiter
	for _, w := range order {
		if w.share <= free {
			out = append(out, w)
			free -= w.share
			continue
		}
		if now.Sub(w.since) >= patience {
			break
		}
	}
	return out
}
