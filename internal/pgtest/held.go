package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Held is a database handle (logsink.DB) whose batches are slow to
// commit, for tests of two writers overlapping: it runs each batch sent
// through it in one transaction and, once the batch's statements have run,
// closes Ran and keeps the transaction open (its rows and locks held)
// until Release. Its transaction is rolled back at the test's end if no
// batch committed it.
type Held struct {
	*pgxpool.Pool
	tx       pgx.Tx
	ran      chan struct{}
	release  chan struct{}
	released bool
}

// NewHeld begins the held transaction on db.
func NewHeld(ctx context.Context, t testing.TB, db *pgxpool.Pool) *Held {
	t.Helper()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := &Held{Pool: db, tx: tx, ran: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return h
}

// Ran is closed once a batch's statements have run in the transaction.
func (h *Held) Ran() <-chan struct{} { return h.ran }

// Release lets the held batch commit. Safe twice; call it (and wait for
// the writer) before the test ends.
func (h *Held) Release() {
	if !h.released {
		h.released = true
		close(h.release)
	}
}

// SendBatch runs b in the held transaction.
func (h *Held) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return &heldResults{BatchResults: h.tx.SendBatch(ctx, b), h: h, ctx: ctx}
}

// heldResults commits the held transaction when the batch is closed,
// once Release was called.
type heldResults struct {
	pgx.BatchResults
	h   *Held
	ctx context.Context
}

func (r *heldResults) Close() error {
	err := r.BatchResults.Close()
	close(r.h.ran)
	<-r.h.release
	if err != nil {
		_ = r.h.tx.Rollback(r.ctx)
		return err
	}
	return r.h.tx.Commit(r.ctx)
}

// WaitForLockWait waits until a session of db's database waits for a
// lock, or done delivers (the batch it waits for ended without waiting:
// its error is returned with finished set). what names that batch in a
// failure.
func WaitForLockWait(ctx context.Context, t testing.TB, db *pgxpool.Pool, done <-chan error, what string) (finished bool, err error) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		var waiting int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatalf("waiting for %s to wait for a lock: %v", what, err)
		}
		if waiting > 0 {
			return false, nil
		}
		select {
		case err := <-done:
			return true, err
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s to wait for a lock", what)
		}
	}
}
