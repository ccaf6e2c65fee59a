package gateway

import (
	"context"
	"sync"
	"sync/atomic"
)

// moveWatch cancels calls whose vshard's owner row moves while they wait
// for their answer: a frozen owner never answers, and dedupe makes asking
// the new owner safe. One goroutine watches the ownership view for every
// call in flight (it was a goroutine per call); it runs while calls are in
// flight and ends when the last one is done.
type moveWatch struct {
	owners Owners

	mu      sync.Mutex
	calls   map[*moveCall]struct{}
	running bool          // a watcher goroutine is running
	idle    chan struct{} // capacity 1: wakes the watcher when calls empties
}

// moveCall is one call in flight to the owner of vshard v at epoch.
type moveCall struct {
	v      int
	epoch  int64
	cancel context.CancelFunc
	moved  atomic.Bool // the row moved and cancel was called
}

func newMoveWatch(owners Owners) *moveWatch {
	return &moveWatch{owners: owners, calls: map[*moveCall]struct{}{}, idle: make(chan struct{}, 1)}
}

// add watches c until remove; c is cancelled at once if its row has moved
// already.
func (m *moveWatch) add(c *moveCall) {
	m.mu.Lock()
	m.calls[c] = struct{}{}
	start := !m.running
	m.running = true
	m.mu.Unlock()
	if start {
		go m.watch()
	}
	// A move between the caller's lookup and the watcher's next scan.
	if row, _, _ := m.owners.Route(c.v); row.Epoch != c.epoch {
		c.moved.Store(true)
		c.cancel()
	}
}

// remove stops watching c; after it, c.moved no longer changes.
func (m *moveWatch) remove(c *moveCall) {
	m.mu.Lock()
	delete(m.calls, c)
	empty := len(m.calls) == 0
	m.mu.Unlock()
	if empty {
		select {
		case m.idle <- struct{}{}:
		default:
		}
	}
}

// watch scans the calls in flight at every change of the view and cancels
// those whose row moved, until none is in flight.
func (m *moveWatch) watch() {
	var hit []*moveCall
	for {
		changed := m.owners.Changed() // before the scan: a change during it wakes the next
		hit = hit[:0]
		m.mu.Lock()
		if len(m.calls) == 0 {
			m.running = false
			m.mu.Unlock()
			return
		}
		for c := range m.calls {
			if row, _, _ := m.owners.Route(c.v); row.Epoch != c.epoch && !c.moved.Load() {
				c.moved.Store(true)
				hit = append(hit, c)
			}
		}
		m.mu.Unlock()
		for _, c := range hit {
			c.cancel()
		}
		select {
		case <-changed:
		case <-m.idle:
		}
	}
}
