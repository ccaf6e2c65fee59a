package persist

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/logsink"
	"github.com/chatpipe/chatpipe/internal/pglisten"
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
	// ... and recorded once: the conflict is the record's, not the replay's.
	var rows int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM seq_conflicts`).Scan(&rows); err != nil || rows != 1 {
		t.Errorf("seq_conflicts after replay: %d rows, %v; want 1", rows, err)
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

// TestPoisonRecordsAreDeadLettered: a message whose body Postgres refuses
// (a NUL byte) and a record that is not JSON go to persist's dead letters;
// the records around them are written and the offset moves past all.
func TestPoisonRecordsAreDeadLettered(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	p := newTestPersister(t, db)
	bad := message("c1", 2, "m-2", "k-2")
	bad.Body = "nul\x00here"
	garbage := &kgo.Record{Topic: logrecord.DefaultTopic, Partition: 0, Offset: 3, Value: []byte("not json")}
	recs := []*kgo.Record{
		record(t, message("c1", 1, "m-1", "k-1"), 0),
		record(t, bad, 1),
		record(t, message("c1", 3, "m-3", "k-3"), 2),
		garbage,
		record(t, message("c2", 1, "m-4", "k-4"), 4),
	}
	if err := p.Settle(ctx, recs); err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	rows, _ := db.Query(ctx, `SELECT seq FROM events ORDER BY conversation_id, seq`)
	var seq int64
	if _, err := pgx.ForEachRow(rows, []any{&seq}, func() error { seqs = append(seqs, seq); return nil }); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(seqs) != "[1 3 1]" {
		t.Errorf("stored seqs = %v, want c1: 1 3, c2: 1", seqs)
	}
	type dl struct {
		off   int64
		conv  *string
		seq   *int64
		state *string
	}
	var got []dl
	rows, _ = db.Query(ctx, `SELECT log_offset, conversation_id, seq, sqlstate FROM dead_letters WHERE consumer = 'persist' ORDER BY log_offset`)
	var d dl
	if _, err := pgx.ForEachRow(rows, []any{&d.off, &d.conv, &d.seq, &d.state}, func() error { got = append(got, d); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].off != 1 || got[0].conv == nil || *got[0].conv != "c1" || *got[0].seq != 2 ||
		got[0].state == nil || *got[0].state != "22021" || got[1].off != 3 || got[1].conv != nil || got[1].state != nil {
		t.Errorf("dead letters = %+v", got)
	}
	offs, err := logsink.Offsets(ctx, db, "persist", logrecord.DefaultTopic)
	if err != nil || offs[0] != 5 {
		t.Errorf("persist offsets = %v, %v; want partition 0 at 5", offs, err)
	}
	if n := p.consumer.DeadLettered(); n != 2 {
		t.Errorf("dead-lettered = %d, want 2", n)
	}
}

// TestNewerVersionStopsPersist: a record of a newer schema version is not
// skipped (nor dead-lettered): the batch fails with ErrUnsupportedVersion
// and nothing of it is written.
func TestNewerVersionStopsPersist(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	p := newTestPersister(t, db)
	recs := []*kgo.Record{
		record(t, message("c1", 1, "m-1", "k-1"), 0),
		{Topic: logrecord.DefaultTopic, Partition: 0, Offset: 1, Value: []byte(`{"v":99,"kind":"message","conversation_id":"c1","seq":2}`)},
	}
	if err := p.Settle(ctx, recs); !errors.Is(err, logrecord.ErrUnsupportedVersion) {
		t.Fatalf("Settle = %v, want ErrUnsupportedVersion", err)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM dead_letters) + (SELECT count(*) FROM consumer_offsets)`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d rows written (%v), want none", n, err)
	}
}

// TestFailedOffsetsRollBackRows: the rows and the offsets are one
// transaction: when storing the offsets fails (here Postgres refuses the
// consumer's name), no row of the batch is written either.
func TestFailedOffsetsRollBackRows(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	p, err := New(Config{Brokers: []string{"127.0.0.1:1"}, DB: db, Consumer: "bad\x00name", Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	recs := []*kgo.Record{
		record(t, message("c1", 1, "m-a", "k-a"), 0),
		record(t, message("c1", 1, "m-b", "k-b"), 1), // a conflict: a seq_conflicts row, rolled back too
	}
	var pe *pgconn.PgError
	if err := p.Write(ctx, recs); !errors.As(err, &pe) || pe.Code != "22021" {
		t.Fatalf("Write = %v, want Postgres refusing the consumer name (22021) when storing the offsets", err)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM seq_conflicts) + (SELECT count(*) FROM consumer_offsets)`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d rows written (%v), want none", n, err)
	}
	if got := p.Stats().Batches.Load(); got != 0 {
		t.Errorf("batches = %d, want 0", got)
	}
}

// TestWriteNotifies: a committed batch is announced on pglisten.Persisted
// (shard writers learn persist's offsets by it); a rebuild's first pass,
// which stores its offsets under another name, announces nothing, since a
// writer would take them for persist's.
func TestWriteNotifies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := pgtest.DB(t, pgtest.Options{})
	conn, err := db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+pglisten.Persisted); err != nil {
		t.Fatal(err)
	}
	first := Config{Brokers: []string{"127.0.0.1:1"}, DB: db, Consumer: rebuildConsumer, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if err := first.validate(); err != nil {
		t.Fatal(err)
	}
	if err := newPersister(first, db, 0, writeEvents).Write(ctx, []*kgo.Record{record(t, message("c1", 1, "m-a", "k-a"), 0)}); err != nil {
		t.Fatal(err)
	}
	p := newTestPersister(t, db)
	if err := p.Write(ctx, []*kgo.Record{record(t, message("c1", 2, "m-b", "k-b"), 1)}); err != nil {
		t.Fatal(err)
	}
	n, err := conn.Conn().WaitForNotification(ctx)
	if err != nil {
		t.Fatalf("no notification after a write: %v", err)
	}
	if n.Channel != pglisten.Persisted {
		t.Fatalf("notification on %q, want %q", n.Channel, pglisten.Persisted)
	}
	// The first notification is persist's (offset 1 stored, next 2), not
	// the rebuild pass's (next 1).
	if want := logsink.AnnouncePayload(logrecord.DefaultTopic, []*kgo.Record{{Partition: 0, Offset: 1}}); n.Payload != want {
		t.Errorf("first notification %q, want persist's %q", n.Payload, want)
	}
}

// TestWriteStoresEventColumns: a stored row holds its event's fields and
// its log position; empty client_message_id, body and user_id are NULL, as
// are the members of an event that lists none.
func TestWriteStoresEventColumns(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	p := newTestPersister(t, db)
	at := time.Unix(1_700_000_000, 0).UTC()
	create := &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: "c1", Seq: 1, MessageID: "m1", Sender: "u1",
		Members: []string{"u1", "u2"}, CreatedAt: at, VShard: 3, Epoch: 2}
	msg := &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: "c1", Seq: 2, MessageID: "m2", ClientMessageID: "k2",
		Sender: "u2", Body: "hi", CreatedAt: at.Add(time.Second), VShard: 3, Epoch: 2}
	recs := []*kgo.Record{record(t, create, 4), record(t, msg, 5)}
	if err := p.Write(ctx, recs); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(ctx, `SELECT conversation_id, seq, kind, message_id, client_message_id, sender, body, user_id, members,
		created_at, vshard, epoch, log_partition, log_offset FROM events ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Conv, Kind, MID, Sender string
		CMID, Body, User        *string
		Members                 []string
		Seq, Epoch, Offset      int64
		At                      time.Time
		VShard, Part            int32
	}
	var got []string
	var r row
	if _, err := pgx.ForEachRow(rows, []any{&r.Conv, &r.Seq, &r.Kind, &r.MID, &r.CMID, &r.Sender, &r.Body, &r.User, &r.Members,
		&r.At, &r.VShard, &r.Epoch, &r.Part, &r.Offset}, func() error {
		str := func(s *string) string {
			if s == nil {
				return "NULL"
			}
			return *s
		}
		got = append(got, fmt.Sprintf("%s/%d %s %s cmid=%s sender=%s body=%s user=%s members=%v at=%d vshard=%d epoch=%d at %d/%d",
			r.Conv, r.Seq, r.Kind, r.MID, str(r.CMID), r.Sender, str(r.Body), str(r.User), r.Members, r.At.Unix(), r.VShard, r.Epoch, r.Part, r.Offset))
		r.Members = nil
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"c1/1 create m1 cmid=NULL sender=u1 body=NULL user=NULL members=[u1 u2] at=1700000000 vshard=3 epoch=2 at 0/4",
		"c1/2 message m2 cmid=k2 sender=u2 body=hi user=NULL members=[] at=1700000001 vshard=3 epoch=2 at 0/5",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("events =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var membersNull bool
	if err := db.QueryRow(ctx, `SELECT members IS NULL FROM events WHERE seq = 2`).Scan(&membersNull); err != nil || !membersNull {
		t.Errorf("members of a message IS NULL = %v, %v; want true", membersNull, err)
	}
	if ins, b := p.Stats().Inserted.Load(), p.Stats().Batches.Load(); ins != 2 || b != 1 {
		t.Errorf("inserted, batches = %d, %d; want 2, 1", ins, b)
	}
}

// TestTakeoverOnlyBatchMovesOffsets: a batch of takeover markers writes no
// event but still moves the stored offset past them, and is announced.
func TestTakeoverOnlyBatchMovesOffsets(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := pgtest.DB(t, pgtest.Options{})
	conn, err := db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+pglisten.Persisted); err != nil {
		t.Fatal(err)
	}
	p := newTestPersister(t, db)
	takeover := &logrecord.Event{Kind: logrecord.KindTakeover, VShard: 1, Epoch: 4, Worker: "w1", CreatedAt: time.Unix(1, 0).UTC()}
	if err := p.Write(ctx, []*kgo.Record{record(t, takeover, 7), record(t, takeover, 8)}); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d events (%v), want none", n, err)
	}
	offs, err := logsink.Offsets(ctx, db, "persist", logrecord.DefaultTopic)
	if err != nil || offs[0] != 9 {
		t.Errorf("persist offsets = %v, %v; want partition 0 at 9", offs, err)
	}
	if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
		t.Errorf("no notification: %v", err)
	}
	if b, ins := p.Stats().Batches.Load(), p.Stats().Inserted.Load(); b != 1 || ins != 0 {
		t.Errorf("batches, inserted = %d, %d; want 1, 0", b, ins)
	}
}

// TestWriteIsOneRoundTrip: a batch (rows, read model with membership
// changes, offsets, announcement, commit) is sent to Postgres in one round
// trip, once its statements are prepared.
func TestWriteIsOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	var writes atomic.Int64
	db := countingPool(t, pgtest.DB(t, pgtest.Options{}), &writes)
	p := newTestPersister(t, db)
	at := time.Unix(1, 0).UTC()
	create := func(conv string, seq int64) *logrecord.Event {
		return &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: conv, Seq: seq, MessageID: conv + "-create", Sender: "u1", Members: []string{"u2"}, CreatedAt: at}
	}
	kick := func(conv string, seq int64) *logrecord.Event {
		return &logrecord.Event{Kind: logrecord.KindKick, ConversationID: conv, Seq: seq, MessageID: conv + "-kick", Sender: "u1", UserID: "u2", CreatedAt: at}
	}
	if err := p.Write(ctx, []*kgo.Record{record(t, create("c0", 1), 0), record(t, message("c0", 2, "m1", "k1"), 1), record(t, kick("c0", 3), 2)}); err != nil {
		t.Fatal(err) // connects and prepares
	}
	writes.Store(0)
	if err := p.Write(ctx, []*kgo.Record{record(t, create("c1", 1), 3), record(t, message("c1", 2, "m2", "k2"), 4), record(t, kick("c1", 3), 5)}); err != nil {
		t.Fatal(err)
	}
	if n := writes.Load(); n != 1 {
		t.Errorf("%d round trips for a batch, want 1", n)
	}
}

// TestWriteStoresMoves: a moved record (schema v2) is a row of its
// conversation with its seq and to_vshard; other rows have no to_vshard.
// The verdicts a moved record carries (v4) are stored as its JSON array.
func TestWriteStoresMoves(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	p := newTestPersister(t, db)
	at := time.Unix(1_700_000_000, 0).UTC()
	to := 0
	msg := &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: "c1", Seq: 1, MessageID: "m1", ClientMessageID: "k1",
		Sender: "u2", Body: "hi", CreatedAt: at, VShard: 9, Epoch: 2}
	moved := &logrecord.Event{Kind: logrecord.KindMoved, ConversationID: "c1", Seq: 2, MessageID: "m2", ToVShard: &to, CreatedAt: at, VShard: 9, Epoch: 2,
		Verdicts: []logrecord.Verdict{{ClientMessageID: "k9", Sender: "u3", Op: "send", Code: "forbidden", Message: "u3 is not a member of c1", At: at}}}
	if err := p.Write(ctx, []*kgo.Record{record(t, msg, 4), record(t, moved, 5)}); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(ctx, `SELECT kind, coalesce(to_vshard, -1) FROM events ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var kind string
		var to int32
		err := r.Scan(&kind, &to)
		return fmt.Sprintf("%s→%d", kind, to), err
	})
	if err != nil || fmt.Sprint(got) != "[message→-1 moved→0]" {
		t.Errorf("rows %v, %v; want [message→-1 moved→0]", got, err)
	}
	var stored []logrecord.Verdict
	var none bool
	if err := db.QueryRow(ctx, `SELECT (SELECT verdicts FROM events WHERE seq = 2), (SELECT verdicts IS NULL FROM events WHERE seq = 1)`).Scan(&stored, &none); err != nil {
		t.Fatal(err)
	}
	if len(stored) != 1 || stored[0] != moved.Verdicts[0] || !none {
		t.Errorf("verdicts stored %+v (the message's NULL: %v), want %+v and NULL", stored, none, moved.Verdicts)
	}
}

// TestOverlappingMembersRecordNoConflict: two members of the group write
// the same records of a partition at once (one was dropped from the group
// for a slow batch and still writes it). The second waits for the first's
// commit and finds its rows stored: a replay, not a seq conflict. That
// holds for a partition whose offsets are stored and for the first batch
// of a partition, which has no consumer_offsets row to lock yet.
func TestOverlappingMembersRecordNoConflict(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stored bool // the partition's offsets row exists, as after its first batch
	}{{"offsets stored", true}, {"first batch of the partition", false}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			db := pgtest.DB(t, pgtest.Options{})
			if tc.stored {
				if err := newTestPersister(t, db).Write(ctx, []*kgo.Record{record(t, message("c0", 1, "m-0", "k-0"), 0)}); err != nil {
					t.Fatal(err)
				}
			}
			held := pgtest.NewHeld(ctx, t, db)
			// Whatever happens, both batches end and give their connections
			// back before the pool closes.
			var writers sync.WaitGroup
			defer func() {
				held.Release()
				writers.Wait()
			}()
			cfg := Config{Brokers: []string{"127.0.0.1:1"}, DB: db, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			if err := cfg.validate(); err != nil {
				t.Fatal(err)
			}
			slow, other := newPersister(cfg, held, 0, writeAll), newTestPersister(t, db)
			recs := []*kgo.Record{
				record(t, message("c1", 1, "m-a", "k-a"), 1),
				record(t, message("c1", 2, "m-b", "k-b"), 2),
			}
			slowDone, otherDone := make(chan error, 1), make(chan error, 1)
			writers.Add(1)
			go func() { defer writers.Done(); slowDone <- slow.Write(ctx, recs) }()
			select {
			case <-held.Ran(): // slow's rows are written, uncommitted
			case err := <-slowDone:
				t.Fatalf("the slow member's batch ended before its statements ran: %v", err)
			case <-ctx.Done():
				t.Fatal("timed out waiting for the slow member's batch to run its statements")
			}
			writers.Add(1)
			go func() { defer writers.Done(); otherDone <- other.Write(ctx, recs) }()
			// Let slow commit once the other member waits for a lock (on
			// slow's offsets rows or, failing that, on its rows' keys).
			otherFinished, otherErr := pgtest.WaitForLockWait(ctx, t, db, otherDone, "the second member's batch")
			held.Release()
			if err := <-slowDone; err != nil {
				t.Fatalf("slow member: %v", err)
			}
			if !otherFinished {
				otherErr = <-otherDone
			}
			if otherErr != nil {
				t.Fatalf("second member: %v", otherErr)
			}
			if got := slow.Stats().Inserted.Load() + other.Stats().Inserted.Load(); got != 2 {
				t.Errorf("inserted %d rows in all, want 2", got)
			}
			if c := slow.Stats().Conflicts.Load() + other.Stats().Conflicts.Load(); c != 0 {
				t.Errorf("%d seq conflicts recorded for one batch written twice", c)
			}
			if s := other.Stats().Skipped.Load(); s != 2 {
				t.Errorf("the second writer skipped %d rows as replays, want 2", s)
			}
			offs, err := logsink.Offsets(ctx, db, logsink.PersistConsumer, logrecord.DefaultTopic)
			if err != nil || offs[0] != 3 {
				t.Errorf("persist offsets = %v, %v; want partition 0 at 3", offs, err)
			}
		})
	}
}

// TestWriteAppliesTheReadModel: a batch's events and its read-model changes
// (membership periods, the conversation's last seq, the delivery row) are
// written in the one transaction that stores the offsets.
func TestWriteAppliesTheReadModel(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	p := newTestPersister(t, db)
	at := time.Unix(1, 0).UTC()
	create := &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: "c1", Seq: 1, MessageID: "m1", Sender: "u1", Members: []string{"u2"}, CreatedAt: at}
	leave := &logrecord.Event{Kind: logrecord.KindLeave, ConversationID: "c1", Seq: 3, MessageID: "m3", Sender: "u2", UserID: "u2", CreatedAt: at}
	if err := p.Write(ctx, []*kgo.Record{record(t, create, 0), record(t, message("c1", 2, "m2", "k2"), 1), record(t, leave, 2)}); err != nil {
		t.Fatal(err)
	}
	got := summary(t, db, eventSeqs, memberPeriods, lastSeq,
		`SELECT string_agg(array_to_string(from_seqs, ',') || '-' || array_to_string(to_seqs, ','), ' ') FROM delivery_outbox`)
	if want := "1 2 3 | u1:1-open u2:1-3 | 3 | 1-3"; got != want {
		t.Errorf("events | memberships | last seq | delivery = %q, want %q", got, want)
	}
	if offs, err := logsink.Offsets(ctx, db, logsink.PersistConsumer, logrecord.DefaultTopic); err != nil || offs[0] != 3 {
		t.Errorf("persist offsets = %v, %v; want partition 0 at 3", offs, err)
	}
}

// TestKickPersistCannotStoreStillEndsTheMembership: a kick whose event row
// Postgres refuses (a NUL byte in its message id) is dead-lettered, and its
// read-model changes are written with the dead letter: the kicked user is no
// longer a member, and the conversation's last seq and delivery row move past
// it. The records around it are written as usual.
func TestKickPersistCannotStoreStillEndsTheMembership(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	p := newTestPersister(t, db)
	at := time.Unix(1, 0).UTC()
	create := &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: "c1", Seq: 1, MessageID: "m1", Sender: "u1", Members: []string{"u2"}, CreatedAt: at}
	kick := &logrecord.Event{Kind: logrecord.KindKick, ConversationID: "c1", Seq: 2, MessageID: "m\x002", Sender: "u1", UserID: "u2", CreatedAt: at}
	if err := p.Settle(ctx, []*kgo.Record{record(t, create, 0), record(t, kick, 1), record(t, message("c1", 3, "m3", "k3"), 2)}); err != nil {
		t.Fatal(err)
	}
	got := summary(t, db, eventSeqs, memberPeriods, lastSeq, `SELECT string_agg(log_offset::text || ' ' || consumer, ',') FROM dead_letters`)
	if want := "1 3 | u1:1-open u2:1-2 | 3 | 1 persist"; got != want {
		t.Errorf("events | memberships | last seq | dead letters = %q, want %q", got, want)
	}
	var covered bool
	if err := db.QueryRow(ctx, `SELECT bool_and(EXISTS (SELECT 1 FROM delivery_outbox o, unnest(o.from_seqs, o.to_seqs) AS r(f, t) WHERE s BETWEEN f AND t))
		FROM generate_series(1, 3) AS s`).Scan(&covered); err != nil || !covered {
		t.Errorf("delivery rows cover seqs 1–3: %v, %v", covered, err)
	}
	offs, err := logsink.Offsets(ctx, db, "persist", logrecord.DefaultTopic)
	if err != nil || offs[0] != 3 {
		t.Errorf("persist offsets = %v, %v; want partition 0 at 3", offs, err)
	}
}

// Queries of one text value each, for summary.
const (
	eventSeqs     = `SELECT string_agg(seq::text, ' ' ORDER BY seq) FROM events`
	memberPeriods = `SELECT string_agg(user_id || ':' || joined_seq || '-' || coalesce(left_seq::text, 'open'), ' ' ORDER BY user_id) FROM memberships`
	lastSeq       = `SELECT last_seq::text FROM conversations WHERE conversation_id = 'c1'`
)

// summary is the values of queries, each one text value ("-" for none),
// joined by " | ".
func summary(t *testing.T, db *pgxpool.Pool, queries ...string) string {
	t.Helper()
	var got string
	if err := db.QueryRow(context.Background(), "SELECT concat_ws(' | ', coalesce(("+strings.Join(queries, "), '-'), coalesce((")+"), '-'))").Scan(&got); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestYoungTablesAreAnalyzed: once the events stored pass a count of
// analyzeAt, the consumer's next tick hands it to the analyzer, once per
// count (below the first, nothing), and the analyzer ANALYZEs the tables
// from a small sample.
func TestYoungTablesAreAnalyzed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := pgtest.DB(t, pgtest.Options{})
	p := newTestPersister(t, db)
	p.analyzeAt = []int64{2, 4}
	// analyze_count counts ANALYZE statements only (autovacuum's are
	// autoanalyze_count).
	analyzes := func() (n int64) {
		t.Helper()
		if err := db.QueryRow(ctx, `SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'events'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var seq int64
	step := func(events int, want int64) {
		t.Helper()
		var recs []*kgo.Record
		for range events {
			seq++
			recs = append(recs, record(t, message("c1", seq, fmt.Sprint("m", seq), fmt.Sprint("k", seq)), seq-1))
		}
		if len(recs) > 0 {
			if err := p.Write(ctx, recs); err != nil {
				t.Fatal(err)
			}
		}
		p.tick(ctx)
		select {
		case stored := <-p.toAnalyze:
			p.analyze(ctx, stored)
		default:
		}
		if got := analyzes(); got != want {
			t.Fatalf("after %d events stored: events analyzed %d times, want %d", p.stats.Inserted.Load(), got, want)
		}
	}
	step(1, 0)
	step(1, 1)
	step(0, 1) // no new count passed
	step(1, 1)
	step(200, 2) // past the last count
	step(1, 2)   // no count left: autovacuum's
	// The sample was small: at most 11 histogram bounds (target 10) for
	// 204 distinct seqs.
	var bounds int
	if err := db.QueryRow(ctx, `SELECT coalesce(array_length(histogram_bounds::text::text[], 1), 0) FROM pg_stats
		WHERE tablename = 'events' AND attname = 'seq'`).Scan(&bounds); err != nil {
		t.Fatal(err)
	}
	if bounds == 0 || bounds > 11 {
		t.Fatalf("events.seq has %d histogram bounds, want 1-11 (statistics target 10)", bounds)
	}
}
