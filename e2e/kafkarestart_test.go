package e2e

import (
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/stacktest"
)

// TestKafkaRestartUnderLoad stops the broker gracefully and starts it again
// on the same data dir and port while clients send.
func TestKafkaRestartUnderLoad(t *testing.T) {
	sharing(t, 15, 12)
	dir := t.TempDir()
	port := stacktest.FreePort(t)
	kdir := filepath.Join(dir, "broker")
	args := []string{"kafka", "--data-dir", kdir, "--port", strconv.Itoa(port), "--partitions", "10", "--log-level", "warn"} // dev's 8 hashed partitions and its 2 dedicated vshards' own
	k := stacktest.StartProc(t, dir, "kafka1", nil, args...)
	stacktest.WaitFor(t, 30*time.Second, "the broker to listen", func() bool { return stacktest.Dialable(port) })
	dev := startDev(t, dir, "--kafka", fmt.Sprintf("127.0.0.1:%d", port))
	underLoad(t, dev, func() {
		k.Stop()
		k = stacktest.StartProc(t, dir, "kafka2", nil, args...)
		stacktest.WaitFor(t, 30*time.Second, "the broker to listen again", func() bool { return stacktest.Dialable(port) })
	})
}
