package e2e

import (
	"fmt"
	"testing"

	"github.com/chatpipe/chatpipe/protocol"
)

// TestReadYourWrites: right after a session's create and send are
// accepted, that session's history, conversations and sync include them —
// without a client-side retry (the read model applies the log a little
// after the commit; the gateway waits for it). Without the wait, history a
// millisecond after create answers forbidden: the membership is not
// projected yet.
func TestReadYourWrites(t *testing.T) {
	parallel(t)
	dev := startDev(t, t.TempDir(), "--rate-user", "-1")
	alice := newDevice(t, dev, "alice", "alice.d0")
	if err := alice.connect(); err != nil {
		t.Fatal(err)
	}
	defer alice.disconnect()
	for i := range 20 {
		conv := fmt.Sprintf("ryw%02d", i)
		f, err := alice.doRetrying(map[string]any{"op": "create", "conversation_id": conv, "members": []string{"bob"},
			"client_message_id": conv + "-create"})
		if err != nil || f.Op != protocol.OpAccepted {
			t.Fatalf("create %s: %+v %v", conv, f, err)
		}
		f, err = alice.doRetrying(map[string]any{"op": "send", "conversation_id": conv, "client_message_id": conv + "-m1", "body": "hello"})
		if err != nil || f.Op != protocol.OpAccepted {
			t.Fatalf("send %s: %+v %v", conv, f, err)
		}
		sent := f.Seq
		// No retry: the first answer must have the message.
		f, err = alice.do(map[string]any{"op": "history", "conversation_id": conv})
		if err != nil {
			t.Fatal(err)
		}
		if f.Op != protocol.OpHistory || len(f.Events) == 0 || f.Events[len(f.Events)-1].Seq != sent {
			t.Fatalf("history of %s right after the send at seq %d: %+v", conv, sent, f)
		}
		f, err = alice.do(map[string]any{"op": "conversations"})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, c := range f.Conversations {
			if c.ConversationID == conv && c.LastSeq >= sent {
				found = true
			}
		}
		if f.Op != protocol.OpConversations || !found {
			t.Fatalf("conversations right after the send to %s at seq %d: %+v", conv, sent, f)
		}
	}
	// sync from nothing: every conversation through its last send.
	f, err := alice.do(map[string]any{"op": "sync", "cursors": map[string]int64{}})
	if err != nil {
		t.Fatal(err)
	}
	if f.Op != protocol.OpSynced {
		t.Fatalf("sync: %+v", f)
	}
	for i := range 20 {
		if conv := fmt.Sprintf("ryw%02d", i); f.Cursors[conv] < 2 {
			t.Errorf("sync cursor of %s = %d, want ≥ 2", conv, f.Cursors[conv])
		}
	}
}
