package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestTwoGateways: a user's devices on two gateways (the dev process's and
// a separate `chatpipe gateway`) each receive every event of the user's
// conversations, including one that reconnects to the other gateway midway.
func TestTwoGateways(t *testing.T) {
	parallel(t)
	dev := startDev(t, t.TempDir())
	gateway := func(name string, args ...string) int {
		port := stacktest.FreePort(t)
		stacktest.StartProc(t, dev.Dir, name, nil, append([]string{"gateway", "--endpoints", filepath.Join(dev.Dir, "endpoints.json"),
			"--data-dir", dev.Dir, "--http", "127.0.0.1:" + strconv.Itoa(port), "--log-level", "warn"}, args...)...)
		stacktest.WaitFor(t, 60*time.Second, name+" to listen", func() bool { return stacktest.Dialable(port) })
		return port
	}
	port := gateway("gateway2")
	gw2 := fmt.Sprintf("ws://127.0.0.1:%d/v1/ws", port)
	noPages := gateway("gateway3", "--pages=false")
	opsPublic := gateway("gateway4", "--ops-public")
	for _, c := range []struct {
		method string
		port   int
		path   string
		want   int
	}{
		{"GET", port, "/ops/state", http.StatusNotFound}, // on the admin listener, not the public address
		{"GET", port, "/", http.StatusOK},
		{"GET", opsPublic, "/ops/state", http.StatusOK},
		{"POST", port, "/dev/token?user=mallory", http.StatusNotFound}, // only chatpipe dev mints tokens
		{"GET", noPages, "/ops/state", http.StatusNotFound},
		{"GET", noPages, "/", http.StatusNotFound},
		{"GET", noPages, "/readyz", http.StatusOK},
	} {
		req, _ := http.NewRequest(c.method, fmt.Sprintf("http://127.0.0.1:%d%s", c.port, c.path), nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s :%d%s: %d, want %d", c.method, c.port, c.path, resp.StatusCode, c.want)
		}
	}

	connect := func(user, name, url string) *device {
		d := newDevice(t, dev, user, name)
		d.url = url
		if err := d.connect(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.disconnect)
		return d
	}
	alice1 := connect("alice", "alice.gw1", "")
	alice2 := connect("alice", "alice.gw2", gw2)
	bob := connect("bob", "bob.gw2", gw2)
	if f, err := alice1.doRetrying(map[string]any{"op": "create", "conversation_id": "two-gw", "members": []string{"bob"}}); err != nil || f.Op != protocol.OpAccepted {
		t.Fatalf("create: %v %+v", err, f)
	}
	const n = 60
	var last int64
	for i := 0; i < n; i++ {
		if i == n/2 { // alice's second device moves from gw2 to gw1
			alice2.disconnect()
			alice2.url = ""
			if err := alice2.connect(); err != nil {
				t.Fatal(err)
			}
		}
		f, err := bob.doRetrying(map[string]any{"op": "send", "conversation_id": "two-gw", "client_message_id": fmt.Sprintf("b%d", i), "body": "hi"})
		if err != nil || f.Op != protocol.OpAccepted {
			t.Fatalf("send: %v %+v", err, f)
		}
		last = f.Seq
	}
	for _, d := range []*device{alice1, alice2, bob} {
		stacktest.WaitFor(t, 30*time.Second, d.name+" to hold every event", func() bool { return len(d.seqs("two-gw")) == int(last) })
	}
	if alice1.conns != 1 {
		t.Errorf("alice.gw1 reconnected: its events were not all pushed live")
	}
}
