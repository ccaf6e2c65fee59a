package devstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// What a previous server in the data dir left behind: its lock files, and
// processes still running there.

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
