package delivery

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/pglisten"
	"github.com/chatpipe/chatpipe/internal/pgtest"
)

// TestListeningFeedDoesNotPoll: a feed whose LISTEN is in effect reads
// the outbox when a notification wakes it and not on its poll ticks, so
// an idle gateway asks Postgres nothing; without LISTEN it polls.
func TestListeningFeedDoesNotPoll(t *testing.T) {
	for _, noListen := range []bool{false, true} {
		t.Run(map[bool]string{false: "listening", true: "polling"}[noListen], func(t *testing.T) {
			db := pgtest.DB(t, pgtest.Options{})
			f := NewFeed(db, &sink{devices: map[string]int{}, got: map[string][]Push{}}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			f.Poll, f.NoListen = 20*time.Millisecond, noListen
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- f.Run(ctx) }()
			defer func() { cancel(); <-done }()
			waitUntil := func(what string, ok func() bool) {
				t.Helper()
				for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("waiting for %s: %d outbox reads", what, f.reads.Load())
					}
				}
			}
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
