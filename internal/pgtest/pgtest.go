// Package pgtest gives tests a private Postgres cluster (one per test
// binary, started by devstack) and a fresh, migrated database per test.
package pgtest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/internal/schema"
)

var (
	once    sync.Once
	cluster *devstack.Postgres
	dir     string
	errBoot error
	seq     atomic.Int64
)

// Main runs the tests of a package that uses DB and stops the cluster
// afterwards; call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if cluster != nil {
		_ = cluster.Close()
	}
	if dir != "" {
		_ = os.RemoveAll(dir)
	}
	os.Exit(code)
}

// Options choose how a database is created.
type Options struct {
	// Create is appended to CREATE DATABASE, e.g.
	// `TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'`.
	Create string
}

// DB returns a pool on a new database of the shared cluster with the
// chatpipe schema applied; it is closed when the test ends.
func DB(t testing.TB, opt Options) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	once.Do(func() {
		dir, errBoot = os.MkdirTemp("", "chatpipe-pgtest-")
		if errBoot != nil {
			return
		}
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		cluster, errBoot = devstack.StartPostgres(ctx, filepath.Join(dir, "pg"), 0, log)
	})
	if errBoot != nil {
		t.Fatalf("pgtest: start postgres: %v", errBoot)
	}
	name := fmt.Sprintf("t%d_%s", seq.Add(1), strings.ToLower(sanitize(t.Name())))
	if len(name) > 60 {
		name = name[:60]
	}
	admin, err := pgx.Connect(ctx, cluster.DatabaseURL("postgres"))
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" "+opt.Create); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	pool, err := pgxpool.New(ctx, cluster.DatabaseURL(name))
	if err != nil {
		t.Fatalf("pgtest: connect to %s: %v", name, err)
	}
	t.Cleanup(pool.Close)
	if err := schema.Migrate(ctx, pool); err != nil {
		t.Fatalf("pgtest: migrate %s: %v", name, err)
	}
	return pool
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, s)
}
