package delivery

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/pglisten"
	"github.com/chatpipe/chatpipe/internal/pgtest"
)

// TestListeningFeedDoesNotPoll: a feed whose LISTEN is in effect reads
// the outbox when a notification wakes it and not on its poll ticks, so
// an idle gateway asks Postgres nothing; without LISTEN it polls. (A
// device is connected: a feed with none reads nothing on a notification,
// TestFeedWithNobodyConnectedFollowsNotifications.)
func TestListeningFeedDoesNotPoll(t *testing.T) {
	for _, noListen := range []bool{false, true} {
		t.Run(map[bool]string{false: "listening", true: "polling"}[noListen], func(t *testing.T) {
			db := pgtest.DB(t, pgtest.Options{})
			f := NewFeed(db, &sink{devices: map[string]int{"u1": 1}, got: map[string][]Push{}}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			f.Poll, f.NoListen = 20*time.Millisecond, noListen
			ctx, waitUntil := runFeed(t, f)
			if noListen {
				waitUntil("10 polls", func() bool { return f.reads.Load() >= 10 })
				return
			}
			// The first read, and the one after the LISTEN took effect.
			waitUntil("the LISTEN", func() bool { return f.listening.Load() && f.reads.Load() >= 2 })
			time.Sleep(50 * time.Millisecond) // a wake-up already queued is read
			before := f.reads.Load()
			time.Sleep(20 * f.Poll)
			if n := f.reads.Load() - before; n != 0 {
				t.Errorf("the listening feed read the outbox %d times in %d poll intervals with nothing committed", n, 20)
			}
			if _, err := db.Exec(ctx, `SELECT pg_notify($1, '1')`, pglisten.Delivery); err != nil {
				t.Fatal(err)
			}
			waitUntil("a read after a notification", func() bool { return f.reads.Load() > before })
		})
	}
}

// switchSink is a sink whose one user, u1, connects and disconnects while
// the feed runs.
type switchSink struct{ on atomic.Bool }

func (s *switchSink) Local(user string) bool            { return user == "u1" && s.on.Load() }
func (s *switchSink) Any() bool                         { return s.on.Load() }
func (s *switchSink) Lost(string)                       {}
func (s *switchSink) Deliver(user string, _ []Push) int { return 1 }

// TestFeedWithNobodyConnectedFollowsNotifications: with no device
// connected, a listening feed moves past the outbox ids the notifications
// name without reading the outbox; once a device is connected, a
// notification makes it read again, from there.
func TestFeedWithNobodyConnectedFollowsNotifications(t *testing.T) {
	db := pgtest.DB(t, pgtest.Options{})
	s := &switchSink{}
	f := NewFeed(db, s, slog.New(slog.NewTextHandler(io.Discard, nil)))
	f.Poll = 20 * time.Millisecond
	ctx, waitUntil := runFeed(t, f)
	notify := func(id string) {
		t.Helper()
		if _, err := db.Exec(ctx, `SELECT pg_notify($1, $2)`, pglisten.Delivery, id); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil("the LISTEN", func() bool { return f.listening.Load() && f.reads.Load() >= 2 })
	time.Sleep(50 * time.Millisecond) // a wake-up already queued is read
	before := f.reads.Load()
	notify("7")
	waitUntil("the position at the notified id", func() bool { return f.last.Load() == 7 })
	notify("9")
	waitUntil("the position at the next notified id", func() bool { return f.last.Load() == 9 })
	if n := f.reads.Load() - before; n != 0 {
		t.Errorf("with nobody connected the feed read the outbox %d times for two notifications", n)
	}
	s.on.Store(true)
	notify("10")
	waitUntil("a read once a device is connected", func() bool { return f.reads.Load() > before })
}

// runFeed runs f until t ends, and returns its context and a wait (up to
// 30 s) that names what it waited for and the feed's reads and position.
func runFeed(t *testing.T, f *Feed) (context.Context, func(what string, ok func() bool)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return ctx, func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("waiting for %s: %d outbox reads, position %d", what, f.reads.Load(), f.last.Load())
			}
		}
	}
}
