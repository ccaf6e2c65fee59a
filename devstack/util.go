package devstack

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// FreePort returns a free TCP port on 127.0.0.1.
//
// The port is found by binding 127.0.0.1:0 and closing the listener again, so
// another process may grab it before the caller binds it; callers that can
// retry on "address already in use" should.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("devstack: find free port: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		return 0, fmt.Errorf("devstack: find free port: close listener: %w", err)
	}
	return port, nil
}

// portFree reports whether 127.0.0.1:port can be bound right now.
func portFree(port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = ln.Close()
	return true
}

// isAddrInUse reports whether err is (or wraps) EADDRINUSE.
func isAddrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE)
}

// orDefault returns log, or slog.Default() when log is nil.
func orDefault(log *slog.Logger) *slog.Logger {
	if log == nil {
		return slog.Default()
	}
	return log
}

// lockDir takes an exclusive, non-blocking flock on dir/name and returns the
// open file holding it. Closing the file releases the lock. flock locks belong
// to the open file description, so a second lockDir on the same path fails
// even inside the same process.
func lockDir(dir, name, what string) (*os.File, error) {
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("devstack: open %s lock file: %w", what, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("devstack: %s data dir %s is already in use by another running instance", what, dir)
		}
		return nil, fmt.Errorf("devstack: lock %s: %w", path, err)
	}
	return f, nil
}

// writeJSONAtomic writes v as JSON to path by writing a temporary file in the
// same directory, syncing it, and renaming it over path, then syncing the
// directory, so readers see either the old or the new contents.
func writeJSONAtomic(path string, v any) (err error) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("devstack: encode %s: %w", path, err)
	}
	data = append(data, '\n')
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("devstack: write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return fmt.Errorf("devstack: write %s: %w", tmp.Name(), err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("devstack: sync %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("devstack: close %s: %w", tmp.Name(), err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("devstack: rename %s to %s: %w", tmp.Name(), path, err)
	}
	// Make the rename itself durable; failure here is not worth failing for.
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// readJSON decodes the JSON file at path into v. A missing file is reported
// with found == false and no error.
func readJSON(path string, v any) (found bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("devstack: read %s: %w", path, err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return false, fmt.Errorf("devstack: decode %s: %w", path, err)
	}
	return true, nil
}
