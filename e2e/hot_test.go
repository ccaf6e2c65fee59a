package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/lease"
)

// hotOut is what `chatpipe admin hot --json` prints.
type hotOut struct {
	Conversations []struct {
		Conversation string  `json:"conversation"`
		VShard       int     `json:"vshard"`
		PerSecond    float64 `json:"per_second"`
		Isolated     bool    `json:"isolated"`
	} `json:"conversations"`
}

// TestAdminHot: the writers count what they commit; `chatpipe admin hot`
// lists the busiest conversation first, and marks it isolated once an
// override routes it to a dedicated vshard, where its new events are then
// counted.
func TestAdminHot(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	dev := startDev(t, dir)
	if dev.EP.Dedicated == 0 {
		t.Fatal("chatpipe dev has no dedicated vshards")
	}
	cl := dev.Dial(t, "hot-user")
	cl.Must(map[string]any{"op": "create", "conversation_id": "hot-conv", "members": []string{}})
	cl.Must(map[string]any{"op": "create", "conversation_id": "cold-conv", "members": []string{}})
	for i := 0; i < 40; i++ {
		cl.Must(map[string]any{"op": "send", "conversation_id": "hot-conv", "client_message_id": fmt.Sprintf("h%d", i), "body": "x"})
	}
	cl.Must(map[string]any{"op": "send", "conversation_id": "cold-conv", "client_message_id": "c0", "body": "x"})

	hot := func() hotOut {
		t.Helper()
		out, err := exec.Command(binary, "admin", "hot", "--endpoints", filepath.Join(dir, "endpoints.json"), "--json", "--top", "5").Output()
		if err != nil {
			t.Fatalf("admin hot: %v\n%s", err, out)
		}
		var h hotOut
		if err := json.Unmarshal(out, &h); err != nil {
			t.Fatalf("admin hot --json: %v\n%s", err, out)
		}
		return h
	}
	h := hot()
	if len(h.Conversations) < 2 || h.Conversations[0].Conversation != "hot-conv" || h.Conversations[0].PerSecond <= 0 || h.Conversations[0].Isolated {
		t.Fatalf("admin hot: %+v, want hot-conv first, not isolated", h)
	}
	resp, err := http.Get(dev.EP.Admin + "/debug/hot?n=1")
	if err != nil {
		t.Fatal(err)
	}
	var direct hotOut
	err = json.NewDecoder(resp.Body).Decode(&direct)
	resp.Body.Close()
	if err != nil || len(direct.Conversations) != 1 || direct.Conversations[0].Conversation != "hot-conv" {
		t.Fatalf("GET /debug/hot?n=1: %v %+v", err, direct)
	}

	// Route it to the first dedicated vshard, as `admin isolate` does.
	cli := stacktest.EtcdClient(t, dev.EP)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	to := dev.EP.VShards
	if ok, err := lease.SetOverride(ctx, cli, lease.DefaultPrefix, "hot-conv", to, 0, time.Now()); err != nil || !ok {
		t.Fatalf("set override: %v %v", ok, err)
	}
	for i := 0; i < 20; i++ {
		cl.Must(map[string]any{"op": "send", "conversation_id": "hot-conv", "client_message_id": fmt.Sprintf("i%d", i), "body": "x"})
	}
	h = hot()
	var before, after bool
	for _, c := range h.Conversations {
		if c.Conversation != "hot-conv" {
			continue
		}
		if !c.Isolated {
			t.Errorf("hot-conv not marked isolated: %+v", c)
		}
		before = before || c.VShard != to
		after = after || c.VShard == to
	}
	if !before || !after {
		t.Errorf("admin hot after the move: %+v, want hot-conv in its hashed vshard and in vshard %d", h, to)
	}
	table, err := exec.Command(binary, "admin", "hot", "--endpoints", filepath.Join(dir, "endpoints.json")).Output()
	if err != nil || !strings.Contains(string(table), "CONVERSATION") || !strings.Contains(string(table), fmt.Sprintf("yes (vshard %d)", to)) {
		t.Errorf("admin hot table: %v\n%s", err, table)
	}
}
