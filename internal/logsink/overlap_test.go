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
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/pgtest"
)

// TestOverlappingBatchesTakeTurns: two members of a group write the same
// records of two partitions at once (one was dropped from the group for a
// slow batch and still writes them). The second batch's statements run
// only once the first batch has committed, and so see its rows: for
// partitions with stored offsets and for their first batch alike
// (docs/architecture.md rule 24; several persist members write through
// Write).
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
			held := pgtest.NewHeld(ctx, t, s.db)
			// Whatever happens, both batches end and give their connections
			// back before the pool closes.
			var writers sync.WaitGroup
			defer func() {
				held.Release()
				writers.Wait()
			}()
			first, firstSeen := member(held)
			second, secondSeen := member(s.db)
			recs := records(2, 3, nil)
			firstDone, secondDone := make(chan error, 1), make(chan error, 1)
			writers.Add(1)
			go func() { defer writers.Done(); firstDone <- first.Write(ctx, recs) }()
			select {
			case <-held.Ran(): // the first batch's rows are written, uncommitted
			case err := <-firstDone:
				t.Fatalf("the first batch ended before its statements ran: %v", err)
			case <-ctx.Done():
				t.Fatal("timed out waiting for the first batch to run its statements")
			}
			writers.Add(1)
			go func() { defer writers.Done(); secondDone <- second.Write(ctx, recs) }()
			finished, secondErr := pgtest.WaitForLockWait(ctx, t, s.db, secondDone, "the second batch")
			held.Release()
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
