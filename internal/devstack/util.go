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

// FreePorts returns n distinct free TCP ports on 127.0.0.1: each is held
// bound until all are found (FreePort called n times may return one port
// twice, as the kernel hands a just-closed port out again). The caveat of
// FreePort applies to each.
func FreePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("devstack: find free ports: %w", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
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
