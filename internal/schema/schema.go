// Package schema holds chatpipe's Postgres schema as embedded, numbered SQL
// migrations and applies them. A dozen lines of runner are simpler here than
// a migration library: the files only ever move forward, in one transaction
// each, under an advisory lock so concurrent starters wait for each other.
package schema

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var files embed.FS

// advisoryLock is the pg_advisory_xact_lock key that serialises migrations.
const advisoryLock = 0x63686174 // "chat"

// Applied is how many migrations the database at pool holds; an error
// when it has no chatpipe schema at all.
func Applied(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&n); err != nil {
		return 0, fmt.Errorf("schema: count applied migrations: %w", err)
	}
	return n, nil
}

// Migrate applies every migration not yet applied. It is safe to run from
// several processes at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	names, err := fs.Glob(files, "migrations/*.sql")
	if err != nil {
		return fmt.Errorf("schema: list migrations: %w", err)
	}
	sort.Strings(names)
	for _, name := range names {
		base := strings.TrimPrefix(name, "migrations/")
		version, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return fmt.Errorf("schema: migration %s has no number: %w", base, err)
		}
		sql, err := files.ReadFile(name)
		if err != nil {
			return fmt.Errorf("schema: read %s: %w", base, err)
		}
		if err := apply(ctx, pool, version, string(sql)); err != nil {
			return fmt.Errorf("schema: apply %s: %w", base, err)
		}
	}
	return nil
}

func apply(ctx context.Context, pool *pgxpool.Pool, version int, sql string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, advisoryLock); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		var done bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = $1)`, version).Scan(&done); err != nil {
			return err
		}
		if done {
			return nil
		}
		if _, err := tx.Exec(ctx, sql); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version) VALUES ($1)`, version)
		return err
	})
}
