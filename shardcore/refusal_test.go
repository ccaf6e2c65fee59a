package shardcore

import (
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/protocol"
)

// The overload run's rejected-but-stored: an attempt of a send was
// refused while its sender was out of the conversation, and another
// attempt of the same key, which had waited in the pipeline, reached the
// writer after the sender was added back. It must get the same refusal,
// not a seq.
func TestALateAttemptOfARefusedKeyIsRefusedToo(t *testing.T) {
	c := NewConv()
	t0 := time.Unix(1000, 0)
	decide := func(cmd Command, now time.Time) Decision {
		t.Helper()
		d := Decide(c, &cmd, Stamp{Now: now, MessageID: "m" + cmd.ClientMessageID + cmd.Op}, lim)
		switch {
		case d.Event != nil:
			Apply(c, d.Event)
		case d.Reject != nil:
			Refuse(c, &cmd, d.Reject, now, 2*time.Minute)
		}
		return d
	}
	step(t, c, Command{Op: "create", ConversationID: "c", Sender: "a", Members: []string{"b"}})
	step(t, c, Command{Op: "kick", ConversationID: "c", Sender: "a", UserID: "b"})
	send := Command{Op: "send", ConversationID: "c", Sender: "b", ClientMessageID: "m141538", Body: "hi"}
	if d := decide(send, t0); code(d) != protocol.CodeForbidden {
		t.Fatalf("send while removed: %+v", d)
	}
	decide(Command{Op: "send", ConversationID: "c", Sender: "b", ClientMessageID: "k2"}, t0)
	step(t, c, Command{Op: "join", ConversationID: "c", Sender: "a", UserID: "b"})
	if d := decide(send, t0.Add(30*time.Second)); code(d) != protocol.CodeForbidden || d.Event != nil {
		t.Fatalf("the late attempt after the re-add: %+v", d)
	}
	// Another key of the same sender is decided on its own.
	if d := decide(Command{Op: "send", ConversationID: "c", Sender: "b", ClientMessageID: "other", Body: "hi"}, t0.Add(31*time.Second)); d.Event == nil {
		t.Fatalf("a new key: %+v", d)
	}
	// The same key from another sender, or for another op, is not this
	// refusal.
	if d := decide(Command{Op: "send", ConversationID: "c", Sender: "a", ClientMessageID: "k2", Body: "x"}, t0.Add(32*time.Second)); d.Event == nil {
		t.Fatalf("the key from another sender: %+v", d)
	}
	// Past the memory the key is decided again (a later refusal being
	// remembered forgets the old ones).
	decide(Command{Op: "send", ConversationID: "c", Sender: "z", ClientMessageID: "z1"}, t0.Add(3*time.Minute))
	if _, ok := c.Refused["m141538"]; ok {
		t.Fatal("a refusal older than the memory is kept")
	}
	if d := decide(send, t0.Add(3*time.Minute)); d.Event == nil {
		t.Fatalf("past the memory: %+v", d)
	}
}

func TestTrimRefusals(t *testing.T) {
	c := NewConv()
	t0 := time.Unix(1000, 0)
	for i, k := range []string{"a", "b", "c"} {
		RememberRefusal(c, k, Refusal{Sender: "u", Op: "send", Err: protocol.Errorf(protocol.CodeForbidden, "no"), At: t0.Add(time.Duration(i) * time.Second)})
	}
	RememberRefusal(c, "a", Refusal{Sender: "v", At: t0.Add(time.Hour)}) // the first one stays
	if n := TrimRefusals(c, t0.Add(1500*time.Millisecond)); n != 2 || len(c.Refused) != 1 || c.Refused["c"].Sender != "u" {
		t.Fatalf("trimmed %d, left %v", n, c.Refused)
	}
	if n := TrimRefusals(c, t0); n != 0 {
		t.Fatalf("trimmed %d more", n)
	}
}
