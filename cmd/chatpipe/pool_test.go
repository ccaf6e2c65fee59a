package main

import (
	"os"
	"strings"
	"testing"
)

// TestPoolConfigKeepsAnExplicitSize: a pool_max_conns in the database URL
// is what the pool gets (the compose file sizes seven pools under
// Postgres' max_connections with it); without one a pool may grow to 16.
func TestPoolConfigKeepsAnExplicitSize(t *testing.T) {
	for _, c := range []struct {
		url  string
		want int32
	}{
		{"postgres://u:p@db:5432/chatpipe?sslmode=disable&pool_max_conns=10", 10},
		{"postgresql://u@db/chatpipe?pool_max_conns=2", 2},
		{"postgres://u:p@db:5432/chatpipe?pool_max_conns=40", 40},
		{"host=db user=u dbname=chatpipe pool_max_conns=5 sslmode=disable", 5},
		{"host=db user=u dbname=chatpipe pool_max_conns = 6", 6},
		{"postgres://u:p@db:5432/chatpipe?sslmode=disable", defaultPoolConns},
		{"host=db user=u dbname=chatpipe", defaultPoolConns},
		{"postgres://u:p@db:5432/pool_max_conns?sslmode=disable", defaultPoolConns}, // a database so named sets nothing
	} {
		cfg, err := poolConfig(c.url)
		if err != nil {
			t.Fatalf("%s: %v", c.url, err)
		}
		if cfg.MaxConns != c.want {
			t.Errorf("%s: MaxConns %d, want %d", c.url, cfg.MaxConns, c.want)
		}
	}
	if _, err := poolConfig("postgres://u@db/chatpipe?pool_max_conns=many"); err == nil {
		t.Error("pool_max_conns=many is accepted")
	}
}

// TestDefaultWorkerID: without --id, a worker with a fixed listen port is
// named for its host (and a specific listen IP) and port, the same at every
// start; with port 0 it gets a fresh random id.
func TestDefaultWorkerID(t *testing.T) {
	t.Setenv("HOSTNAME", "c0ffee12")
	for _, c := range []struct{ listen, want string }{
		{"0.0.0.0:7070", "c0ffee12-7070"},
		{":7070", "c0ffee12-7070"},
		{"[::]:7070", "c0ffee12-7070"},
		{"127.0.0.2:7070", "c0ffee12-127.0.0.2-7070"},
		{"10.1.2.3:7071", "c0ffee12-10.1.2.3-7071"},
	} {
		if got, again := defaultWorkerID(c.listen), defaultWorkerID(c.listen); got != c.want || again != got {
			t.Errorf("defaultWorkerID(%q) = %q, then %q; want %q both times", c.listen, got, again, c.want)
		}
	}
	a, b := defaultWorkerID("127.0.0.1:0"), defaultWorkerID("127.0.0.1:0")
	if a == b || !strings.HasPrefix(a, "worker-") {
		t.Errorf("port 0: ids %q and %q, want two different worker-<random>", a, b)
	}
	t.Setenv("HOSTNAME", "")
	if host, _ := os.Hostname(); host != "" {
		if got := defaultWorkerID("0.0.0.0:7070"); got != host+"-7070" {
			t.Errorf("without $HOSTNAME: %q, want %q", got, host+"-7070")
		}
	}
}
