package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// `chatpipe kafka` with its defaults makes the topic `chatpipe dev --kafka`
// needs with its defaults: dev comes up on that broker.
func TestDevOnDefaultKafka(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	port := freePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	k := startProc(t, dir, "kafka", nil, "kafka", "--data-dir", filepath.Join(dir, "broker"), "--port", strconv.Itoa(port), "--log-level", "warn")
	// It prints its address once the topic is made: dev must not be the
	// one to make it.
	waitFor(t, 30*time.Second, "the broker to make its topic", func() bool {
		b, _ := os.ReadFile(k.log)
		return strings.Contains(string(b), addr+"\n")
	})
	dev := startDev(t, dir, "--kafka", addr)
	select {
	case <-k.done:
		t.Fatalf("chatpipe kafka exited; log:\n%s", tail(k.log))
	default:
	}
	if out := runCLI(t, dev, "alice", "create dk-1 bob\nquit\n"); !strings.Contains(out, "accepted create dk-1 seq 1") {
		t.Errorf("create on dev over chatpipe kafka was not accepted:\n%s", out)
	}
}
