package shardworker

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/logsink"
	"github.com/chatpipe/chatpipe/internal/pglisten"
	"github.com/chatpipe/chatpipe/internal/pgtest"
	"github.com/chatpipe/chatpipe/logrecord"
)

// TestPersistOffsetFromAnnouncements: a worker whose LISTEN on persist's
// channel is in effect reads persist's stored offsets from Postgres once
// (after the LISTEN) and then takes them from persist's announcements; a
// worker without LISTEN reads them every time.
func TestPersistOffsetFromAnnouncements(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	if _, err := db.Exec(ctx, `INSERT INTO consumer_offsets (consumer, topic, log_partition, next_offset) VALUES ('persist', $1, 3, 10)`, logrecord.DefaultTopic); err != nil {
		t.Fatal(err)
	}
	for _, listen := range []bool{true, false} {
		w := &Worker{cfg: Config{DB: db, Topic: logrecord.DefaultTopic}, persisted: logsink.NewAnnounced(logrecord.DefaultTopic)}
		if listen {
			lctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() {
				defer close(done)
				w.persisted.Listen(lctx, db, pglisten.Persisted, slog.New(slog.NewTextHandler(io.Discard, nil)), "lost")
			}()
			t.Cleanup(func() { cancel(); <-done })
			for deadline := time.Now().Add(30 * time.Second); !w.persisted.Listening(); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the LISTEN took no effect")
				}
			}
			<-w.persisted.Woken() // the wake-up after the LISTEN
		}
		get := func(part int32, want int64, wantOK bool) {
			t.Helper()
			off, ok, err := w.persistOffset(ctx, part)
			if err != nil || off != want || ok != wantOK {
				t.Fatalf("listen=%v: persist's offset of partition %d: %d %v %v, want %d %v", listen, part, off, ok, err, want, wantOK)
			}
		}
		get(3, 10, true)
		get(4, 0, false)
		// persist stores partition 3 up to 20 and announces it.
		if _, err := db.Exec(ctx, `UPDATE consumer_offsets SET next_offset = 20 WHERE log_partition = 3`); err != nil {
			t.Fatal(err)
		}
		payload := logsink.AnnouncePayload(logrecord.DefaultTopic, []*kgo.Record{{Partition: 3, Offset: 19}})
		if _, err := db.Exec(ctx, `SELECT pg_notify($1, $2)`, pglisten.Persisted, payload); err != nil {
			t.Fatal(err)
		}
		if listen {
			<-w.persisted.Woken()
		}
		get(3, 20, true)
		reads := w.stats.PersistOffsetReads.Load()
		if listen && reads != 1 {
			t.Errorf("listening, the worker read persist's offsets %d times, want once (after the LISTEN)", reads)
		}
		if !listen && reads != 3 {
			t.Errorf("without LISTEN, the worker read persist's offsets %d times, want 3 (every time)", reads)
		}
		if _, err := db.Exec(ctx, `UPDATE consumer_offsets SET next_offset = 10 WHERE log_partition = 3`); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPersistOffsetRightAfterListen: the writers of a worker that took
// its vshards over ask for persist's offsets at once, while the first
// read after the LISTEN is still in flight. Each must get the stored
// offset, not "none stored" (which would make a replay start at the
// beginning of the partition).
func TestPersistOffsetRightAfterListen(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	if _, err := db.Exec(ctx, `INSERT INTO consumer_offsets (consumer, topic, log_partition, next_offset) VALUES ('persist', $1, 3, 10)`, logrecord.DefaultTopic); err != nil {
		t.Fatal(err)
	}
	for round := range 20 {
		w := &Worker{cfg: Config{DB: db, Topic: logrecord.DefaultTopic}, persisted: logsink.NewAnnounced(logrecord.DefaultTopic)}
		lctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			w.persisted.Listen(lctx, db, pglisten.Persisted, slog.New(slog.NewTextHandler(io.Discard, nil)), "lost")
		}()
		<-w.persisted.Woken() // the LISTEN took effect: its first read is due
		type got struct {
			off int64
			ok  bool
			err error
		}
		res := make(chan got, 16)
		for range cap(res) {
			go func() {
				off, ok, err := w.persistOffset(ctx, 3)
				res <- got{off, ok, err}
			}()
		}
		for range cap(res) {
			if g := <-res; g.err != nil || !g.ok || g.off != 10 {
				t.Errorf("round %d: a writer asking at once got %d %v %v, want 10 true", round, g.off, g.ok, g.err)
			}
		}
		cancel()
		<-done
		if t.Failed() {
			return
		}
	}
}
