package projection

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/logsink"
	"github.com/chatpipe/chatpipe/internal/pglisten"
	"github.com/chatpipe/chatpipe/internal/pgtest"
	"github.com/chatpipe/chatpipe/logrecord"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testProjector applies batches to the read model alone, through a logsink
// consumer as persist does (offsets first, one transaction).
type testProjector struct {
	consumer *logsink.Consumer
	model    *ReadModel
}

// testConsumer is the test projector's name in consumer_offsets.
const testConsumer = "read-model-test"

func newTestProjector(t testing.TB, db logsink.DB) *testProjector {
	t.Helper()
	m := New()
	c := logsink.New(logsink.Config{Brokers: []string{"127.0.0.1:1"}, Topic: logrecord.DefaultTopic, Consumer: testConsumer, DB: db,
		Handle: m.Handle, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, "test_projection", "lag")
	return &testProjector{consumer: c, model: m}
}

func rec(t *testing.T, e *logrecord.Event, off int64) *kgo.Record {
	t.Helper()
	b, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return &kgo.Record{Topic: logrecord.DefaultTopic, Partition: 0, Offset: off, Value: b}
}

// TestNewerVersionStopsProjection: a record of a newer schema version fails
// the batch (the consumer stops there until it is upgraded), and nothing
// is applied.
func TestNewerVersionStopsProjection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db := pgtest.DB(t, pgtest.Options{})
	p := newTestProjector(t, db)
	recs := []*kgo.Record{
		rec(t, &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: "c1", Seq: 1, MessageID: "m1", Sender: "u1", Members: []string{"u1"}}, 0),
		{Topic: logrecord.DefaultTopic, Partition: 0, Offset: 1, Value: []byte(`{"v":99,"kind":"message","conversation_id":"c1","seq":2}`)},
	}
	if err := p.consumer.Write(ctx, recs); !errors.Is(err, logrecord.ErrUnsupportedVersion) {
		t.Fatalf("Write = %v, want ErrUnsupportedVersion", err)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM conversations`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d conversations (%v), want none", n, err)
	}
}

// TestApplyWritesReadModelAndDelivery: one batch opens and closes
// membership periods in log order, moves each conversation's last seq and
// activity time, writes one delivery row under the next id, announces it
// on pglisten.Delivery, and stores the offsets — all in its one transaction.
func TestApplyWritesReadModelAndDelivery(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db := pgtest.DB(t, pgtest.Options{})
	listener, err := db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	if _, err := listener.Exec(ctx, "LISTEN "+pglisten.Delivery); err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1, 0).UTC()
	recs := []*kgo.Record{
		rec(t, &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: "c1", Seq: 1, MessageID: "m1", Sender: "u1", Members: []string{"u1", "u2"}, CreatedAt: at}, 0),
		rec(t, &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: "c1", Seq: 2, MessageID: "m2", Sender: "u1", Body: "hi", CreatedAt: at.Add(time.Second)}, 1),
		rec(t, &logrecord.Event{Kind: logrecord.KindLeave, ConversationID: "c1", Seq: 3, MessageID: "m3", Sender: "u2", UserID: "u2", CreatedAt: at.Add(2 * time.Second)}, 2),
		rec(t, &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: "c0", Seq: 1, MessageID: "m4", Sender: "u3", CreatedAt: at}, 3),
	}
	p := newTestProjector(t, db)
	if err := p.consumer.Write(ctx, recs); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(ctx, `SELECT conversation_id || ':' || user_id || ':' || joined_seq || ':' || coalesce(left_seq::text, '-')
		FROM memberships ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	periods, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || fmt.Sprint(periods) != "[c0:u3:1:- c1:u1:1:- c1:u2:1:3]" {
		t.Errorf("memberships = %v, %v; want [c0:u3:1:- c1:u1:1:- c1:u2:1:3]", periods, err)
	}
	var last int64
	var lastAt time.Time
	if err := db.QueryRow(ctx, `SELECT last_seq, last_activity_at FROM conversations WHERE conversation_id = 'c1'`).Scan(&last, &lastAt); err != nil ||
		last != 3 || !lastAt.Equal(at.Add(2*time.Second)) {
		t.Errorf("c1 = %d, %v, %v; want 3 at %v", last, lastAt, err, at.Add(2*time.Second))
	}
	var id, counter int64
	var convs []string
	var from, to []int64
	if err := db.QueryRow(ctx, `SELECT o.id, o.conversation_ids, o.from_seqs, o.to_seqs, c.last_id FROM delivery_outbox o, delivery_counter c`).
		Scan(&id, &convs, &from, &to, &counter); err != nil {
		t.Fatalf("delivery row: %v", err)
	}
	if id != 1 || counter != 1 || fmt.Sprint(convs, from, to) != "[c0 c1] [1 1] [1 3]" {
		t.Errorf("delivery row %d (counter %d) = %v %v %v; want 1 (1) = [c0 c1] [1 1] [1 3]", id, counter, convs, from, to)
	}
	n, err := listener.Conn().WaitForNotification(ctx)
	if err != nil || n.Channel != pglisten.Delivery || n.Payload != "1" {
		t.Errorf("notification = %+v, %v; want %s 1", n, err, pglisten.Delivery)
	}
	offs, err := logsink.Offsets(ctx, db, testConsumer, logrecord.DefaultTopic)
	if err != nil || offs[0] != 4 {
		t.Errorf("stored offsets = %v, %v; want partition 0 at 4", offs, err)
	}

	// A second batch takes the next id.
	if err := p.consumer.Write(ctx, []*kgo.Record{rec(t, &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: "c0", Seq: 2, MessageID: "m5",
		Sender: "u3", Body: "x", CreatedAt: at}, 4)}); err != nil {
		t.Fatal(err)
	}
	if n, err := listener.Conn().WaitForNotification(ctx); err != nil || n.Payload != "2" {
		t.Errorf("second notification = %+v, %v; want 2", n, err)
	}
}

// TestBatchIsOneRoundTrip: a batch's read-model changes cost no round trip
// of their own: the batch (read model, delivery row, offsets, commit) is
// one. (persist's TestWriteIsOneRoundTrip counts its event rows and the
// read model together.)
func TestBatchIsOneRoundTrip(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base := pgtest.DB(t, pgtest.Options{})
	var writes atomic.Int64
	db := countingPool(t, base, &writes)
	p := newTestProjector(t, db)
	at := time.Unix(1, 0).UTC()
	if err := p.consumer.Write(ctx, []*kgo.Record{rec(t, &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: "c1", Seq: 1,
		MessageID: "m1", Sender: "u1", Members: []string{"u1"}, CreatedAt: at}, 0)}); err != nil {
		t.Fatal(err) // connects and prepares
	}
	writes.Store(0)
	if err := p.consumer.Write(ctx, []*kgo.Record{
		rec(t, &logrecord.Event{Kind: logrecord.KindJoin, ConversationID: "c1", Seq: 2, MessageID: "m2", Sender: "u1", UserID: "u2", CreatedAt: at}, 1),
		rec(t, &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: "c1", Seq: 3, MessageID: "m3", Sender: "u2", Body: "hi", CreatedAt: at}, 2),
	}); err != nil {
		t.Fatal(err)
	}
	if n := writes.Load(); n != 1 {
		t.Errorf("%d round trips for a batch, want 1", n)
	}
}

// TestReadMarkers: the read model keeps each user's highest marker; a
// batch's delivery row names only the markers it moved forward, and a
// batch of markers alone still gets one.
func TestReadMarkers(t *testing.T) {
	db := pgtest.DB(t, pgtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	at := time.Unix(1, 0).UTC()
	read := func(user string, seq, off int64) *kgo.Record {
		return rec(t, &logrecord.Event{Kind: logrecord.KindRead, ConversationID: "c1", Sender: user, UserID: user, ReadSeq: seq, CreatedAt: at}, off)
	}
	p := newTestProjector(t, db)
	if err := p.consumer.Write(ctx, []*kgo.Record{
		rec(t, &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: "c1", Seq: 1, MessageID: "m1", Sender: "u1", Members: []string{"u2"}, CreatedAt: at}, 0),
		rec(t, &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: "c1", Seq: 2, MessageID: "m2", Sender: "u1", Body: "a", CreatedAt: at}, 1),
		rec(t, &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: "c1", Seq: 3, MessageID: "m3", Sender: "u1", Body: "b", CreatedAt: at}, 2),
		read("u2", 3, 3), read("u2", 2, 4), read("u1", 1, 5),
	}); err != nil {
		t.Fatal(err)
	}
	if err := p.consumer.Write(ctx, []*kgo.Record{read("u2", 1, 6), read("u1", 3, 7)}); err != nil {
		t.Fatal(err)
	}
	markers := map[string]int64{}
	rows, _ := db.Query(ctx, `SELECT user_id, read_seq FROM read_markers WHERE conversation_id = 'c1'`)
	var u string
	var s int64
	if _, err := pgx.ForEachRow(rows, []any{&u, &s}, func() error { markers[u] = s; return nil }); err != nil {
		t.Fatal(err)
	}
	if markers["u1"] != 3 || markers["u2"] != 3 || len(markers) != 2 {
		t.Fatalf("markers = %v, want u1 3, u2 3", markers)
	}
	rows, _ = db.Query(ctx, `SELECT read_user_ids, read_seqs FROM delivery_outbox ORDER BY id`)
	var got []string
	var users []string
	var seqs []int64
	if _, err := pgx.ForEachRow(rows, []any{&users, &seqs}, func() error { got = append(got, fmt.Sprint(users, seqs)); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := []string{"[u1 u2] [1 3]", "[u1] [3]"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("delivery rows' markers = %v, want %v", got, want)
	}
}
