package e2e

import (
	"testing"
	"time"
)

// TestAddWorkerUnderLoad adds a third worker while clients send: shards move
// to it by hand-off and no message is lost. Then the worker
// shuts down gracefully: it revokes its lease on the way out, so its
// vshards move without waiting for the TTL.
func TestAddWorkerUnderLoad(t *testing.T) {
	dev := startDev(t, t.TempDir(), "--workers", "0")
	twoWorkers(t, dev)
	var wc *proc
	underLoad(t, dev, func() {
		wc = dev.startWorker(t, "wc")
		waitFor(t, 120*time.Second, "wc to get a third", func() bool {
			return ownedBy(etcdView(t, dev.ep), dev.ep.all(), "wc") >= dev.ep.all()/3
		})
	})
	wc.stop()
	if _, ok := etcdView(t, dev.ep).Workers["wc"]; ok {
		t.Error("wc exited gracefully but its lease is still alive: it did not hand its shards off")
	}
	waitFor(t, 30*time.Second, "wc's vshards to move", func() bool {
		v := etcdView(t, dev.ep)
		return ownedBy(v, dev.ep.all(), "wa")+ownedBy(v, dev.ep.all(), "wb") == dev.ep.all()
	})
}
