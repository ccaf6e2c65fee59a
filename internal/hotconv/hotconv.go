// Package hotconv estimates the busiest conversations of a stream of
// events in bounded memory: a space-saving heavy-hitters summary of at most
// K keys over two rotating windows, so whatever the number of
// conversations a counter holds at most 2K keys. Time is an input: the
// package reads no clock and a Counter is not safe for concurrent use (its
// owner serialises Add and Top).
//
// Space-saving (Metwally, Agrawal, El Abbadi 2005) keeps K (key, count,
// err) slots. A key already held counts up; a new key takes a free slot or
// replaces the key with the smallest count c, starting at c+1 with err c.
// A held key's true count lies in [count-err, count], and every key that
// makes up more than 1/K of the window's events is held. Rates here are
// the lower bound count-err: a conversation that merely passed through the
// summary reads as nearly 0, not as the smallest count.
package hotconv

import (
	"hash/maphash"
	"sort"
	"time"
)

// Defaults of New.
const (
	DefaultK      = 32
	DefaultWindow = 10 * time.Second
)

// slot is one held key of a window.
type slot struct {
	h     uint64
	key   string
	count uint64
	err   uint64
}

// window is a space-saving summary of the events of one time window.
type window struct {
	slots []slot // len ≤ cap = K
	total uint64 // events counted, held or not
}

// add counts one event of key (hash h).
func (w *window) add(h uint64, key string) {
	w.total++
	minI := -1
	var minC uint64
	for i := range w.slots {
		s := &w.slots[i]
		if s.h == h && s.key == key {
			s.count++
			return
		}
		if minI < 0 || s.count < minC {
			minI, minC = i, s.count
		}
	}
	if len(w.slots) < cap(w.slots) {
		w.slots = append(w.slots, slot{h: h, key: key, count: 1})
		return
	}
	w.slots[minI] = slot{h: h, key: key, count: minC + 1, err: minC}
}

// lower is key's guaranteed count in w (0 if not held).
func (w *window) lower(h uint64, key string) uint64 {
	for i := range w.slots {
		if s := &w.slots[i]; s.h == h && s.key == key {
			return s.count - s.err
		}
	}
	return 0
}

func (w *window) reset() {
	clear(w.slots)
	w.slots = w.slots[:0]
	w.total = 0
}

// Counter is a bounded estimate of the busiest keys' event rates over the
// last one to two windows.
type Counter struct {
	seed      maphash.Seed
	width     time.Duration
	cur, prev window
	curStart  time.Time // start of cur; zero before the first input
	since     time.Time // first input: rates before a whole window count from here
	hasPrev   bool      // prev is the window just before cur
}

// New returns a counter holding at most k keys per window of the given
// width (k ≤ 0: DefaultK; width ≤ 0: DefaultWindow).
func New(k int, width time.Duration) *Counter {
	if k <= 0 {
		k = DefaultK
	}
	if width <= 0 {
		width = DefaultWindow
	}
	return &Counter{
		seed: maphash.MakeSeed(), width: width,
		cur: window{slots: make([]slot, 0, k)}, prev: window{slots: make([]slot, 0, k)},
	}
}

// K is the most keys a window holds.
func (c *Counter) K() int { return cap(c.cur.slots) }

// Held is the number of keys the counter holds (at most 2K).
func (c *Counter) Held() int { return len(c.cur.slots) + len(c.prev.slots) }

// advance rotates the windows up to now. Time going backwards (a clock
// step) is taken as now = the current window's start.
func (c *Counter) advance(now time.Time) {
	if c.curStart.IsZero() {
		c.curStart, c.since = now, now
		return
	}
	d := now.Sub(c.curStart)
	if d < c.width {
		return
	}
	n := d / c.width // whole windows passed
	if n == 1 {
		c.cur, c.prev = c.prev, c.cur
		c.cur.reset()
		c.hasPrev = true
	} else {
		c.cur.reset()
		c.prev.reset()
		c.hasPrev = false
	}
	c.curStart = c.curStart.Add(n * c.width)
}

// Add counts one event of key at now. It never allocates (the slots are
// made by New); it keeps key itself, not a copy, while the key is held.
func (c *Counter) Add(now time.Time, key string) {
	c.advance(now)
	c.cur.add(maphash.String(c.seed, key), key)
}

// Entry is one key's estimated rate.
type Entry struct {
	Key string
	// PerSecond is the key's guaranteed events over the counted span
	// (the current window and, once there is one, the whole previous one)
	// divided by the span's length.
	PerSecond float64
}

// span is the length of time the windows cover at now.
func (c *Counter) span(now time.Time) time.Duration {
	from := c.curStart
	if c.hasPrev {
		from = from.Add(-c.width)
	}
	if from.Before(c.since) {
		from = c.since
	}
	d := now.Sub(from)
	return max(d, time.Second) // a first event does not read as a huge rate
}

// Top returns up to n keys by estimated rate at now, highest first (ties
// by key); keys with no guaranteed event are left out. It rotates the
// windows up to now, so a key that went quiet decays and is gone after two
// windows.
func (c *Counter) Top(now time.Time, n int) []Entry {
	if c.curStart.IsZero() || n <= 0 {
		return nil
	}
	c.advance(now)
	secs := c.span(now).Seconds()
	out := make([]Entry, 0, c.Held())
	for i := range c.cur.slots {
		s := &c.cur.slots[i]
		if cnt := s.count - s.err + c.prev.lower(s.h, s.key); cnt > 0 {
			out = append(out, Entry{Key: s.key, PerSecond: float64(cnt) / secs})
		}
	}
	for i := range c.prev.slots {
		s := &c.prev.slots[i]
		if s.count == s.err || c.heldInCur(s.h, s.key) {
			continue // nothing guaranteed, or counted above
		}
		out = append(out, Entry{Key: s.key, PerSecond: float64(s.count-s.err) / secs})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].PerSecond != out[j].PerSecond {
			return out[i].PerSecond > out[j].PerSecond
		}
		return out[i].Key < out[j].Key
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// heldInCur reports whether the current window holds key.
func (c *Counter) heldInCur(h uint64, key string) bool {
	for i := range c.cur.slots {
		if s := &c.cur.slots[i]; s.h == h && s.key == key {
			return true
		}
	}
	return false
}
