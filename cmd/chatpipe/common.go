package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/chatpipe/chatpipe/internal/clustersec"
	"github.com/chatpipe/chatpipe/internal/pgcount"
	"github.com/chatpipe/chatpipe/internal/schema"
	"github.com/chatpipe/chatpipe/lease"
)

// Endpoints is what `chatpipe dev` writes to DIR/endpoints.json: how to
// reach every part of the running stack.
type Endpoints struct {
	WebSocket  string   `json:"websocket"`
	HTTP       string   `json:"http"`
	Kafka      []string `json:"kafka"`
	Topic      string   `json:"topic"`
	Postgres   string   `json:"postgres"`
	Etcd       []string `json:"etcd"`
	Prefix     string   `json:"prefix"`
	VShards    int      `json:"vshards"`
	Partitions int      `json:"partitions"`
	Dedicated  int      `json:"dedicated,omitempty"` // dedicated vshards after the hashed ones, each with its own partition after Partitions
	Metrics    string   `json:"metrics"`
	Admin      string   `json:"admin,omitempty"` // /metrics, /readyz and /debug/pprof/ of the process
	PID        int      `json:"pid"`
}

func readEndpoints(path string) (*Endpoints, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read endpoints: %w", err)
	}
	var e Endpoints
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	return &e, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// dialEtcd connects to etcd, with the TLS of sec's --etcd-tls-* flags (sec
// may be nil: plaintext).
func dialEtcd(ctx context.Context, endpoints []string, sec *secFlags) (*clientv3.Client, error) {
	var tc *tls.Config
	if sec != nil {
		var err error
		if tc, err = sec.etcdTLS(); err != nil {
			return nil, err
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Context: context.WithoutCancel(ctx), TLS: tc})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	if tc != nil {
		if err := probeEtcd(ctx, tc, endpoints); err != nil {
			cli.Close()
			return nil, err
		}
	}
	return cli, nil
}

// probeEtcd makes one TLS connection to each etcd member. It fails when
// every member refuses the handshake (an untrusted certificate, or no
// client certificate where one is wanted); members that cannot be reached
// at all are waited for later, as without TLS.
func probeEtcd(ctx context.Context, tc *tls.Config, endpoints []string) error {
	var errs []error
	for _, ep := range endpoints {
		addr := ep
		if u, err := url.Parse(ep); err == nil && u.Host != "" {
			addr = u.Host
		}
		err := clustersec.ProbeTLS(ctx, addr, tc)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("etcd refused this client's TLS (check --etcd-tls-ca, --etcd-tls-cert and --etcd-tls-key): %w", errors.Join(errs...))
}

// defaultPoolConns is the least a role's Postgres pool may grow to when its
// database URL does not set pool_max_conns (pgx's own default, the number
// of CPUs but at least 4, starves a worker's state loads on a small
// machine).
const defaultPoolConns = 16

// poolConfig parses a database URL (or keyword/value DSN). A
// pool_max_conns it names is kept as it is, so a deployment can size its
// roles' pools under Postgres' max_connections; without one the pool may
// grow to pgx's default or defaultPoolConns, whichever is larger.
func poolConfig(dbURL string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	if !setsPoolMaxConns(dbURL) {
		cfg.MaxConns = max(cfg.MaxConns, defaultPoolConns)
	}
	cfg.ConnConfig.Tracer = pgRoundTrips
	return cfg, nil
}

// pgRoundTrips counts what this process's pools send to Postgres; every
// role's registry exports it (chatpipe_postgres_statements_total).
var pgRoundTrips = pgcount.New()

// setsPoolMaxConns tells whether a database URL or keyword/value DSN names
// pool_max_conns.
func setsPoolMaxConns(dbURL string) bool {
	if strings.HasPrefix(dbURL, "postgres://") || strings.HasPrefix(dbURL, "postgresql://") {
		u, err := url.Parse(dbURL)
		return err == nil && u.Query().Has("pool_max_conns")
	}
	return dsnPoolMaxConns.MatchString(dbURL)
}

// dsnPoolMaxConns finds the pool_max_conns key of a keyword/value DSN
// (libpq allows spaces around the =).
var dsnPoolMaxConns = regexp.MustCompile(`(^|\s)pool_max_conns\s*=`)

func openDB(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	cfg, err := poolConfig(dbURL)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect postgres: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect postgres: %w", err)
	}
	return pool, nil
}

// etcdConfig dials etcd and returns the deployment's config: want is
// written if etcd has none (a complete one only) and must agree otherwise;
// a zero want adopts etcd's.
func etcdConfig(ctx context.Context, endpoints string, sec *secFlags, want lease.Config) (*clientv3.Client, lease.Config, error) {
	cli, err := dialEtcd(ctx, splitList(endpoints), sec)
	if err != nil {
		return nil, lease.Config{}, err
	}
	cfg, err := lease.EnsureConfig(ctx, cli, lease.DefaultPrefix, want)
	if err != nil {
		cli.Close()
		return nil, lease.Config{}, err
	}
	return cli, cfg, nil
}

// openMigratedDB connects to Postgres and applies the migrations.
func openMigratedDB(ctx context.Context, url string) (*pgxpool.Pool, error) {
	db, err := openDB(ctx, url)
	if err != nil {
		return nil, err
	}
	if err := schema.Migrate(ctx, db); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}
