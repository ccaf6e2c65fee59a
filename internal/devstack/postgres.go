package devstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// pgDatabase is the database StartPostgres makes sure exists.
	pgDatabase = "chatpipe"
	// pgSuperuser is the bootstrap superuser initdb creates.
	pgSuperuser = "postgres"
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

// Postgres is a private PostgreSQL cluster created with the machine's
// PostgreSQL binaries and run as a child process of this one.
//
// The server is started with Pdeathsig set, so the kernel sends it SIGQUIT
// (immediate shutdown) if this process dies without calling Close. Stop it
// with Close.
type Postgres struct {
	dir  string
	port int
	log  *slog.Logger

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
	log = orDefault(log).With("component", "postgres")
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
	if err := initPGCluster(ctx, bin, dir, cred, log); err != nil {
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
		p, err := startPGOnce(ctx, bin, dir, port, cred, log)
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
func startPGOnce(ctx context.Context, bin, dir string, port int, cred *syscall.Credential, log *slog.Logger) (*Postgres, error) {
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
		"-c", "listen_addresses=127.0.0.1",
		// A fresh database has no statistics: until autovacuum's first
		// ANALYZE the planner may scan whole tables for the writers' and the
		// read side's lookups. Look every 5 s instead of every minute.
		"-c", "autovacuum_naptime=5s",
	)
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

// ensureDatabase creates the chatpipe database if it does not exist.
func (p *Postgres) ensureDatabase(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, p.urlFor("postgres"))
	if err != nil {
		return fmt.Errorf("devstack: connect to postgres: %w", err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", pgDatabase).Scan(&exists); err != nil {
		return fmt.Errorf("devstack: check for database %s: %w", pgDatabase, err)
	}
	if exists {
		return nil
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{pgDatabase}.Sanitize()); err != nil {
		return fmt.Errorf("devstack: create database %s: %w", pgDatabase, err)
	}
	p.log.Info("created database", "database", pgDatabase)
	return nil
}

// URL returns the connection URL of the chatpipe database:
// postgres://postgres@127.0.0.1:PORT/chatpipe?sslmode=disable.
func (p *Postgres) URL() string { return p.urlFor(pgDatabase) }

// DatabaseURL returns the connection URL of another database of the same
// cluster (tests create databases with other collations beside chatpipe).
func (p *Postgres) DatabaseURL(db string) string { return p.urlFor(db) }

func (p *Postgres) urlFor(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(pgSuperuser),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)),
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

// pgEnv is the environment for initdb and postgres: ours minus libpq and
// locale variables that would change how the cluster is set up.
func pgEnv() []string {
	env := make([]string, 0, len(os.Environ())+1)
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PG") || strings.HasPrefix(k, "LC_") || k == "LANG" || k == "LANGUAGE" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C")
}

// pgBinDir finds the directory holding initdb and postgres.
func pgBinDir(ctx context.Context) (string, error) {
	if d := os.Getenv("CHATPIPE_PG_BIN"); d != "" {
		if !isExecutable(filepath.Join(d, "postgres")) {
			return "", fmt.Errorf("devstack: CHATPIPE_PG_BIN=%s has no postgres binary", d)
		}
		return d, nil
	}
	if cands, _ := filepath.Glob("/usr/lib/postgresql/*/bin"); len(cands) > 0 {
		slices.SortFunc(cands, func(a, b string) int {
			return compareVersions(filepath.Base(filepath.Dir(b)), filepath.Base(filepath.Dir(a)))
		})
		for _, d := range cands {
			if isExecutable(filepath.Join(d, "postgres")) && isExecutable(filepath.Join(d, "initdb")) {
				return d, nil
			}
		}
	}
	out, err := exec.CommandContext(ctx, "pg_config", "--bindir").Output()
	if err != nil {
		return "", fmt.Errorf("devstack: no PostgreSQL binaries found (set CHATPIPE_PG_BIN, install postgresql, or put pg_config on PATH): pg_config --bindir: %w", err)
	}
	d := strings.TrimSpace(string(out))
	if !isExecutable(filepath.Join(d, "postgres")) {
		return "", fmt.Errorf("devstack: pg_config --bindir says %s, which has no postgres binary", d)
	}
	return d, nil
}

// compareVersions compares dotted numeric versions like "9.6" and "15".
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(as), len(bs)); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x - y
		}
	}
	return strings.Compare(a, b)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// pgCredential returns the credential to run initdb and postgres with: nil
// when we are not root, else the postgres OS user's.
func pgCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(pgOSUser)
	if err != nil {
		return nil, fmt.Errorf("devstack: running as root, so postgres must run as OS user %q: %w", pgOSUser, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("devstack: uid of OS user %q: %w", pgOSUser, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("devstack: gid of OS user %q: %w", pgOSUser, err)
	}
	// An empty (non-nil) Groups drops root's supplementary groups.
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// preparePGDir creates dir and, when postgres runs as another user, hands it
// to that user and makes sure the user can reach it.
func preparePGDir(dir string, cred *syscall.Credential, log *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("devstack: create postgres data dir: %w", err)
	}
	if cred == nil {
		return nil
	}
	for a := filepath.Dir(dir); ; a = filepath.Dir(a) {
		if err := ensureTraversable(a, cred, log); err != nil {
			return err
		}
		if a == filepath.Dir(a) {
			break
		}
	}
	if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
		return fmt.Errorf("devstack: chown postgres data dir to %s: %w", pgOSUser, err)
	}
	return nil
}

// ensureTraversable adds execute permission to directory d for the class
// (owner, group or other) that cred's user falls into, if missing.
func ensureTraversable(d string, cred *syscall.Credential, log *slog.Logger) error {
	fi, err := os.Stat(d)
	if err != nil {
		return fmt.Errorf("devstack: stat %s: %w", d, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("devstack: stat %s: no unix owner information", d)
	}
	mode := fi.Mode().Perm()
	var bit fs.FileMode
	switch {
	case st.Uid == cred.Uid:
		bit = 0o100
	case st.Gid == cred.Gid:
		bit = 0o010
	default:
		bit = 0o001
	}
	if mode&bit != 0 {
		return nil
	}
	// Keep setgid/sticky bits (e.g. /tmp's) when adding the x bit.
	full := fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	if err := os.Chmod(d, full|bit); err != nil {
		return fmt.Errorf("devstack: make %s traversable for OS user %s: %w", d, pgOSUser, err)
	}
	log.Info("made ancestor of postgres data dir traversable", "dir", d, "old_mode", mode, "new_mode", mode|bit)
	return nil
}

// chownTree gives every file under dir that is not yet owned by cred's user
// to that user (files root left behind would otherwise make postgres fail).
func chownTree(dir string, cred *syscall.Credential) error {
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // postgres files can vanish while we walk
			}
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == cred.Uid && st.Gid == cred.Gid {
			return nil
		}
		if err := os.Lchown(path, int(cred.Uid), int(cred.Gid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("devstack: chown postgres data dir to %s: %w", pgOSUser, err)
	}
	return nil
}

// initPGCluster runs initdb in dir unless dir already holds a cluster.
func initPGCluster(ctx context.Context, bin, dir string, cred *syscall.Credential, log *slog.Logger) error {
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("devstack: check postgres data dir: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("devstack: read postgres data dir: %w", err)
	}
	if len(entries) > 0 {
		names := make([]string, 0, 5)
		for _, e := range entries[:min(len(entries), 5)] {
			names = append(names, e.Name())
		}
		return fmt.Errorf("devstack: postgres data dir %s is not empty but holds no cluster (no PG_VERSION; found %s); remove it or use an empty dir", dir, strings.Join(names, ", "))
	}
	if tpl := os.Getenv(pgTemplateEnv); tpl != "" {
		if _, err := os.Stat(filepath.Join(tpl, "PG_VERSION")); err != nil {
			return fmt.Errorf("devstack: %s=%s holds no cluster: %w", pgTemplateEnv, tpl, err)
		}
		log.Debug("copying postgres cluster template", "dir", dir, "template", tpl)
		return copyTree(tpl, dir)
	}
	return runInitdb(ctx, bin, dir, cred, log)
}

// pgTemplateEnv names a directory holding a cluster made by
// PreparePGTemplate (tests set it): a new cluster is a copy of it, in a
// tenth of initdb's time.
const pgTemplateEnv = "CHATPIPE_PG_TEMPLATE"

// PreparePGTemplate initializes a cluster in the empty directory dir, as
// StartPostgres would, for CHATPIPE_PG_TEMPLATE: the end-to-end tests
// start dozens of dev stacks, and copying a cluster costs a fraction of
// initdb. The cluster holds the chatpipe database already: its CREATE
// DATABASE (a checkpoint) was about a second of each stack's start. The
// schema is left to the stack, whose migrations take some 70 ms there.
func PreparePGTemplate(ctx context.Context, dir string, log *slog.Logger) error {
	startLog := log
	log = orDefault(log).With("component", "postgres")
	dir, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("devstack: postgres template: %w", err)
	}
	bin, err := pgBinDir(ctx)
	if err != nil {
		return err
	}
	cred, err := pgCredential()
	if err != nil {
		return err
	}
	if err := preparePGDir(dir, cred, log); err != nil {
		return err
	}
	if err := runInitdb(ctx, bin, dir, cred, log); err != nil {
		return err
	}
	p, err := StartPostgres(ctx, dir, 0, startLog) // creates the database
	if err != nil {
		return fmt.Errorf("devstack: postgres template: %w", err)
	}
	if err := p.Close(); err != nil {
		return fmt.Errorf("devstack: postgres template: %w", err)
	}
	// Each copy starts its own log.
	if err := os.Remove(filepath.Join(dir, pgLogFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("devstack: postgres template: %w", err)
	}
	return nil
}

// copyTree copies the directories and regular files under src into dst,
// with their modes (chownTree gives them to the server's user after).
func copyTree(src, dst string) error {
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if rel == "." {
				return nil
			}
			return os.Mkdir(to, info.Mode().Perm())
		case info.Mode().IsRegular():
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(to, b, info.Mode().Perm())
		}
		return fmt.Errorf("%s is neither a directory nor a regular file", path)
	})
	if err != nil {
		return fmt.Errorf("devstack: copy postgres cluster template into %s: %w", dst, err)
	}
	return nil
}

// runInitdb runs initdb in the empty directory dir.
func runInitdb(ctx context.Context, bin, dir string, cred *syscall.Credential, log *slog.Logger) error {
	log.Info("initializing postgres cluster", "dir", dir, "bin", bin)
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"-D", dir,
		"--auth=trust",
		"-U", pgSuperuser,
		"--encoding=UTF8",
		"--locale=C",
	)
	cmd.Dir = dir
	cmd.Env = pgEnv()
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("devstack: initdb %s: %w; output:\n%s", dir, err, strings.TrimSpace(out.String()))
	}
	log.Debug("initdb done", "output", out.String())
	return nil
}

// clearStalePGLocks deals with the lock files (postmaster.pid and the socket
// lock files) a previous server in dir may have left behind.
//
//   - If the postmaster they name is still running in dir, that is an error.
//   - If the postmaster is gone but some of its children still run in dir
//     (they exit soon after noticing their parent died), it waits for them,
//     bounded by ctx: a new server must not start next to them.
//   - A lock file naming a process that is gone is left alone: postgres
//     recognizes it as stale itself (and checks its recorded shared memory
//     key on the way).
//   - A lock file naming some unrelated live process that reused the pid is
//     removed: postgres only checks that the pid is alive, so it would
//     refuse to start otherwise. No postgres process uses dir at that point.
func clearStalePGLocks(ctx context.Context, dir string, log *slog.Logger) error {
	pidFile := filepath.Join(dir, "postmaster.pid")
	pid, ok, err := readLockPID(pidFile)
	if err != nil || !ok {
		return err
	}
	if postgresRunningIn(pid, dir) {
		return fmt.Errorf("devstack: a postgres from a previous run (pid %d) is still running in %s; stop it (kill -INT %d) or wait for it to exit", pid, dir, pid)
	}
	if err := waitPGOrphans(ctx, dir, log); err != nil {
		return err
	}
	locks, _ := filepath.Glob(filepath.Join(dir, ".s.PGSQL.*.lock"))
	for _, lf := range append([]string{pidFile}, locks...) {
		pid, ok, err := readLockPID(lf)
		if err != nil {
			return err
		}
		if !ok || !processExists(pid) {
			continue
		}
		if err := os.Remove(lf); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("devstack: remove stale %s: %w", lf, err)
		}
		log.Info("removed stale postgres lock file naming an unrelated process", "file", lf, "pid", pid)
	}
	return nil
}

// readLockPID returns the pid on the first line of a postgres lock file; ok
// is false if the file does not exist or its first line is not a pid.
func readLockPID(path string) (pid int, ok bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("devstack: read %s: %w", path, err)
	}
	first, _, _ := strings.Cut(string(data), "\n")
	pid, err = strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0, false, nil
	}
	return pid, true, nil
}

// processExists reports whether a process with this pid exists.
func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// waitPGOrphans waits until no postgres process runs in dir any more.
func waitPGOrphans(ctx context.Context, dir string, log *slog.Logger) error {
	logged := false
	for {
		pids := postgresProcsIn(dir)
		if len(pids) == 0 {
			return nil
		}
		if !logged {
			log.Info("waiting for leftover postgres processes of a previous run to exit", "pids", pids)
			logged = true
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("devstack: postgres processes %v of a previous run still use %s: %w", pids, dir, context.Cause(ctx))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// postgresProcsIn lists the live postgres processes whose working directory
// is dir (processes we may not inspect are skipped).
func postgresProcsIn(dir string) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if isPostgresIn(pid, dir, false) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// postgresRunningIn reports whether pid is a live (non-zombie) postgres
// process whose working directory is dir; postgres chdirs into its data
// directory. When we cannot tell, it answers true, to be safe.
func postgresRunningIn(pid int, dir string) bool {
	return isPostgresIn(pid, dir, true)
}

// isPostgresIn reports whether pid is a live (non-zombie) postgres process
// whose working directory is dir. unknown is the answer when /proc exists
// for pid but cannot be read.
func isPostgresIn(pid int, dir string, unknown bool) bool {
	proc := "/proc/" + strconv.Itoa(pid)
	stat, err := os.ReadFile(proc + "/stat")
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return false
	}
	if err != nil {
		return unknown
	}
	// Format: pid (comm) state ...; comm may contain spaces and parens.
	open, end := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
	if open < 0 || end < open || end+2 >= len(stat) {
		return unknown
	}
	if state := stat[end+2]; state == 'Z' || state == 'X' {
		return false
	}
	// Postmaster and children all start as "postgres"; children retitle
	// their command line, not their comm.
	if comm := string(stat[open+1 : end]); comm != "postgres" && comm != "postmaster" {
		return false
	}
	cwd, err := os.Readlink(proc + "/cwd")
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return false
	}
	if err != nil {
		return unknown
	}
	return filepath.Clean(cwd) == filepath.Clean(dir)
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
