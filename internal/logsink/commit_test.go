package logsink

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestCommitIsOneTransaction: when a later statement of a batch fails, the
// earlier ones are rolled back with it, with and without a hold before the
// commit; when none fails, all of them are written.
func TestCommitIsOneTransaction(t *testing.T) {
	ctx := context.Background()
	s := newSink(t)
	recs := []*kgo.Record{{Topic: testTopic, Partition: 0, Offset: 4}, {Topic: testTopic, Partition: 1, Offset: 7}}
	read := func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("second: %w", err)
		}
		return execOffsets(br, "sink")
	}
	for _, hold := range []time.Duration{0, time.Millisecond} {
		var b pgx.Batch
		b.Queue(`INSERT INTO sink VALUES (0, 4, 'a')`)
		b.Queue(`SELECT 1 / 0`)
		parts, offs := nextOffsetArrays(recs)
		queueOffsets(&b, "sink", testTopic, parts, offs)
		err := commit(ctx, s.db, &b, hold, read)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "22012" {
			t.Fatalf("hold %v: commit = %v, want division by zero", hold, err)
		}
		var n int
		if err := s.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM sink) + (SELECT count(*) FROM consumer_offsets)`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("hold %v: %d rows written (%v), want none", hold, n, err)
		}
	}
	var b pgx.Batch
	b.Queue(`INSERT INTO sink VALUES (0, 4, 'a')`)
	b.Queue(`SELECT 1`)
	parts, next := nextOffsetArrays(recs)
	queueOffsets(&b, "sink", testTopic, parts, next)
	if err := commit(ctx, s.db, &b, 0, read); err != nil {
		t.Fatal(err)
	}
	offs, err := Offsets(ctx, s.db, "sink", testTopic)
	if err != nil || len(offs) != 2 || offs[0] != 5 || offs[1] != 8 {
		t.Errorf("offsets = %v, %v; want 0: 5, 1: 8", offs, err)
	}
}

// TestNextOffsetArrays: one entry per partition, in order of first
// appearance, with the offset after its last record.
func TestNextOffsetArrays(t *testing.T) {
	recs := []*kgo.Record{{Partition: 2, Offset: 3}, {Partition: 2, Offset: 4}, {Partition: 0, Offset: 9}, {Partition: 1, Offset: 1}, {Partition: 0, Offset: 10}}
	parts, offs := nextOffsetArrays(recs)
	if fmt.Sprint(parts, offs) != "[2 0 1] [5 11 2]" {
		t.Errorf("nextOffsetArrays = %v %v, want [2 0 1] [5 11 2]", parts, offs)
	}
}

// TestWriteStoresOffsetsAndAnnounces: Write sends what Handle queued with
// the records' offsets and the announcement after them, in one transaction;
// Committed runs only once it is committed. When a statement Handle queued
// fails, neither the rows nor the offsets are written, nothing is
// announced, and Committed does not run.
func TestWriteStoresOffsetsAndAnnounces(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := newSink(t)
	s.c.cfg.Announce = "sink_written"
	listener, err := s.db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	if _, err := listener.Exec(ctx, "LISTEN sink_written"); err != nil {
		t.Fatal(err)
	}
	committed := 0
	fail := false
	s.c.cfg.Handle = func(ctx context.Context, b *pgx.Batch, recs []*kgo.Record) (Queued, error) {
		q, err := s.handle(ctx, b, recs)
		if fail {
			b.Queue(`SELECT 1 / 0`)
		}
		q.Committed = func() { committed++ }
		return q, err
	}
	recs := records(2, 3, nil)

	fail = true
	var pe *pgconn.PgError
	if err := s.c.Write(ctx, recs); !errors.As(err, &pe) || pe.Code != "22012" {
		t.Fatalf("Write = %v, want division by zero", err)
	}
	var n int
	if err := s.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM sink) + (SELECT count(*) FROM consumer_offsets)`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows written (%v), want none", n, err)
	}
	if committed != 0 {
		t.Errorf("Committed ran %d times after a failed batch", committed)
	}

	fail = false
	if err := s.c.Write(ctx, recs); err != nil {
		t.Fatal(err)
	}
	s.check(t, 2, 3, nil)
	if committed != 1 {
		t.Errorf("Committed ran %d times, want 1", committed)
	}
	note, err := listener.Conn().WaitForNotification(ctx)
	if err != nil || note.Channel != "sink_written" {
		t.Fatalf("notification = %+v, %v; want one on sink_written", note, err)
	}
	// The failed batch announced nothing: this is the only notification.
	wctx, wcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer wcancel()
	if note, err := listener.Conn().WaitForNotification(wctx); err == nil {
		t.Errorf("second notification %+v: the failed batch was announced", note)
	}
}

// TestWriteTimesOut: a batch whose round trip does not come back within
// BatchTimeout (a Postgres that stopped answering) is abandoned with an
// error, which Run retries, and writes nothing.
func TestWriteTimesOut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := newSink(t)
	s.c.cfg.BatchTimeout = 300 * time.Millisecond
	s.c.cfg.Handle = func(ctx context.Context, b *pgx.Batch, recs []*kgo.Record) (Queued, error) {
		q, err := s.handle(ctx, b, recs)
		b.Queue(`SELECT pg_sleep(10)`)
		return q, err
	}
	start := time.Now()
	err := s.c.Write(ctx, records(2, 3, nil))
	if err == nil {
		t.Fatal("Write of a batch that takes 10 s returned nil; want a timeout")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Write returned after %v, want about the 300 ms BatchTimeout", took)
	}
	if class, _ := classify(err); class != transient {
		t.Errorf("a timed-out batch is classified %v, want transient (retried)", class)
	}
	var n int
	if err := s.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM sink) + (SELECT count(*) FROM consumer_offsets)`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows written (%v), want none", n, err)
	}
}
