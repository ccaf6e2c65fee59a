package schema_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chatpipe/chatpipe/internal/pgtest"
	"github.com/chatpipe/chatpipe/internal/schema"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestPersistResumesWhereTheProjectionStopped: migration 7, run on a
// database the separate projection consumer wrote, moves persist's stored
// offsets back to the projection's where those are lower, reads again from
// the start a partition the projection never reached, and leaves no
// projection offsets behind; another topic, which the projection never
// read, is untouched.
func TestPersistResumesWhereTheProjectionStopped(t *testing.T) {
	db := pgtest.DB(t, pgtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	all, err := schema.Applied(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `DELETE FROM schema_migrations WHERE version = 7`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO consumer_offsets (consumer, topic, log_partition, next_offset) VALUES
		('persist', 't', 0, 100), ('projection', 't', 0, 90),
		('persist', 't', 1, 50), ('projection', 't', 1, 50),
		('persist', 't', 2, 7),
		('persist', 'other', 0, 5)`); err != nil {
		t.Fatal(err)
	}
	if err := schema.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(ctx, `SELECT consumer || ' ' || topic || '/' || log_partition || ' ' || next_offset
		FROM consumer_offsets ORDER BY consumer, topic, log_partition`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if want := "[persist other/0 5 persist t/0 90 persist t/1 50]"; err != nil || fmt.Sprint(got) != want {
		t.Fatalf("offsets after migrating = %v (%v), want %s", got, err, want)
	}
	if n, err := schema.Applied(ctx, db); err != nil || n != all {
		t.Fatalf("applied = %d, %v; want %d", n, err, all)
	}
}

// TestConflictsKeptOncePerRecord: migration 8, run on a database where a
// replay recorded a record's conflict twice, keeps the first row of each
// record and leaves the others alone.
func TestConflictsKeptOncePerRecord(t *testing.T) {
	db := pgtest.DB(t, pgtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := db.Exec(ctx, `DELETE FROM schema_migrations WHERE version = 8`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `DROP INDEX seq_conflicts_record`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO seq_conflicts
		(conversation_id, seq, existing_message_id, incoming_message_id, log_partition, log_offset, seen_at) VALUES
		('c1', 1, 'm-a', 'm-b', 0, 1, '2026-01-01'), ('c1', 1, 'm-a', 'm-b', 0, 1, '2026-01-02'),
		('c1', 1, 'm-a', 'm-b', 0, 1, '2026-01-03'), ('c2', 4, NULL, 'm-c', 1, 1, '2026-01-02')`); err != nil {
		t.Fatal(err)
	}
	if err := schema.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(ctx, `SELECT conversation_id || ' ' || log_partition || '/' || log_offset || ' ' || to_char(seen_at, 'MM-DD')
		FROM seq_conflicts ORDER BY conversation_id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if want := "[c1 0/1 01-01 c2 1/1 01-02]"; err != nil || fmt.Sprint(got) != want {
		t.Fatalf("seq_conflicts after migrating = %v (%v), want %s", got, err, want)
	}
}
