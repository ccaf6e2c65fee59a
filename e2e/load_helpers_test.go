// The load the fault tests run: users sending to shared conversations, each accepted send recorded.

package e2e

import (
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/stacktest"
)

// underLoad starts load on dev, runs fault after some sends were accepted,
// keeps the load going until more were accepted after the fault, and
// checks the world.
func underLoad(t *testing.T, dev *devProc, fault func()) {
	t.Helper()
	load := stacktest.StartLoad(t, dev.Dev, 10, 20)
	load.WaitAbove(t, 60*time.Second, "load to flow", 200)
	fault()
	n := load.Count()
	load.WaitAbove(t, 120*time.Second, "load to go on after the fault", n+300)
	accepted := load.Finish()
	t.Logf("%d sends accepted", len(accepted))
	checkWorld(t, dev.EP, accepted)
}
