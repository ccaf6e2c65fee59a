package e2e

import (
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/stacktest"
)

// TestAddWorkerUnderLoad adds a third worker while clients send: shards move
// to it by hand-off and no message is lost. Then the worker
// shuts down gracefully: it revokes its lease on the way out, so its
// vshards move without waiting for the TTL.
func TestAddWorkerUnderLoad(t *testing.T) {
	sharing(t, 25, 8)
	dev := startDev(t, t.TempDir(), "--workers", "0")
	twoWorkers(t, dev)
	var wc *proc
	underLoad(t, dev, func() {
		wc = dev.StartWorker(t, "wc")
		stacktest.WaitFor(t, 120*time.Second, "wc to get a third", func() bool {
			return stacktest.OwnedBy(stacktest.EtcdView(t, dev.EP), dev.EP.All(), "wc") >= dev.EP.All()/3
		})
	})
	wc.Stop()
	if _, ok := stacktest.EtcdView(t, dev.EP).Workers["wc"]; ok {
		t.Error("wc exited gracefully but its lease is still alive: it did not hand its shards off")
	}
	stacktest.WaitFor(t, 30*time.Second, "wc's vshards to move", func() bool {
		v := stacktest.EtcdView(t, dev.EP)
		return stacktest.OwnedBy(v, dev.EP.All(), "wa")+stacktest.OwnedBy(v, dev.EP.All(), "wb") == dev.EP.All()
	})
}
