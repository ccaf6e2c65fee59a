package e2e

import (
	"fmt"
	"testing"
	"time"
)

// TestRestartKeepsData stops `chatpipe dev` and starts it again on the same
// data dir: nothing is lost, seqs continue, and a retry of a message sent
// before the restart gets its first answer.
func TestRestartKeepsData(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	dev := startDev(t, dir)
	alice := dev.Dial(t, "alice")
	alice.Must(map[string]any{"op": "create", "conversation_id": "room", "members": []string{"bob"}})
	var accepted []acceptedMsg
	send := func(cl *client, i int) {
		sent := time.Now()
		r, err := cl.SendRetrying("room", fmt.Sprintf("m%d", i), fmt.Sprintf("msg %d", i))
		if err != nil || r.Op != "accepted" {
			t.Fatalf("send m%d: %+v %v", i, r, err)
		}
		accepted = append(accepted, acceptedMsg{Conv: "room", ClientMessageID: fmt.Sprintf("m%d", i), MessageID: r.MessageID, Sender: cl.User, Seq: r.Seq, SentAt: sent, AcceptedAt: time.Now()})
	}
	for i := 0; i < 5; i++ {
		send(alice, i)
	}
	dev.Stop()

	dev = startDev(t, dir)
	alice = dev.Dial(t, "alice")
	r, err := alice.SendRetrying("room", "m2", "again")
	if err != nil || r.Seq != accepted[2].Seq || r.MessageID != accepted[2].MessageID {
		t.Fatalf("retry after restart: %+v %v, first %+v", r, err, accepted[2])
	}
	for i := 5; i < 10; i++ {
		send(alice, i)
	}
	if accepted[5].Seq <= accepted[4].Seq {
		t.Fatalf("seq went back after restart: %d then %d", accepted[4].Seq, accepted[5].Seq)
	}
	// bob is still a member: membership survived too
	bob := dev.Dial(t, "bob")
	send(bob, 10)
	checkWorld(t, dev.EP, accepted)
}
