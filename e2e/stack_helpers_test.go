// Shaping a test's stack: two workers sharing the vshards.

package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/stacktest"
)

// twoWorkers starts worker wa (with waEnv), waits until it owns every
// vshard, then starts wb and waits until they share them and both are
// ready.
func twoWorkers(t *testing.T, dev *devProc, waEnv ...string) (*proc, *proc) {
	t.Helper()
	return twoWorkersEnv(t, dev, waEnv, nil)
}

// twoWorkersEnv is twoWorkers with an environment for wb as well.
func twoWorkersEnv(t *testing.T, dev *devProc, waEnv, wbEnv []string) (*proc, *proc) {
	t.Helper()
	wa := dev.StartWorker(t, "wa", waEnv...)
	stacktest.WaitOwned(t, 120*time.Second, "wa to own every vshard", dev.EP, dev.EP.All(), "wa", dev.EP.All())
	wb := dev.StartWorker(t, "wb", wbEnv...)
	stacktest.WaitOwned(t, 120*time.Second, "wb to get its half", dev.EP, dev.EP.All(), "wb", dev.EP.All()/2)
	for _, id := range []string{"wa", "wb"} { // /readyz: registered and accepting for every vshard assigned
		url := strings.TrimSuffix(stacktest.AdminURL(t, dev.EP, id), "/metrics") + "/readyz"
		stacktest.WaitFor(t, 120*time.Second, id+" to be ready", func() bool {
			resp, err := http.Get(url)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
	return wa, wb
}
