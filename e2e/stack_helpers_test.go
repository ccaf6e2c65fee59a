// Shaping a test's stack: two workers sharing the vshards, free ports, whether a port listens.

package e2e

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/devstack"
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
	wa := dev.startWorker(t, "wa", waEnv...)
	waitOwned(t, 120*time.Second, "wa to own every vshard", dev.ep, dev.ep.all(), "wa", dev.ep.all())
	wb := dev.startWorker(t, "wb", wbEnv...)
	waitOwned(t, 120*time.Second, "wb to get its half", dev.ep, dev.ep.all(), "wb", dev.ep.all()/2)
	for _, id := range []string{"wa", "wb"} { // /readyz: registered and accepting for every vshard assigned
		url := strings.TrimSuffix(adminURL(t, dev.ep, id), "/metrics") + "/readyz"
		waitFor(t, 120*time.Second, id+" to be ready", func() bool {
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

// freePort returns a port on 127.0.0.1 for a process a test starts (a
// worker's --listen, an etcd member, an admin address): devstack.FreePort's,
// below the kernel's ephemeral range.
func freePort(t *testing.T) int {
	t.Helper()
	p, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func dialable(port int) bool {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
