package persist

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/kafkatest"
	"github.com/chatpipe/chatpipe/internal/pgtest"
	"github.com/chatpipe/chatpipe/logrecord"
)

// TestRebuildGoesOnFromAStoppedFirstPass: a rebuild stopped in its first
// pass leaves events under the name "rebuild" and no offsets of persist's.
// Run again into that database, it goes on and ends where a rebuild into
// an empty one does, with none of the first pass's rows left behind; a
// database persist has written is still refused.
func TestRebuildGoesOnFromAStoppedFirstPass(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	at := time.Unix(1, 0).UTC()
	evs := []*logrecord.Event{
		{Kind: logrecord.KindCreate, ConversationID: "c1", Seq: 1, MessageID: "m1", Sender: "u1", Members: []string{"u2", "u3"}, CreatedAt: at},
		message("c1", 2, "m2", "k2"),
		// Postgres refuses this kick's event row (a NUL byte): a dead letter.
		{Kind: logrecord.KindKick, ConversationID: "c1", Seq: 3, MessageID: "m\x003", Sender: "u1", UserID: "u2", CreatedAt: at},
		message("c1", 4, "m4", "k4"),
		{Kind: logrecord.KindLeave, ConversationID: "c1", Seq: 5, MessageID: "m5", Sender: "u3", UserID: "u3", CreatedAt: at},
	}
	brokers, topic, recs := rebuildLog(ctx, t, evs)

	rebuild := func(db *pgxpool.Pool) error {
		_, err := Rebuild(ctx, Config{Brokers: brokers, Topic: topic, DB: db, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, 500*time.Millisecond)
		return err
	}
	read := func(db *pgxpool.Pool) string {
		return summary(t, db, eventSeqs, memberPeriods,
			`SELECT string_agg(consumer || ' ' || log_partition || ' ' || next_offset, ',' ORDER BY consumer) FROM consumer_offsets`,
			`SELECT string_agg(consumer || ' ' || log_offset, ',' ORDER BY consumer) FROM dead_letters`,
			`SELECT count(*)::text FROM seq_conflicts`)
	}

	empty := pgtest.DB(t, pgtest.Options{})
	if err := rebuild(empty); err != nil {
		t.Fatal(err)
	}
	want := read(empty)
	if want != "1 2 4 5 | u1:1-open u2:1-3 u3:1-5 | persist 0 5 | persist 2 | 0" {
		t.Fatalf("rebuilt into an empty database: %q", want)
	}

	// The first pass stored the first three records (the kick dead-lettered)
	// and stopped.
	stopped := pgtest.DB(t, pgtest.Options{})
	cfg := Config{Brokers: brokers, Topic: topic, DB: stopped, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	first := cfg
	first.Consumer = rebuildConsumer
	if err := newPersister(first, stopped, 0, writeEvents).Settle(ctx, recs[:3]); err != nil {
		t.Fatal(err)
	}
	if got := read(stopped); got != "1 2 | - | rebuild 0 3 | rebuild 2 | 0" {
		t.Fatalf("after the stopped first pass: %q", got)
	}
	if err := rebuild(stopped); err != nil {
		t.Fatalf("rebuild again after a stopped first pass: %v", err)
	}
	if got := read(stopped); got != want {
		t.Errorf("rebuilt after a stopped first pass: %q, want %q", got, want)
	}

	// persist has written this one: not a rebuild's to go on with.
	if err := rebuild(stopped); err == nil || !strings.Contains(err.Error(), "holds 4 events already") {
		t.Errorf("rebuild into a database persist wrote: %v, want a refusal", err)
	}
}

// rebuildLog starts a broker with a one-partition topic for the test (its
// cleanup stops them) and produces evs to it, in order; recs are the records
// as produced, offsets set.
func rebuildLog(ctx context.Context, t *testing.T, evs []*logrecord.Event) (brokers []string, topic string, recs []*kgo.Record) {
	t.Helper()
	brokers, topic = []string{kafkatest.Broker(t).Addr()}, "rebuild-test"
	prod := kafkatest.Topic(ctx, t, brokers, topic)
	for _, e := range evs {
		r := record(t, e, 0)
		r.Topic = topic
		if err := prod.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r) // (ProduceSync set its offset)
	}
	return brokers, topic, recs
}

// TestRebuildSecondPassFallingShortFails: a second pass that reads
// nothing for idle before reaching where the first pass ended is an
// error, not a rebuild reported done with part of the read model.
func TestRebuildSecondPassFallingShortFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	brokers, topic, _ := rebuildLog(ctx, t, []*logrecord.Event{message("c1", 1, "m1", "k1"), message("c1", 2, "m2", "k2")})
	db := pgtest.DB(t, pgtest.Options{})
	cfg := Config{Brokers: brokers, Topic: topic, DB: db, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	// The first pass ended at offset 5 (as if the log's tail were not served now).
	n, _, err := rebuildPass(ctx, cfg, newPersister(cfg, db, 0, writeReadModel), 500*time.Millisecond, map[int32]int64{0: 5})
	if err == nil || !strings.Contains(err.Error(), "before reaching where the first ended") {
		t.Fatalf("second pass read %d records and ended with %v; want an error for falling short", n, err)
	}
}
