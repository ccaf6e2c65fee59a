package devstack

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// FreePort returns a free TCP port on 127.0.0.1, taken below the kernel's
// ephemeral range (where nothing is handed out for a connect or a listen
// on port 0), each call the next one of the 12,000 there. A port found by
// binding port 0 and closing it again is free to be handed to any
// connection before the caller binds it, which several stacks on one
// machine make likely. Another process may still bind it first;
// callers that can retry on "address already in use" should.
func FreePort() (int, error) {
	lo, hi := portRange()
	for range hi - lo {
		p := lo + int(nextPort.Add(1)-1)%(hi-lo)
		if portFree(p) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("devstack: no free port in %d–%d", lo, hi-1)
}

// FreePorts returns n distinct free TCP ports on 127.0.0.1 (FreePort's,
// which never hands out one port twice in a row of fewer than 12,000). The
// caveat of FreePort applies to each.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		ports = append(ports, p)
	}
	return ports, nil
}

// nextPort counts the ports FreePort handed out, from a random start (so
// that processes started one after the other begin apart).
var nextPort = func() *atomic.Int64 {
	var n atomic.Int64
	n.Store(rand.Int64N(10_000))
	return &n
}()

// portRange is where FreePort takes ports: the 12,000 below the ephemeral
// range's first port (/proc/sys/net/ipv4/ip_local_port_range; 32768 if it
// cannot be read), and never below 1024.
var portRange = sync.OnceValues(func() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 2048 {
				hi = v
			}
		}
	}
	return max(1024, hi-12_000), hi
})

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
