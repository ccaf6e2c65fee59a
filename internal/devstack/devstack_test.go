package devstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestFreePort(t *testing.T) {
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	if port <= 0 || port > 65535 {
		t.Fatalf("FreePort = %d", port)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("port %d from FreePort is not bindable: %v", port, err)
	}
	_ = ln.Close()
}

// --- etcd ---

func startTestEtcd(t *testing.T, ctx context.Context, dir string) *Etcd {
	t.Helper()
	e, err := StartEtcd(ctx, dir, 0, testLogger(t))
	if err != nil {
		t.Fatalf("StartEtcd: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("Etcd.Close: %v", err)
		}
	})
	return e
}

func etcdClient(t *testing.T, e *Etcd) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   e.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func etcdGet(t *testing.T, ctx context.Context, e *Etcd, key string) string {
	t.Helper()
	cli := etcdClient(t, e)
	resp, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("get %s: %d kvs", key, len(resp.Kvs))
	}
	_ = cli.Close()
	return string(resp.Kvs[0].Value)
}

func rememberedPeerPort(t *testing.T, dir string) int {
	t.Helper()
	var st etcdState
	found, err := readJSON(filepath.Join(dir, etcdStateFile), &st)
	if err != nil || !found {
		t.Fatalf("read etcd state: found=%v err=%v", found, err)
	}
	return st.PeerPort
}

func TestEtcd(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()

	e := startTestEtcd(t, ctx, dir)
	if eps := e.Endpoints(); len(eps) != 1 || !strings.HasPrefix(eps[0], "http://127.0.0.1:") {
		t.Fatalf("Endpoints = %v", eps)
	}
	cli := etcdClient(t, e)
	if _, err := cli.Put(ctx, "devstack/key", "v1"); err != nil {
		t.Fatalf("put: %v", err)
	}
	_ = cli.Close()
	if got := etcdGet(t, ctx, e, "devstack/key"); got != "v1" {
		t.Fatalf("get = %q, want v1", got)
	}
	peer := e.peerPort
	if got := rememberedPeerPort(t, dir); got != peer {
		t.Fatalf("remembered peer port %d, running on %d", got, peer)
	}

	// A second member on the same dir must be refused, not hang or corrupt.
	if e2, err := StartEtcd(ctx, dir, 0, testLogger(t)); err == nil {
		_ = e2.Close()
		t.Fatal("second StartEtcd on a dir in use succeeded")
	} else if !strings.Contains(err.Error(), "already in use") {
		t.Fatalf("second StartEtcd: unexpected error %v", err)
	}

	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	// Restart: same data, same peer port.
	e = startTestEtcd(t, ctx, dir)
	if e.peerPort != peer {
		t.Fatalf("restart picked peer port %d, want remembered %d", e.peerPort, peer)
	}
	if got := etcdGet(t, ctx, e, "devstack/key"); got != "v1" {
		t.Fatalf("after restart get = %q, want v1", got)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	// Restart while the remembered peer port is taken: a new port is
	// picked and remembered, and the existing data still loads.
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(peer)))
	if err != nil {
		t.Fatalf("occupy peer port: %v", err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	e = startTestEtcd(t, ctx, dir)
	if e.peerPort == peer {
		t.Fatalf("restart reused taken peer port %d", peer)
	}
	if got := rememberedPeerPort(t, dir); got != e.peerPort {
		t.Fatalf("remembered peer port %d, running on %d", got, e.peerPort)
	}
	if got := etcdGet(t, ctx, e, "devstack/key"); got != "v1" {
		t.Fatalf("after peer port change get = %q, want v1", got)
	}
	cli = etcdClient(t, e)
	ml, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatalf("member list: %v", err)
	}
	wantURL := fmt.Sprintf("http://127.0.0.1:%d", e.peerPort)
	if len(ml.Members) != 1 || !slices.Equal(ml.Members[0].PeerURLs, []string{wantURL}) {
		t.Fatalf("members = %v, want one with peer URL %s", ml.Members, wantURL)
	}
	if _, err := cli.Put(ctx, "devstack/key2", "v2"); err != nil {
		t.Fatalf("put after peer port change: %v", err)
	}
	_ = cli.Close()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	_ = ln.Close()

	// And once more on the new port, to be sure the moved member restarts.
	e = startTestEtcd(t, ctx, dir)
	if got := etcdGet(t, ctx, e, "devstack/key2"); got != "v2" {
		t.Fatalf("after second restart get = %q, want v2", got)
	}
}

// --- kafka ---

func startTestKafka(t *testing.T, dir string) *Kafka {
	t.Helper()
	k, err := StartKafka(dir, 0, testLogger(t))
	if err != nil {
		t.Fatalf("StartKafka: %v", err)
	}
	t.Cleanup(k.Close)
	return k
}

// produceTxn produces values to topic (all with one key, so one partition)
// in one transaction, committing it if commit is true and aborting it
// otherwise.
func produceTxn(t *testing.T, ctx context.Context, addr, topic, txnID string, commit bool, values ...string) {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(addr),
		kgo.TransactionalID(txnID),
		kgo.DefaultProduceTopic(topic),
	)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer cl.Close()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatalf("begin transaction: %v", err)
	}
	for _, v := range values {
		if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("produce %q: %v", v, err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatalf("end transaction (commit=%v): %v", commit, err)
	}
}

// readCommitted reads topic from the start with read-committed isolation
// until it has seen want records.
func readCommitted(t *testing.T, ctx context.Context, addr, topic string, want int) []string {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(addr),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	)
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var got []string
	for len(got) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %s: got %q, want %d records: %v", topic, got, want, ctx.Err())
		}
		fs.EachError(func(topic string, p int32, err error) {
			t.Fatalf("fetch %s/%d: %v", topic, p, err)
		})
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	return got
}

func TestKafka(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	const topic = "devstack-events"

	k := startTestKafka(t, dir)
	if k.Cluster() == nil {
		t.Fatal("Cluster() = nil")
	}
	addrs := []string{k.Addr()}
	if err := EnsureTopic(ctx, addrs, topic, 3); err != nil {
		t.Fatalf("EnsureTopic: %v", err)
	}
	if err := EnsureTopic(ctx, addrs, topic, 3); err != nil {
		t.Fatalf("EnsureTopic again: %v", err)
	}
	if err := EnsureTopic(ctx, addrs, topic, 5); err == nil || !strings.Contains(err.Error(), "exists with 3 partitions") {
		t.Fatalf("EnsureTopic with other partition count: err = %v", err)
	}

	if _, err := StartKafka(dir, 0, testLogger(t)); err == nil || !strings.Contains(err.Error(), "already in use") {
		t.Fatalf("second StartKafka on a dir in use: err = %v", err)
	}

	produceTxn(t, ctx, k.Addr(), topic, "devstack-txn", true, "v1")
	produceTxn(t, ctx, k.Addr(), topic, "devstack-txn", false, "aborted")
	if got := readCommitted(t, ctx, k.Addr(), topic, 1); !slices.Equal(got, []string{"v1"}) {
		t.Fatalf("read = %q, want [v1]", got)
	}
	oldAddr := k.Addr()
	k.Close()
	k.Close()

	k = startTestKafka(t, dir)
	t.Logf("kafka restarted: %s -> %s", oldAddr, k.Addr())
	if err := EnsureTopic(ctx, []string{k.Addr()}, topic, 3); err != nil {
		t.Fatalf("EnsureTopic after restart: %v", err)
	}
	// The same transactional ID keeps working after the restart, and the
	// aborted record stays invisible.
	produceTxn(t, ctx, k.Addr(), topic, "devstack-txn", true, "v2")
	if got := readCommitted(t, ctx, k.Addr(), topic, 2); !slices.Equal(got, []string{"v1", "v2"}) {
		t.Fatalf("read after restart = %q, want [v1 v2]", got)
	}
}

// --- postgres ---

func startTestPostgres(t *testing.T, ctx context.Context, dir string) *Postgres {
	t.Helper()
	p, err := StartPostgres(ctx, dir, 0, testLogger(t))
	if err != nil {
		t.Fatalf("StartPostgres: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Postgres.Close: %v", err)
		}
	})
	return p
}

func pgExec(t *testing.T, ctx context.Context, p *Postgres, sql string, args ...any) {
	t.Helper()
	conn, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		t.Fatalf("connect %s: %v", p.URL(), err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
}

func pgNotes(t *testing.T, ctx context.Context, p *Postgres) []string {
	t.Helper()
	conn, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		t.Fatalf("connect %s: %v", p.URL(), err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	rows, err := conn.Query(ctx, "SELECT body FROM notes ORDER BY id")
	if err != nil {
		t.Fatalf("query: %v", err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("collect: %v", err)
	}
	return got
}

func TestPostgres(t *testing.T) {
	ctx := testContext(t)
	// A subdirectory, so that StartPostgres has to create it and (as root)
	// open up t.TempDir()'s 0700 directories for the postgres user.
	dir := filepath.Join(t.TempDir(), "pg")

	p := startTestPostgres(t, ctx, dir)
	if !strings.HasPrefix(p.URL(), "postgres://postgres@127.0.0.1:") || !strings.HasSuffix(p.URL(), "/chatpipe?sslmode=disable") {
		t.Fatalf("URL = %s", p.URL())
	}
	pgExec(t, ctx, p, "CREATE TABLE notes (id serial PRIMARY KEY, body text NOT NULL)")
	pgExec(t, ctx, p, "INSERT INTO notes (body) VALUES ($1)", "first")

	// Starting the same dir again while it runs is a clear error.
	if p2, err := StartPostgres(ctx, dir, 0, testLogger(t)); err == nil {
		_ = p2.Close()
		t.Fatal("second StartPostgres on a running dir succeeded")
	} else if !strings.Contains(err.Error(), "still running") {
		t.Fatalf("second StartPostgres: unexpected error %v", err)
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	// Restart on the same dir: the row is still there.
	p = startTestPostgres(t, ctx, dir)
	if got := pgNotes(t, ctx, p); !slices.Equal(got, []string{"first"}) {
		t.Fatalf("after restart notes = %q, want [first]", got)
	}
	pgExec(t, ctx, p, "INSERT INTO notes (body) VALUES ($1)", "second")

	// Crash: SIGKILL the postmaster, leaving postmaster.pid behind.
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.exited
	if _, err := os.Stat(filepath.Join(dir, "postmaster.pid")); err != nil {
		t.Fatalf("expected a stale postmaster.pid after SIGKILL: %v", err)
	}
	p = startTestPostgres(t, ctx, dir)
	if got := pgNotes(t, ctx, p); !slices.Equal(got, []string{"first", "second"}) {
		t.Fatalf("after crash restart notes = %q, want [first second]", got)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	// A stale postmaster.pid whose pid now belongs to another live process
	// (pid 1 here) must not block the start either.
	pidFile := filepath.Join(dir, "postmaster.pid")
	if err := os.WriteFile(pidFile, []byte("1\n"+dir+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p = startTestPostgres(t, ctx, dir)
	if got := pgNotes(t, ctx, p); len(got) != 2 {
		t.Fatalf("after pid-reuse restart notes = %q", got)
	}
}

// TestPGTemplateHoldsDatabase: a cluster copied from PreparePGTemplate's
// has the chatpipe database, so a stack's start does not create it, and
// no server log of the template's.
func TestPGTemplateHoldsDatabase(t *testing.T) {
	ctx := testContext(t)
	tpl := filepath.Join(t.TempDir(), "tpl")
	if err := PreparePGTemplate(ctx, tpl, testLogger(t)); err != nil {
		t.Fatalf("PreparePGTemplate: %v", err)
	}
	if _, err := os.Stat(filepath.Join(tpl, pgLogFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the template keeps its server's log (stat: %v): every copy would start with it", err)
	}
	t.Setenv(pgTemplateEnv, tpl)
	var logged bytes.Buffer
	p, err := StartPostgres(ctx, filepath.Join(t.TempDir(), "pg"), 0, slog.New(slog.NewTextHandler(&logged, nil)))
	if err != nil {
		t.Fatalf("StartPostgres from the template: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	if strings.Contains(logged.String(), "created database") {
		t.Errorf("the copy had no chatpipe database; the start created it:\n%s", logged.String())
	}
	pgExec(t, ctx, p, "SELECT 1") // p.URL() names the chatpipe database
}

// TestPostgresSetup: a cluster set up as the postgres image sets one up
// (a superuser of its own with a password, password authentication over
// TCP, initdb's arguments, a database of its own) on another loopback
// address is made by initdb even where a template is named, and refuses a
// connection over TCP without the password; its Settings are in effect.
func TestPostgresSetup(t *testing.T) {
	ctx := testContext(t)
	t.Setenv(pgTemplateEnv, filepath.Join(t.TempDir(), "none")) // a copy would fail: no cluster there
	setup := PostgresSetup{Listen: "127.0.0.2", Superuser: "app", Password: "s3cret",
		InitdbArgs: []string{"--encoding=UTF8", "--locale=C"}, Database: "appdb",
		Settings: []string{"shared_preload_libraries=pg_stat_statements", "work_mem=5MB"}}
	p, err := StartPostgresWith(ctx, filepath.Join(t.TempDir(), "pg"), 0, setup, testLogger(t))
	if err != nil {
		t.Fatalf("StartPostgresWith: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	if !strings.HasPrefix(p.URL(), "postgres://app:s3cret@127.0.0.2:") || !strings.HasSuffix(p.URL(), "/appdb?sslmode=disable") {
		t.Fatalf("URL = %q", p.URL())
	}
	conn, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		t.Fatalf("connect with the password: %v", err)
	}
	defer conn.Close(ctx)
	var user, db, enc string
	var super bool
	if err := conn.QueryRow(ctx, `SELECT current_user, current_database(), pg_encoding_to_char(encoding), usesuper
		FROM pg_database, pg_user WHERE datname = current_database() AND usename = current_user`).Scan(&user, &db, &enc, &super); err != nil {
		t.Fatal(err)
	}
	if user != "app" || db != "appdb" || enc != "UTF8" || !super {
		t.Errorf("connected as %s (superuser %v) to %s encoded %s, want app (superuser) to appdb encoded UTF8", user, super, db, enc)
	}
	var preload, workMem string
	if err := conn.QueryRow(ctx, `SELECT current_setting('shared_preload_libraries'), current_setting('work_mem')`).Scan(&preload, &workMem); err != nil {
		t.Fatal(err)
	}
	if preload != "pg_stat_statements" || workMem != "5MB" {
		t.Errorf("settings: shared_preload_libraries %q, work_mem %q; want pg_stat_statements, 5MB", preload, workMem)
	}
	if c, err := pgx.Connect(ctx, strings.Replace(p.URL(), ":s3cret@", "@", 1)); err == nil {
		c.Close(ctx)
		t.Error("a connection over TCP without the password was let in")
	}
}

func TestPostgresNotEmptyDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "junk"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := StartPostgres(testContext(t), dir, 0, testLogger(t))
	if err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("StartPostgres on a non-empty non-cluster dir: err = %v", err)
	}
}

func TestCompareVersions(t *testing.T) {
	vs := []string{"9.6", "15", "10", "16", "9.5"}
	slices.SortFunc(vs, compareVersions)
	if want := []string{"9.5", "9.6", "10", "15", "16"}; !slices.Equal(vs, want) {
		t.Fatalf("sorted = %v, want %v", vs, want)
	}
}

func TestFreePortsAreDistinct(t *testing.T) {
	for range 20 {
		ports, err := FreePorts(8)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[int]bool{}
		for _, p := range ports {
			if seen[p] || p <= 0 {
				t.Fatalf("FreePorts(8) = %v: not 8 distinct ports", ports)
			}
			seen[p] = true
		}
	}
}

// FreePort hands out distinct ports below the ephemeral range, so no
// connection opened meanwhile can take one before its caller binds it.
func TestFreePortIsOutsideTheEphemeralRange(t *testing.T) {
	lo, hi := portRange()
	seen := map[int]bool{}
	for range 50 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if p < lo || p >= hi || seen[p] {
			t.Fatalf("FreePort gave %d (range %d–%d, given before: %v)", p, lo, hi-1, seen[p])
		}
		seen[p] = true
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if first, err := strconv.Atoi(f[0]); err == nil && hi > first {
				t.Errorf("the range ends at %d, inside the ephemeral range from %d", hi, first)
			}
		}
	}
}
