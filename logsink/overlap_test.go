package logsink

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// heldDB is a member whose batch is slow to commit: it runs each batch
// sent through it in tx and, once the batch's statements have run, closes
// ran and keeps tx open (its rows and locks held) until release is closed.
type heldDB struct {
	*pgxpool.Pool
	tx      pgx.Tx
	ran     chan struct{}
	release chan struct{}
}

func (h *heldDB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return &heldResults{BatchResults: h.tx.SendBatch(ctx, b), h: h, ctx: ctx}
}

// heldResults commits the held transaction when the batch is closed, once
// heldDB.release is closed.
type heldResults struct {
	pgx.BatchResults
	h   *heldDB
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

// waitForLockWait waits until a session of db's database waits for a
// lock, or done delivers (the batch it waits for ended without waiting:
// its error is returned with finished set).
func waitForLockWait(ctx context.Context, t *testing.T, db *pgxpool.Pool, done <-chan error, what string) (finished bool, err error) {
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

// TestOverlappingBatchesTakeTurns: two members of a group write the same
// records of two partitions at once (one was dropped from the group for a
// slow batch and still writes them). The second batch's statements run
// only once the first batch has committed, and so see its rows: for
// partitions with stored offsets and for their first batch alike
// (docs/architecture.md rule 24; persist and the projection both write
// through Write).
func TestOverlappingBatchesTakeTurns(t *testing.T) {
	for _, stored := range []bool{true, false} {
		t.Run(fmt.Sprintf("offsets stored %v", stored), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s := newSink(t)
			if stored {
				if _, err := s.db.Exec(ctx, `INSERT INTO consumer_offsets (consumer, topic, log_partition, next_offset)
					VALUES ('sink', $1, 0, 0), ('sink', $1, 1, 0)`, testTopic); err != nil {
					t.Fatal(err)
				}
			}
			// member is a consumer whose batch first counts the rows of
			// the sink it sees (into seen), then inserts its own.
			member := func(db DB) (*Consumer, *int64) {
				seen := int64(-1)
				handle := func(ctx context.Context, b *pgx.Batch, recs []*kgo.Record) (Queued, error) {
					var parts []int32
					var offs []int64
					var bodies []string
					for _, r := range recs {
						parts, offs, bodies = append(parts, r.Partition), append(offs, r.Offset), append(bodies, string(r.Value))
					}
					b.Queue(`SELECT count(*) FROM sink`)
					b.Queue(`INSERT INTO sink SELECT * FROM unnest($1::int[], $2::bigint[], $3::text[]) ON CONFLICT DO NOTHING`, parts, offs, bodies)
					return Queued{Read: func(br pgx.BatchResults) error {
						if err := br.QueryRow().Scan(&seen); err != nil {
							return fmt.Errorf("count: %w", err)
						}
						if _, err := br.Exec(); err != nil {
							return fmt.Errorf("insert: %w", err)
						}
						return nil
					}}, nil
				}
				return New(Config{Topic: testTopic, Consumer: "sink", DB: db, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
					Handle: handle}, "chatpipe_sink", "lag"), &seen
			}
			tx, err := s.db.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			held := &heldDB{Pool: s.db, tx: tx, ran: make(chan struct{}), release: make(chan struct{})}
			released := false
			release := func() {
				if !released {
					released = true
					close(held.release)
				}
			}
			// Whatever happens, both batches end and give their connections
			// back before the pool closes.
			var writers sync.WaitGroup
			defer func() {
				release()
				writers.Wait()
				_ = tx.Rollback(context.Background()) // if no batch committed it
			}()
			first, firstSeen := member(held)
			second, secondSeen := member(s.db)
			recs := records(2, 3, nil)
			firstDone, secondDone := make(chan error, 1), make(chan error, 1)
			writers.Add(1)
			go func() { defer writers.Done(); firstDone <- first.Write(ctx, recs) }()
			select {
			case <-held.ran: // the first batch's rows are written, uncommitted
			case err := <-firstDone:
				t.Fatalf("the first batch ended before its statements ran: %v", err)
			case <-ctx.Done():
				t.Fatal("timed out waiting for the first batch to run its statements")
			}
			writers.Add(1)
			go func() { defer writers.Done(); secondDone <- second.Write(ctx, recs) }()
			finished, secondErr := waitForLockWait(ctx, t, s.db, secondDone, "the second batch")
			release()
			if err := <-firstDone; err != nil {
				t.Fatalf("first batch: %v", err)
			}
			if !finished {
				secondErr = <-secondDone
			}
			if secondErr != nil {
				t.Fatalf("second batch: %v", secondErr)
			}
			if *firstSeen != 0 {
				t.Errorf("the first batch saw %d rows, want 0", *firstSeen)
			}
			if *secondSeen != int64(len(recs)) {
				t.Errorf("the second batch saw %d of the first batch's %d rows: it ran before the first committed", *secondSeen, len(recs))
			}
			s.check(t, 2, 3, nil)
		})
	}
}
