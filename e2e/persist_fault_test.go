package e2e

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/stacktest"
)

// TestKilledPersistResumes kills persist with kill -9 in the middle of a
// Postgres transaction; a new persist resumes from the offsets in Postgres
// and every event ends up there exactly once.
func TestKilledPersistResumes(t *testing.T) {
	sharing(t, 15, 15)
	dev := startDev(t, t.TempDir(), "--persist=false")
	ep := filepath.Join(dev.Dir, "endpoints.json")
	p1 := stacktest.StartProc(t, dev.Dir, "persist1", []string{"CHATPIPE_FAULT_PERSIST_SLEEP_BEFORE_COMMIT=300ms"}, "persist", "--endpoints", ep, "--log-level", "warn", "--admin", "127.0.0.1:0")
	underLoad(t, dev, func() {
		time.Sleep(time.Second)
		p1.Kill9()
		stacktest.StartProc(t, dev.Dir, "persist2", nil, "persist", "--endpoints", ep, "--log-level", "warn")
	})
}
