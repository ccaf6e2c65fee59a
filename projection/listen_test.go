package projection

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/logsink"
	"github.com/chatpipe/chatpipe/internal/pglisten"
	"github.com/chatpipe/chatpipe/internal/pgtest"
	"github.com/chatpipe/chatpipe/logrecord"
)

// TestPersistCommitWakesTheWait: a NOTIFY on persist's channel (what
// persist sends with each batch) reaches the projector's wait, so it need
// not poll for persist.
func TestPersistCommitWakesTheWait(t *testing.T) {
	db, p, ctx := listeningProjector(t)
	wait := func(what string) {
		t.Helper()
		select {
		case <-p.persisted.Woken():
		case <-time.After(30 * time.Second):
			t.Fatalf("no wake-up %s", what)
		}
	}
	wait("once listening") // the catch-up signal after LISTEN
	if _, err := db.Exec(ctx, `SELECT pg_notify($1, '')`, pglisten.Persisted); err != nil {
		t.Fatal(err)
	}
	wait("after persist's notification")

	// An announcement names the offsets persist stored: a batch they
	// cover is applied without reading consumer_offsets (which holds
	// nothing here, so a read would make the wait go on).
	payload := logsink.AnnouncePayload(logrecord.DefaultTopic, []*kgo.Record{{Partition: 3, Offset: 41}, {Partition: 5, Offset: 7}})
	if _, err := db.Exec(ctx, `SELECT pg_notify($1, $2)`, pglisten.Persisted, payload); err != nil {
		t.Fatal(err)
	}
	wait("after an announcement with offsets")
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := p.waitForPersist(wctx, map[int32]int64{3: 42, 5: 8}); err != nil {
		t.Fatalf("wait for offsets persist announced: %v", err)
	}
	if n := p.offsetReads.Load(); n != 0 {
		t.Errorf("the wait read consumer_offsets %d times; the announcement covered it", n)
	}
	short, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer scancel()
	if err := p.waitForPersist(short, map[int32]int64{3: 43}); err == nil {
		t.Error("the wait returned for an offset persist never stored")
	}
	if p.offsetReads.Load() == 0 {
		t.Error("past what was announced, the wait did not read consumer_offsets")
	}
}

// TestListeningWaitReadsOffsetsOnce: while the projector listens, each
// batch's wait is answered by persist's announcement: consumer_offsets is
// read once after the LISTEN, not once per batch.
func TestListeningWaitReadsOffsetsOnce(t *testing.T) {
	db, p, ctx := listeningProjector(t)
	for !p.persisted.Listening() {
		time.Sleep(10 * time.Millisecond)
	}
	const batches = 10
	for i := range batches {
		off := int64(100 + i)
		errc := make(chan error, 1)
		go func() {
			wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
			defer wcancel()
			errc <- p.waitForPersist(wctx, map[int32]int64{2: off + 1})
		}()
		payload := logsink.AnnouncePayload(logrecord.DefaultTopic, []*kgo.Record{{Partition: 2, Offset: off}})
		if _, err := db.Exec(ctx, `SELECT pg_notify($1, $2)`, pglisten.Persisted, payload); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("batch %d: wait for the offset persist announced: %v", i, err)
		}
	}
	if n := p.offsetReads.Load(); n > 1 {
		t.Errorf("%d waits, each announced, read consumer_offsets %d times; want at most once (after the LISTEN)", batches, n)
	}
}

// listeningProjector is a test projector on a fresh database whose
// LISTEN runs until the test ends, and the test's context.
func listeningProjector(t *testing.T) (*pgxpool.Pool, *Projector, context.Context) {
	t.Helper()
	db := pgtest.DB(t, pgtest.Options{})
	p := newTestProjector(t, db)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.listen(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return db, p, ctx
}
