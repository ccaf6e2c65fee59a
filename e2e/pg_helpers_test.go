package e2e

import (
	"context"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chatpipe/chatpipe/internal/devstack"
)

// connectPG opens a connection to the database at dsn for the test; the
// test's cleanup closes it.
func connectPG(ctx context.Context, t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// testPG is a Postgres cluster run by the test itself (not by chatpipe
// dev), so that the test can stop it and start it again on the same data
// dir and port while the stack runs.
type testPG struct {
	t    *testing.T
	dir  string
	port int
	url  string
	p    *devstack.Postgres
}

func startTestPG(t *testing.T, dir string) *testPG {
	t.Helper()
	pg := &testPG{t: t, dir: dir}
	pg.start()
	u, err := url.Parse(pg.p.URL())
	if err != nil {
		t.Fatal(err)
	}
	if pg.port, err = strconv.Atoi(u.Port()); err != nil {
		t.Fatal(err)
	}
	pg.url = pg.p.URL()
	t.Cleanup(func() {
		if pg.p != nil {
			pg.p.Close()
		}
	})
	return pg
}

// start starts the cluster (again) on its data dir and port and returns
// once it accepts connections.
func (pg *testPG) start() {
	pg.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, err := devstack.StartPostgres(ctx, pg.dir, pg.port, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		pg.t.Fatal(err)
	}
	pg.p = p
}

// stopFast is `pg_ctl stop -m fast`: SIGINT; open transactions are rolled
// back, connections closed, a checkpoint written. It returns once the
// server has exited.
func (pg *testPG) stopFast() {
	pg.t.Helper()
	if err := pg.p.Close(); err != nil {
		pg.t.Fatalf("fast shutdown: %v", err)
	}
	pg.p = nil
}

// stopImmediate is `pg_ctl stop -m immediate`: SIGQUIT to the postmaster;
// every process exits at once without a checkpoint, and the next start
// runs crash recovery. It returns once the server has exited.
func (pg *testPG) stopImmediate() {
	pg.t.Helper()
	b, err := os.ReadFile(filepath.Join(pg.dir, "postmaster.pid"))
	if err != nil {
		pg.t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		pg.t.Fatalf("postmaster.pid: %q", first)
	}
	if err := syscall.Kill(pid, syscall.SIGQUIT); err != nil {
		pg.t.Fatal(err)
	}
	// The server is a child of this process: it is gone once reaped.
	deadline := time.Now().Add(30 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			pg.t.Fatalf("postgres (pid %d) still runs 30 s after SIGQUIT", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Close only collects the exit; an immediate shutdown does not exit
	// as a clean stop does, so its error is expected.
	pg.p.Close()
	pg.p = nil
}

// logPath is the server's log (all its runs).
func (pg *testPG) logPath() string { return filepath.Join(pg.dir, "postgres.log") }
