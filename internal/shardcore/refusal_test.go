package shardcore

import (
	"fmt"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/protocol"
)

// decider decides commands of conversation c as a driver does, with a
// memory of verdicts: each key's first verdict is handed to DecideWith
// for the key's other attempts for memory.
type decider struct {
	t      *testing.T
	c      *Conv
	memory time.Duration
	kept   map[string]Verdict
}

func newDecider(t *testing.T) *decider {
	return &decider{t: t, c: NewConv(), memory: 2 * time.Minute, kept: map[string]Verdict{}}
}

func (x *decider) decide(cmd Command, now time.Time) Decision {
	x.t.Helper()
	var prior *Verdict
	v, ok := x.kept[cmd.ClientMessageID]
	live := ok && !v.At.Before(now.Add(-x.memory))
	if live {
		prior = &v
	}
	d := DecideWith(x.c, &cmd, Stamp{Now: now, MessageID: "m" + cmd.ClientMessageID + cmd.Op}, lim, prior)
	if d.Event != nil {
		Apply(x.c, d.Event)
	}
	if d.Keep && !live {
		x.kept[cmd.ClientMessageID] = VerdictOf(&cmd, d, now)
	}
	return d
}

// The overload run's rejected-but-stored: an attempt of a send was
// refused while its sender was out of the conversation, and another
// attempt of the same key, which had waited in the pipeline, reached the
// writer after the sender was added back. It must get the same refusal,
// not a seq.
func TestALateAttemptOfARefusedKeyIsRefusedToo(t *testing.T) {
	x := newDecider(t)
	t0 := time.Unix(1000, 0)
	step(t, x.c, Command{Op: "create", ConversationID: "c", Sender: "a", Members: []string{"b"}})
	step(t, x.c, Command{Op: "kick", ConversationID: "c", Sender: "a", UserID: "b"})
	send := Command{Op: "send", ConversationID: "c", Sender: "b", ClientMessageID: "m141538", Body: "hi"}
	if d := x.decide(send, t0); code(d) != protocol.CodeForbidden || !d.Keep {
		t.Fatalf("send while removed: %+v", d)
	}
	x.decide(Command{Op: "send", ConversationID: "c", Sender: "b", ClientMessageID: "k2"}, t0)
	step(t, x.c, Command{Op: "join", ConversationID: "c", Sender: "a", UserID: "b"})
	if d := x.decide(send, t0.Add(30*time.Second)); code(d) != protocol.CodeForbidden || d.Event != nil || d.Keep {
		t.Fatalf("the late attempt after the re-add: %+v", d)
	}
	// Another key of the same sender is decided on its own.
	if d := x.decide(Command{Op: "send", ConversationID: "c", Sender: "b", ClientMessageID: "other", Body: "hi"}, t0.Add(31*time.Second)); d.Event == nil {
		t.Fatalf("a new key: %+v", d)
	}
	// The same key from another sender, or for another op, is not this
	// refusal.
	if d := x.decide(Command{Op: "send", ConversationID: "c", Sender: "a", ClientMessageID: "k2", Body: "x"}, t0.Add(32*time.Second)); d.Event == nil {
		t.Fatalf("the key from another sender: %+v", d)
	}
	// Past the memory the key is decided again.
	if d := x.decide(send, t0.Add(3*time.Minute)); d.Event == nil {
		t.Fatalf("past the memory: %+v", d)
	}
}

// A keyed join of a current member writes nothing and is kept as its
// key's verdict: another attempt of the key gets the same seq and adds
// nobody, even after the user left, until the memory is up. A verdict
// does not answer for a conversation that is not here, and dedupe answers
// before it.
func TestARetriedJoinOfAMemberIsAnsweredTheSame(t *testing.T) {
	x := newDecider(t)
	t0 := time.Unix(1000, 0)
	step(t, x.c, Command{Op: "create", ConversationID: "c", Sender: "a", Members: []string{"b"}})
	join := Command{Op: "join", ConversationID: "c", Sender: "a", UserID: "b", ClientMessageID: "j"}
	if d := x.decide(join, t0); d.Event != nil || d.Reject != nil || d.Seq != 1 || !d.Keep {
		t.Fatalf("join of a member: %+v", d)
	}
	// Unkeyed, the same join leaves nothing to keep.
	if d := x.decide(Command{Op: "join", ConversationID: "c", Sender: "a", UserID: "b"}, t0); d.Seq != 1 || d.Keep {
		t.Fatalf("unkeyed join of a member: %+v", d)
	}
	step(t, x.c, Command{Op: "leave", ConversationID: "c", Sender: "b"})
	if d := x.decide(join, t0.Add(time.Minute)); d.Event != nil || d.Reject != nil || d.Seq != 1 || d.Keep {
		t.Fatalf("retry after the leave: %+v", d)
	}
	if _, in := x.c.Members["b"]; in {
		t.Fatal("the retry added b again")
	}
	// Not here: answered retry, as a remembered rejection would be.
	moved := *x.c
	moved.Moved, moved.At = true, 9
	if d := DecideWith(&moved, &join, Stamp{Now: t0}, lim, &Verdict{Sender: "a", Op: "join", Seq: 1, At: t0}); !d.Retry || d.Keep {
		t.Fatalf("retry when not here: %+v", d)
	}
	// Dedupe first: a key that took effect for another sender is theirs.
	deduped := NewConv()
	Remember(deduped, "j", First{Seq: 5, Sender: "z", Kind: "message"})
	if d := DecideWith(deduped, &join, Stamp{Now: t0}, lim, &Verdict{Sender: "a", Op: "join", Seq: 1, At: t0}); code(d) != protocol.CodeConflict {
		t.Fatalf("a key used by another sender: %+v", d)
	}
	// Past the memory it is decided again: b is no member, so b is added.
	if d := x.decide(join, t0.Add(3*time.Minute)); d.Event == nil || d.Event.UserID != "b" {
		t.Fatalf("past the memory: %+v", d)
	}
}

func TestVerdictTable(t *testing.T) {
	var tb verdictTable
	t0 := time.Unix(1000, 0)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	key := func(i int) DedupeKey { return DedupeKey{"c", fmt.Sprint("k", i)} }
	for i := range 3 {
		if n := tb.put(key(i), Verdict{Sender: "u", Op: "send", At: at(i)}, t0, 10); n != 0 {
			t.Fatalf("put %d dropped %d", i, n)
		}
	}
	tb.put(key(0), Verdict{Sender: "v", At: at(5)}, t0, 10) // the first one stands
	if v, ok := tb.get(key(0), t0); !ok || v.Sender != "u" {
		t.Fatalf("k0: %+v %v", v, ok)
	}
	// Past its memory a verdict answers nothing, trimmed or not.
	if _, ok := tb.get(key(0), at(1)); ok {
		t.Fatal("k0 answered past its memory")
	}
	if n := tb.trim(at(2)); n != 2 || tb.len() != 1 {
		t.Fatalf("trimmed %d, %d left", n, tb.len())
	}
	// Full: the oldest goes first.
	for i := 3; i < 10; i++ {
		tb.put(key(i), Verdict{At: at(i)}, t0, 4)
	}
	if tb.len() != 4 {
		t.Fatalf("%d held, limit 4", tb.len())
	}
	for i := 2; i < 10; i++ {
		if _, ok := tb.get(key(i), t0); ok != (i >= 6) {
			t.Fatalf("k%d held: %v", i, ok)
		}
	}
	if live := len(tb.order) - tb.head; live != tb.len() {
		t.Fatalf("order holds %d live keys, the map %d", live, tb.len())
	}
}
