package projection

import (
	"context"
	"errors"
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

func newTestProjector(t *testing.T, db *pgxpool.Pool) *Projector {
	t.Helper()
	p, err := New(Config{Brokers: []string{"127.0.0.1:1"}, DB: db, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func rec(t *testing.T, e *logrecord.Event, off int64) *kgo.Record {
	t.Helper()
	b, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return &kgo.Record{Topic: logrecord.DefaultTopic, Partition: 0, Offset: off, Value: b}
}

// TestDeadLetteredByPersistDoesNotHang: persist dead-lettered the record at
// offset 1 (a NUL in its body) and stored its offset past it; the
// projection sees the batch covered and applies it.
func TestDeadLetteredByPersistDoesNotHang(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db := pgtest.DB(t, pgtest.Options{})
	if _, err := db.Exec(ctx, `INSERT INTO consumer_offsets (consumer, topic, log_partition, next_offset) VALUES ('persist', $1, 0, 3)`,
		logrecord.DefaultTopic); err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1, 0).UTC()
	recs := []*kgo.Record{
		rec(t, &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: "c1", Seq: 1, MessageID: "m1", Sender: "u1", Members: []string{"u1"}, CreatedAt: at}, 0),
		rec(t, &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: "c1", Seq: 2, MessageID: "m2", Sender: "u1", Body: "a\x00b", CreatedAt: at}, 1),
		rec(t, &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: "c1", Seq: 3, MessageID: "m3", Sender: "u1", Body: "ok", CreatedAt: at}, 2),
	}
	p := newTestProjector(t, db)
	if err := p.handle(ctx, recs); err != nil {
		t.Fatal(err)
	}
	var last int64
	if err := db.QueryRow(ctx, `SELECT last_seq FROM conversations WHERE conversation_id = 'c1'`).Scan(&last); err != nil || last != 3 {
		t.Errorf("last_seq = %d, %v; want 3", last, err)
	}
}

// TestNewerVersionStopsProjection: a record of a newer schema version fails
// the batch at once (the projection stops visibly, not only waiting behind
// persist), and nothing is applied.
func TestNewerVersionStopsProjection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db := pgtest.DB(t, pgtest.Options{})
	p := newTestProjector(t, db)
	recs := []*kgo.Record{
		rec(t, &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: "c1", Seq: 1, MessageID: "m1", Sender: "u1", Members: []string{"u1"}}, 0),
		{Topic: logrecord.DefaultTopic, Partition: 0, Offset: 1, Value: []byte(`{"v":2,"kind":"message","conversation_id":"c1","seq":2}`)},
	}
	if err := p.handle(ctx, recs); !errors.Is(err, logrecord.ErrUnsupportedVersion) {
		t.Fatalf("handle = %v, want ErrUnsupportedVersion", err)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM conversations`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d conversations (%v), want none", n, err)
	}
}
