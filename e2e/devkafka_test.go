package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/stacktest"
)

// `chatpipe kafka` with its defaults makes the topic `chatpipe dev --kafka`
// needs with its defaults: dev comes up on that broker.
func TestDevOnDefaultKafka(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	port := stacktest.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	k := stacktest.StartProc(t, dir, "kafka", nil, "kafka", "--data-dir", filepath.Join(dir, "broker"), "--port", strconv.Itoa(port), "--log-level", "warn")
	// It prints its address once the topic is made: dev must not be the
	// one to make it.
	stacktest.WaitFor(t, 30*time.Second, "the broker to make its topic", func() bool {
		b, _ := os.ReadFile(k.Log)
		return strings.Contains(string(b), addr+"\n")
	})
	dev := startDev(t, dir, "--kafka", addr)
	select {
	case <-k.Done():
		t.Fatalf("chatpipe kafka exited; log:\n%s", stacktest.Tail(k.Log))
	default:
	}
	if out := runCLI(t, dev, "alice", "create dk-1 bob\nquit\n"); !strings.Contains(out, "accepted create dk-1 seq 1") {
		t.Errorf("create on dev over chatpipe kafka was not accepted:\n%s", out)
	}
}
