// Package testdeadline gives a test its own deadline, far below go test's
// -timeout for the whole package, and says what the test was waiting for
// when it ran out.
//
// go test's -timeout ends a package that hangs only at the package's
// deadline (60 minutes for the e2e tests), and its goroutine dump names no
// test and no condition. A test armed with For instead ends the test
// binary at its own deadline, printing the test's name, how long it ran,
// each wait it was in (Waiting: "conversation c1 at seq 42 in Postgres",
// since when) and every goroutine's stack, then exits with status 2. The
// processes a test started die with the binary when they were started
// with a parent-death signal, as the e2e tests' are.
package testdeadline

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// Watch is one test's deadline and the waits it is in.
type Watch struct {
	name    string
	limit   time.Duration
	started time.Time

	mu    sync.Mutex
	waits map[int]wait
	next  int
	timer *time.Timer
}

type wait struct {
	what  string
	since time.Time
}

var (
	mu      sync.Mutex
	watches = map[testing.TB]*Watch{}

	atExit []func()

	// expire is what a watch does when its deadline passes; tests of this
	// package replace it.
	expire = func(w *Watch) {
		w.report(os.Stderr)
		pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
		mu.Lock()
		fns := atExit
		mu.Unlock()
		for _, fn := range fns {
			fn()
		}
		os.Exit(2)
	}
)

// AtExit registers fn to run when a deadline ends the test binary, after
// the report (TestMain's clean-up, which os.Exit skips: removing the
// directories it made).
func AtExit(fn func()) {
	mu.Lock()
	defer mu.Unlock()
	atExit = append(atExit, fn)
}

// For returns t's watch, arming it with limit on the first call for t
// (later calls return the same watch and ignore limit). The watch is
// disarmed when t and its subtests end. Once t's clean-up has begun (its
// Context is done), a first call returns a watch that is never armed: a
// goroutine that outlives its test must not end the binary later.
func For(t testing.TB, limit time.Duration) *Watch {
	mu.Lock()
	defer mu.Unlock()
	if w, ok := watches[t]; ok {
		return w
	}
	w := &Watch{name: t.Name(), limit: limit, started: time.Now(), waits: map[int]wait{}}
	if t.Context().Err() != nil {
		return w
	}
	w.timer = time.AfterFunc(limit, func() { expire(w) })
	watches[t] = w
	t.Cleanup(func() {
		w.timer.Stop()
		mu.Lock()
		delete(watches, t)
		mu.Unlock()
	})
	return w
}

// Extend moves the deadline to limit after the test started, if that is
// later than it is now (for a test whose length is configured, such as a
// fault schedule's duration).
func (w *Watch) Extend(limit time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if limit <= w.limit || w.timer == nil {
		return
	}
	w.limit = limit
	w.timer.Reset(time.Until(w.started.Add(limit)))
}

// Waiting records that the test waits for what until the returned func is
// called; a report at the deadline lists every wait still open.
func (w *Watch) Waiting(what string) (done func()) {
	w.mu.Lock()
	id := w.next
	w.next++
	w.waits[id] = wait{what: what, since: time.Now()}
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		delete(w.waits, id)
		w.mu.Unlock()
	}
}

// report writes what the watch knows: the test, its deadline and its open
// waits, oldest first.
func (w *Watch) report(out io.Writer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s ran past its own deadline of %v (started %s, %v ago)\n",
		w.name, w.limit, w.started.Format(time.TimeOnly), now.Sub(w.started).Round(time.Second))
	waits := make([]wait, 0, len(w.waits))
	for _, wt := range w.waits {
		waits = append(waits, wt)
	}
	sort.Slice(waits, func(i, j int) bool { return waits[i].since.Before(waits[j].since) })
	if len(waits) == 0 {
		fmt.Fprintf(&b, "  it was in no recorded wait: see the stacks below\n")
	}
	for _, wt := range waits {
		fmt.Fprintf(&b, "  waiting %v for %s\n", now.Sub(wt.since).Round(time.Second), wt.what)
	}
	fmt.Fprintf(&b, "the test binary's goroutines follow; it exits with status 2\n")
	io.WriteString(out, b.String())
}
