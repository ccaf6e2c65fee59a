package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/protocol"
)

// TestBatchSubprotocol: a device that asks for chatpipe.v1.batch at the
// upgrade gets server frames several to a message, newline-separated, and
// every event exactly once; one that asks for nothing still gets one frame
// per message.
func TestBatchSubprotocol(t *testing.T) {
	sharing(t, 30, 4)
	dev := startDev(t, t.TempDir(), "--rate-user", "-1", "--rate-conv", "-1")
	alice := dev.Dial(t, "alice")
	alice.Must(map[string]any{"op": "create", "conversation_id": "bt", "members": []string{"bob"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dial := func(sub []string) *websocket.Conn {
		c, _, err := websocket.Dial(ctx, dev.EP.WebSocket+"?token="+dev.Token(t, "bob"), &websocket.DialOptions{Subprotocols: sub})
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadLimit(1 << 20)
		t.Cleanup(func() { c.CloseNow() })
		return c
	}
	batched, plain := dial([]string{protocol.SubprotocolBatch}), dial(nil)
	if batched.Subprotocol() != protocol.SubprotocolBatch || plain.Subprotocol() != "" {
		t.Fatalf("subprotocols %q and %q", batched.Subprotocol(), plain.Subprotocol())
	}
	type got struct {
		seqs     map[int64]int
		messages int
	}
	read := func(c *websocket.Conn, split bool, n int, out chan<- got) {
		g := got{seqs: map[int64]int{}}
		for len(g.seqs) < n {
			_, b, err := c.Read(ctx)
			if err != nil {
				t.Errorf("read: %v", err)
				break
			}
			g.messages++
			frames := [][]byte{b}
			if split {
				frames = bytes.Split(b, []byte("\n"))
			}
			for _, f := range frames {
				var e protocol.Event
				if err := json.Unmarshal(f, &e); err != nil {
					t.Errorf("a frame that does not parse (split %v): %q", split, f)
					continue
				}
				if e.Op == protocol.OpEvent && e.ConversationID == "bt" && e.Kind == "message" {
					g.seqs[e.Seq]++
				}
			}
		}
		out <- g
	}
	const n = 300
	bc, pc := make(chan got, 1), make(chan got, 1)
	go read(batched, true, n, bc)
	go read(plain, false, n, pc)
	for i := 0; i < n; i++ {
		if _, err := alice.Do(map[string]any{"op": "send", "conversation_id": "bt", "client_message_id": fmt.Sprint("b", i), "body": "x"}); err != nil {
			t.Fatal(err)
		}
	}
	for name, ch := range map[string]chan got{"batched": bc, "plain": pc} {
		g := <-ch
		for seq, k := range g.seqs {
			if k != 1 {
				t.Errorf("%s: event seq %d arrived %d times", name, seq, k)
			}
		}
		if len(g.seqs) != n {
			t.Errorf("%s: %d of %d events", name, len(g.seqs), n)
		}
		t.Logf("%s: %d events in %d messages", name, len(g.seqs), g.messages)
	}
}
