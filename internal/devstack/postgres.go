package devstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// The server's life: its start (again after losing the race for a port, or
// while an old shared memory segment is still attached), readiness, the
// chatpipe database, its URLs and its shutdown.

const (
	// pgDatabase is the database StartPostgres makes sure exists.
	pgDatabase = "chatpipe"
	// pgSuperuser is the bootstrap superuser initdb creates.
	pgSuperuser = "postgres"
	// pgListen is the address StartPostgres's server listens on.
	pgListen = "127.0.0.1"
	// pgOSUser is the OS account postgres runs as when we are root.
	pgOSUser = "postgres"
	// pgLogFile receives the server's stdout and stderr, appended.
	pgLogFile = "postgres.log"
	// pgStartTimeout bounds StartPostgres when ctx has a later (or no) deadline.
	pgStartTimeout = 2 * time.Minute
	// pgShutdownGrace is how long Close waits after SIGINT before SIGQUIT.
	pgShutdownGrace = 30 * time.Second
	// pgKillGrace is how long Close waits after SIGQUIT before SIGKILL.
	pgKillGrace = 10 * time.Second
	// pgMaxSocketPath is the longest unix socket path postgres accepts
	// (sizeof(sun_path) minus the terminating NUL).
	pgMaxSocketPath = 107
	// pgBindAttempts is how often StartPostgres tries again after losing a
	// race for a port it picked itself.
	pgBindAttempts = 3
)

// PostgresSetup is how StartPostgresWith sets a new cluster up and serves
// it. Its zero value is StartPostgres's: superuser "postgres", trusted on
// the unix socket and over TCP, UTF8 and the C locale, listening on
// 127.0.0.1, database "chatpipe". A cluster that already exists in the data
// dir keeps the superuser, password and initdb arguments it was made with.
type PostgresSetup struct {
	// Listen is the address the server listens on (default 127.0.0.1).
	Listen string
	// Superuser is the bootstrap superuser initdb creates (default
	// "postgres").
	Superuser string
	// Password, when set, is Superuser's password, and connections over
	// TCP authenticate with it (scram-sha-256); the unix socket stays
	// trusted.
	Password string
	// InitdbArgs replace initdb's encoding and locale arguments (default
	// --encoding=UTF8 --locale=C).
	InitdbArgs []string
	// Database is the database made sure to exist (default "chatpipe").
	Database string
	// Settings are server settings, each "name=value", given to postgres
	// as -c options on every start (for example
	// "shared_preload_libraries=pg_stat_statements").
	Settings []string
}

// withDefaults is s with its defaults filled in.
func (s PostgresSetup) withDefaults() PostgresSetup {
	if s.Listen == "" {
		s.Listen = pgListen
	}
	if s.Superuser == "" {
		s.Superuser = pgSuperuser
	}
	if len(s.InitdbArgs) == 0 {
		s.InitdbArgs = []string{"--encoding=UTF8", "--locale=C"}
	}
	if s.Database == "" {
		s.Database = pgDatabase
	}
	return s
}

// templated reports whether a cluster of setup s may be a copy of
// CHATPIPE_PG_TEMPLATE's, which StartPostgres's defaults made.
func (s PostgresSetup) templated() bool {
	return s.Superuser == "" && s.Password == "" && len(s.InitdbArgs) == 0
}

// Postgres is a private PostgreSQL cluster created with the machine's
// PostgreSQL binaries and run as a child process of this one.
//
// The server is started with Pdeathsig set, so the kernel sends it SIGQUIT
// (immediate shutdown) if this process dies without calling Close. Stop it
// with Close.
type Postgres struct {
	dir   string
	port  int
	setup PostgresSetup // with its defaults
	log   *slog.Logger

	cmd     *exec.Cmd
	exited  chan struct{} // closed once cmd.Wait has returned
	waitErr error         // cmd.Wait's result; read only after exited is closed

	closeOnce sync.Once
	closeErr  error
}

// StartPostgres creates (initdb, once) and starts a private PostgreSQL
// cluster in dir, listening on 127.0.0.1:port (0 = free port) with its unix
// socket directory inside dir, and creates database "chatpipe" if missing.
//
// Binaries come from $CHATPIPE_PG_BIN if set, else the newest
// /usr/lib/postgresql/*/bin, else `pg_config --bindir` from PATH.
//
// initdb and postgres refuse to run as root. When the effective user is root
// they run as the "postgres" OS user instead: dir is chowned to that user and
// every ancestor directory of dir that the user could not traverse gets o+x.
//
// The cluster is initialized with trust authentication, superuser
// "postgres", UTF8 encoding and the C locale. The server's output is
// appended to dir/postgres.log. A stale postmaster.pid left by a killed run
// does not prevent a start, but a postgres from an earlier run that is still
// serving dir is reported as an error. StartPostgres returns once the server
// accepts connections, or with an error when ctx is done, a two minute start
// timeout passes, or the server exits.
func StartPostgres(ctx context.Context, dir string, port int, log *slog.Logger) (*Postgres, error) {
	return StartPostgresWith(ctx, dir, port, PostgresSetup{}, log)
}

// StartPostgresWith is StartPostgres with the cluster set up and served as
// setup says (its zero value is StartPostgres's). A cluster with another
// superuser, a password or other initdb arguments is made by initdb, never
// copied from CHATPIPE_PG_TEMPLATE.
func StartPostgresWith(ctx context.Context, dir string, port int, setup PostgresSetup, log *slog.Logger) (*Postgres, error) {
	log = orDefault(log).With("component", "postgres")
	templated := setup.templated()
	setup = setup.withDefaults()
	if dir == "" {
		return nil, errors.New("devstack: start postgres: empty data dir")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("devstack: start postgres: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, pgStartTimeout)
	defer cancel()

	bin, err := pgBinDir(ctx)
	if err != nil {
		return nil, err
	}
	cred, err := pgCredential()
	if err != nil {
		return nil, err
	}
	if err := preparePGDir(dir, cred, log); err != nil {
		return nil, err
	}
	if err := initPGCluster(ctx, bin, dir, cred, setup, templated, log); err != nil {
		return nil, err
	}
	if err := clearStalePGLocks(ctx, dir, log); err != nil {
		return nil, err
	}
	if cred != nil {
		if err := chownTree(dir, cred); err != nil {
			return nil, err
		}
	}

	for attempt := 1; ; attempt++ {
		p, err := startPGOnce(ctx, bin, dir, port, setup, cred, log)
		if err == nil {
			if err := p.ensureDatabase(ctx); err != nil {
				_ = p.Close()
				return nil, err
			}
			log.Debug("postgres ready", "dir", dir, "url", p.URL())
			return p, nil
		}
		var se *pgStartError
		if !errors.As(err, &se) || ctx.Err() != nil {
			return nil, err
		}
		switch {
		case se.bindFailed && port == 0 && attempt < pgBindAttempts:
			// Lost the race for the port FreePort handed us.
			log.Warn("postgres port taken, retrying", "attempt", attempt)
		case se.shmemInUse:
			// Backends of a killed postmaster are still exiting; they go
			// away as soon as they notice their parent is gone.
			log.Warn("shared memory of a previous postgres still in use, retrying")
			select {
			case <-time.After(250 * time.Millisecond):
			case <-ctx.Done():
				return nil, err
			}
		default:
			return nil, err
		}
	}
}

// pgStartError is a postgres server that exited before accepting
// connections, with what its log said.
type pgStartError struct {
	dir        string
	waitErr    error
	logTail    string
	bindFailed bool // could not bind its TCP port
	shmemInUse bool // an old shared memory segment is still attached
}

func (e *pgStartError) Error() string {
	return fmt.Sprintf("devstack: postgres in %s exited before accepting connections (%v); log:\n%s", e.dir, e.waitErr, e.logTail)
}

func (e *pgStartError) Unwrap() error { return e.waitErr }

// startPGOnce starts the server once and waits until it accepts connections.
// If the server exits first, the error is a *pgStartError.
func startPGOnce(ctx context.Context, bin, dir string, port int, setup PostgresSetup, cred *syscall.Credential, log *slog.Logger) (*Postgres, error) {
	if port == 0 {
		var err error
		if port, err = FreePort(); err != nil {
			return nil, fmt.Errorf("devstack: start postgres: %w", err)
		}
	}
	sock := filepath.Join(dir, ".s.PGSQL."+strconv.Itoa(port))
	if len(sock) > pgMaxSocketPath {
		return nil, fmt.Errorf("devstack: start postgres: unix socket path %s is longer than %d bytes; use a shorter data dir", sock, pgMaxSocketPath)
	}

	logPath := filepath.Join(dir, pgLogFile)
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("devstack: start postgres: open log: %w", err)
	}
	logStart, err := logf.Seek(0, io.SeekEnd)
	if err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("devstack: start postgres: seek log: %w", err)
	}

	cmd := exec.Command(filepath.Join(bin, "postgres"),
		"-D", dir,
		"-p", strconv.Itoa(port),
		"-k", dir,
		"-c", "listen_addresses="+setup.Listen,
		// autovacuum looks once a minute, as by default: persist ANALYZEs
		// chatpipe's tables while they are young (looking every few
		// seconds instead cost a quarter of a per cent of a core forever).
	)
	for _, kv := range setup.Settings {
		cmd.Args = append(cmd.Args, "-c", kv)
	}
	cmd.Dir = dir
	cmd.Env = pgEnv()
	// *os.File outputs are handed to the child directly: no copying
	// goroutines, and the log keeps working even if we stop reading.
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Die with us. Note that Linux ties this to the thread that
		// forked, not the process; the Go runtime keeps its threads
		// alive, so in practice this means "with this process".
		Pdeathsig: syscall.SIGQUIT,
		// Own process group: a terminal's Ctrl-C reaches only us, and
		// Close decides how postgres shuts down.
		Setpgid:    true,
		Credential: cred,
	}
	err = cmd.Start()
	_ = logf.Close()
	if err != nil {
		return nil, fmt.Errorf("devstack: start postgres: %w", err)
	}

	p := &Postgres{
		dir:    dir,
		port:   port,
		setup:  setup,
		log:    log,
		cmd:    cmd,
		exited: make(chan struct{}),
	}
	// The reaper: owned by p, ends when the server exits, which Close
	// guarantees (and Pdeathsig guarantees if we die).
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()

	if err := p.waitReady(ctx); err != nil {
		// Close returns at once if the server already exited, and
		// otherwise stops the half-started server.
		_ = p.Close()
		if errors.Is(err, errPGExited) {
			tail := readLogTail(logPath, logStart)
			return nil, &pgStartError{
				dir:        dir,
				waitErr:    p.waitErr,
				logTail:    tail,
				bindFailed: strings.Contains(tail, "could not bind") || strings.Contains(tail, "Address already in use"),
				shmemInUse: strings.Contains(tail, "pre-existing shared memory block"),
			}
		}
		return nil, err
	}
	return p, nil
}

var errPGExited = errors.New("postgres exited")

// waitReady polls until the server accepts a connection, the server exits
// (errPGExited) or ctx is done.
func (p *Postgres) waitReady(ctx context.Context) error {
	const interval = 50 * time.Millisecond
	t := time.NewTimer(0)
	defer t.Stop()
	var lastErr error
	for {
		select {
		case <-p.exited:
			return errPGExited
		case <-ctx.Done():
			return fmt.Errorf("devstack: wait for postgres in %s to accept connections: %w (last error: %v)", p.dir, context.Cause(ctx), lastErr)
		case <-t.C:
		}
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(actx, p.urlFor("postgres"))
		cancel()
		if err == nil {
			_ = conn.Close(context.Background())
			return nil
		}
		lastErr = err
		t.Reset(interval)
	}
}

// ensureDatabase creates the setup's database (chatpipe) if it does not
// exist.
func (p *Postgres) ensureDatabase(ctx context.Context) error {
	db := p.setup.Database
	conn, err := pgx.Connect(ctx, p.urlFor("postgres"))
	if err != nil {
		return fmt.Errorf("devstack: connect to postgres: %w", err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", db).Scan(&exists); err != nil {
		return fmt.Errorf("devstack: check for database %s: %w", db, err)
	}
	if exists {
		return nil
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		return fmt.Errorf("devstack: create database %s: %w", db, err)
	}
	p.log.Info("created database", "database", db)
	return nil
}

// URL returns the connection URL of the setup's database; with
// StartPostgres's setup postgres://postgres@127.0.0.1:PORT/chatpipe?sslmode=disable.
func (p *Postgres) URL() string { return p.urlFor(p.setup.Database) }

// DatabaseURL returns the connection URL of another database of the same
// cluster (tests create databases with other collations beside chatpipe).
func (p *Postgres) DatabaseURL(db string) string { return p.urlFor(db) }

func (p *Postgres) urlFor(db string) string {
	user := url.User(p.setup.Superuser)
	if p.setup.Password != "" {
		user = url.UserPassword(p.setup.Superuser, p.setup.Password)
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     user,
		Host:     net.JoinHostPort(p.setup.Listen, strconv.Itoa(p.port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Close stops postgres with a fast shutdown (SIGINT) and waits for it to
// exit. If it has not exited after 30 s it sends SIGQUIT (immediate
// shutdown), and after 10 s more SIGKILL. It is safe to call more than once;
// later calls return the first call's result.
func (p *Postgres) Close() error {
	p.closeOnce.Do(func() { p.closeErr = p.stop() })
	return p.closeErr
}

func (p *Postgres) stop() error {
	select {
	case <-p.exited:
		return nil // already gone (crashed, or killed from outside)
	default:
	}
	steps := []struct {
		sig   syscall.Signal
		grace time.Duration
	}{
		{syscall.SIGINT, pgShutdownGrace},
		{syscall.SIGQUIT, pgKillGrace},
		{syscall.SIGKILL, pgKillGrace},
	}
	for i, s := range steps {
		if err := p.cmd.Process.Signal(s.sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("devstack: stop postgres in %s: send %v: %w", p.dir, s.sig, err)
		}
		t := time.NewTimer(s.grace)
		select {
		case <-p.exited:
			t.Stop()
			if i > 0 {
				return fmt.Errorf("devstack: stop postgres in %s: needed %v after fast shutdown timed out", p.dir, s.sig)
			}
			var ee *exec.ExitError
			if p.waitErr != nil && !errors.As(p.waitErr, &ee) {
				return fmt.Errorf("devstack: stop postgres in %s: %w", p.dir, p.waitErr)
			}
			if ee != nil && ee.ExitCode() != 0 {
				return fmt.Errorf("devstack: stop postgres in %s: exited with %w", p.dir, p.waitErr)
			}
			p.log.Debug("postgres stopped")
			return nil
		case <-t.C:
			p.log.Warn("postgres did not stop in time", "signal", s.sig.String(), "waited", s.grace)
		}
	}
	return fmt.Errorf("devstack: stop postgres in %s: pid %d did not exit even after SIGKILL", p.dir, p.cmd.Process.Pid)
}

// readLogTail returns what was appended to the log at path after offset
// from, capped to its last 4 KiB.
func readLogTail(path string, from int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer func() { _ = f.Close() }()
	const maxTail = 4 << 10
	if fi, err := f.Stat(); err == nil && fi.Size()-from > maxTail {
		from = fi.Size() - maxTail
	}
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	b, _ := io.ReadAll(io.LimitReader(f, maxTail))
	return strings.TrimSpace(string(b))
}
