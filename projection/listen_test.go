package projection

import (
	"context"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/pglisten"
	"github.com/chatpipe/chatpipe/internal/pgtest"
)

// TestPersistCommitWakesTheWait: a NOTIFY on persist's channel (what
// persist sends with each batch) reaches the projector's wait, so it need
// not poll for persist.
func TestPersistCommitWakesTheWait(t *testing.T) {
	db := pgtest.DB(t, pgtest.Options{})
	p := newTestProjector(t, db)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.listen(ctx) }()
	defer func() { cancel(); <-done }()
	wait := func(what string) {
		t.Helper()
		select {
		case <-p.persisted:
		case <-time.After(30 * time.Second):
			t.Fatalf("no wake-up %s", what)
		}
	}
	wait("once listening") // the catch-up signal after LISTEN
	if _, err := db.Exec(ctx, `SELECT pg_notify($1, '')`, pglisten.Persisted); err != nil {
		t.Fatal(err)
	}
	wait("after persist's notification")
}
