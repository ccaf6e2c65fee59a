package persist

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/pgtest"
	"github.com/chatpipe/chatpipe/logrecord"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func newTestPersister(t *testing.T, db *pgxpool.Pool) *Persister {
	t.Helper()
	p, err := New(Config{Brokers: []string{"127.0.0.1:1"}, DB: db, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// record makes a log record of e at partition 0, offset off.
func record(t *testing.T, e *logrecord.Event, off int64) *kgo.Record {
	t.Helper()
	b, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return &kgo.Record{Topic: logrecord.DefaultTopic, Partition: 0, Offset: off, Key: []byte(e.Key()), Value: b}
}

func message(conv string, seq int64, mid, cmid string) *logrecord.Event {
	return &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: conv, Seq: seq, MessageID: mid,
		ClientMessageID: cmid, Sender: "u1", Body: "hi", CreatedAt: time.Unix(1, 0).UTC()}
}

// TestSeqClashInOneBatch: two records with the same (conversation_id, seq)
// and different message_ids in one batch are a broken invariant like a clash
// with a stored row: counted, recorded in seq_conflicts, not inserted.
func TestSeqClashInOneBatch(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	p := newTestPersister(t, db)
	recs := []*kgo.Record{
		record(t, message("c1", 1, "m-a", "k-a"), 0),
		record(t, message("c1", 1, "m-b", "k-b"), 1),
		record(t, message("c1", 2, "m-c", "k-c"), 2),
	}
	if err := p.Write(ctx, recs); err != nil {
		t.Fatal(err)
	}
	if got := p.Stats().Inserted.Load(); got != 2 {
		t.Errorf("inserted = %d, want 2", got)
	}
	if got := p.Stats().Conflicts.Load(); got != 1 {
		t.Errorf("conflicts = %d, want 1", got)
	}
	var existing, incoming string
	var off int64
	if err := db.QueryRow(ctx, `SELECT coalesce(existing_message_id, ''), incoming_message_id, log_offset FROM seq_conflicts`).
		Scan(&existing, &incoming, &off); err != nil {
		t.Fatalf("seq_conflicts: %v", err)
	}
	if existing != "m-a" || incoming != "m-b" || off != 1 {
		t.Errorf("seq_conflicts row = (%q, %q, %d), want (m-a, m-b, 1)", existing, incoming, off)
	}
	var mid string
	if err := db.QueryRow(ctx, `SELECT message_id FROM events WHERE conversation_id = 'c1' AND seq = 1`).Scan(&mid); err != nil || mid != "m-a" {
		t.Errorf("stored c1/1 = %q, %v; want m-a", mid, err)
	}

	// The same batch again is a replay: every row is skipped, the conflict
	// found again (it is still there), nothing inserted.
	if err := p.Write(ctx, recs); err != nil {
		t.Fatal(err)
	}
	if got := p.Stats().Inserted.Load(); got != 2 {
		t.Errorf("inserted after replay = %d, want 2", got)
	}
	if got := p.Stats().Skipped.Load(); got != 2 {
		t.Errorf("skipped after replay = %d, want 2", got)
	}
}

// TestClientMessageIDClashInOneBatch: two messages of one conversation with
// the same client_message_id and different seqs in one batch: the second is
// a conflict, not an insert.
func TestClientMessageIDClashInOneBatch(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	p := newTestPersister(t, db)
	recs := []*kgo.Record{
		record(t, message("c1", 1, "m-a", "k"), 0),
		record(t, message("c1", 2, "m-b", "k"), 1),
	}
	if err := p.Write(ctx, recs); err != nil {
		t.Fatal(err)
	}
	if ins, c := p.Stats().Inserted.Load(), p.Stats().Conflicts.Load(); ins != 1 || c != 1 {
		t.Errorf("inserted, conflicts = %d, %d; want 1, 1", ins, c)
	}
}
