package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/protocol"
)

// TestEvictedStateReloads runs writers with a one-conversation cache over
// two vshards, so conversations are evicted and reloaded from Postgres all
// the time: seqs, membership and dedupe must come back intact.
func TestEvictedStateReloads(t *testing.T) {
	sharing(t, 20, 5)
	dev := startDev(t, t.TempDir(), "--vshards", "2", "--partitions", "2", "--cache-convs", "1", "--rate-user", "-1", "--rate-conv", "-1")
	alice, bob := dev.Dial(t, "alice"), dev.Dial(t, "bob")
	const n = 20
	for k := 0; k < n; k++ {
		alice.Must(map[string]any{"op": "create", "conversation_id": fmt.Sprintf("e%d", k), "members": []string{"bob"}})
	}
	var accepted []acceptedMsg
	for round := 0; round < 5; round++ {
		for k := 0; k < n; k++ {
			conv, cmid := fmt.Sprintf("e%d", k), fmt.Sprintf("r%d", round)
			sent := time.Now()
			r, err := bob.SendRetrying(conv, cmid, "x")
			if err != nil || r.Op != protocol.OpAccepted {
				t.Fatalf("send %s/%s: %+v %v", conv, cmid, r, err)
			}
			accepted = append(accepted, acceptedMsg{Conv: conv, ClientMessageID: cmid, MessageID: r.MessageID, Sender: "bob", Seq: r.Seq, SentAt: sent, AcceptedAt: time.Now()})
		}
		time.Sleep(300 * time.Millisecond) // let persist catch up so eviction can happen
	}
	// retries of early messages: their dedupe entries now come from Postgres
	for _, a := range accepted[:n] {
		r, err := bob.SendRetrying(a.Conv, a.ClientMessageID, "again")
		if err != nil || r.Seq != a.Seq || r.MessageID != a.MessageID {
			t.Errorf("retry of %s/%s after eviction: %+v %v, first seq %d", a.Conv, a.ClientMessageID, r, err, a.Seq)
		}
	}
	// membership reloads too: kick bob everywhere, then his sends are forbidden
	for k := 0; k < n; k++ {
		alice.Must(map[string]any{"op": "kick", "conversation_id": fmt.Sprintf("e%d", k), "user_id": "bob"})
	}
	time.Sleep(500 * time.Millisecond)
	for k := 0; k < n; k++ {
		if r, _ := bob.Do(map[string]any{"op": "send", "conversation_id": fmt.Sprintf("e%d", k), "client_message_id": "late", "body": "x"}); r == nil || r.Code != protocol.CodeForbidden {
			t.Errorf("send after kick in e%d: %+v", k, r)
		}
	}
	checkWorld(t, dev.EP, accepted)
}
