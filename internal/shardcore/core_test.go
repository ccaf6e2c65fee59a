package shardcore

import (
	"strings"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

var lim = Limits{MaxMembers: 3}

// step decides cmd and, when it writes, applies the event, like the driver.
func step(t *testing.T, c *Conv, cmd Command) Decision {
	t.Helper()
	d := Decide(c, &cmd, Stamp{Now: time.Unix(0, 0), MessageID: "m" + cmd.ClientMessageID + cmd.Op}, lim)
	if d.Event != nil {
		Apply(c, d.Event)
	}
	return d
}

func code(d Decision) protocol.Code {
	if d.Reject == nil {
		return ""
	}
	return d.Reject.Code
}

func TestLifecycle(t *testing.T) {
	c := NewConv()
	if d := step(t, c, Command{Op: "send", ConversationID: "c", Sender: "a", ClientMessageID: "x", Body: "hi"}); code(d) != protocol.CodeForbidden {
		t.Fatalf("send to missing conversation: %+v", d)
	}
	d := step(t, c, Command{Op: "create", ConversationID: "c", Sender: "a", Members: []string{"b", "a", "b"}})
	if d.Event == nil || d.Event.Seq != 1 || strings.Join(d.Event.Members, ",") != "a,b" {
		t.Fatalf("create: %+v", d.Event)
	}
	if d := step(t, c, Command{Op: "create", ConversationID: "c", Sender: "z"}); code(d) != protocol.CodeConflict {
		t.Fatalf("second create: %+v", d)
	}
	d = step(t, c, Command{Op: "send", ConversationID: "c", Sender: "b", ClientMessageID: "m1", Body: "hi"})
	if d.Event == nil || d.Event.Seq != 2 {
		t.Fatalf("send: %+v", d)
	}
	// retry: same answer, no write
	r := step(t, c, Command{Op: "send", ConversationID: "c", Sender: "b", ClientMessageID: "m1", Body: "other"})
	if r.Event != nil || r.Seq != 2 || r.MessageID != d.Event.MessageID {
		t.Fatalf("retry: %+v", r)
	}
	if d := step(t, c, Command{Op: "send", ConversationID: "c", Sender: "a", ClientMessageID: "m1", Body: "x"}); code(d) != protocol.CodeConflict {
		t.Fatalf("same id other sender: %+v", d)
	}
	if d := step(t, c, Command{Op: "kick", ConversationID: "c", Sender: "b", UserID: "a"}); code(d) != protocol.CodeForbidden {
		t.Fatalf("non-owner kick: %+v", d)
	}
	if d := step(t, c, Command{Op: "join", ConversationID: "c", Sender: "b", UserID: "d"}); d.Event == nil || d.Event.Seq != 3 {
		t.Fatalf("join: %+v", d)
	}
	if d := step(t, c, Command{Op: "join", ConversationID: "c", Sender: "a", UserID: "d"}); d.Event != nil || d.Seq != 3 {
		t.Fatalf("join of member: %+v", d)
	}
	if d := step(t, c, Command{Op: "join", ConversationID: "c", Sender: "a", UserID: "e"}); code(d) != protocol.CodeTooLarge {
		t.Fatalf("join over limit: %+v", d)
	}
	if d := step(t, c, Command{Op: "kick", ConversationID: "c", Sender: "a", UserID: "b"}); d.Event == nil || d.Event.Seq != 4 {
		t.Fatalf("kick: %+v", d)
	}
	// a kicked user cannot send, but a retry of an earlier send still answers
	if d := step(t, c, Command{Op: "send", ConversationID: "c", Sender: "b", ClientMessageID: "m2", Body: "x"}); code(d) != protocol.CodeForbidden {
		t.Fatalf("kicked send: %+v", d)
	}
	if d := step(t, c, Command{Op: "send", ConversationID: "c", Sender: "b", ClientMessageID: "m1", Body: "x"}); d.Seq != 2 {
		t.Fatalf("kicked retry: %+v", d)
	}
	if d := step(t, c, Command{Op: "kick", ConversationID: "c", Sender: "a", UserID: "b"}); code(d) != protocol.CodeNotFound {
		t.Fatalf("kick non-member: %+v", d)
	}
	if d := step(t, c, Command{Op: "leave", ConversationID: "c", Sender: "b"}); code(d) != protocol.CodeNotFound {
		t.Fatalf("leave non-member: %+v", d)
	}
	if d := step(t, c, Command{Op: "leave", ConversationID: "c", Sender: "d"}); d.Event == nil || d.Event.UserID != "d" {
		t.Fatalf("leave: %+v", d)
	}
}

// Replaying the log into a fresh state, with an overlapping durable prefix,
// gives the same state as the live path.
func TestReplayMatchesLive(t *testing.T) {
	live := NewConv()
	var log []*logrecord.Event
	cmds := []Command{
		{Op: "create", Sender: "a", Members: []string{"b"}},
		{Op: "send", Sender: "a", ClientMessageID: "1", Body: "x"},
		{Op: "join", Sender: "a", UserID: "c"},
		{Op: "send", Sender: "c", ClientMessageID: "2", Body: "x"},
		{Op: "kick", Sender: "a", UserID: "b"},
		{Op: "send", Sender: "a", ClientMessageID: "3", Body: "x"},
	}
	for _, cmd := range cmds {
		cmd.ConversationID = "c"
		if d := step(t, live, cmd); d.Event != nil {
			log = append(log, d.Event)
		}
	}
	for cut := 0; cut <= len(log); cut++ {
		r := NewConv()
		// durable prefix: membership events, then the max seq
		for _, e := range log[:cut] {
			if e.Kind != logrecord.KindMessage {
				Apply(r, e)
			}
		}
		if cut > 0 {
			ObserveSeq(r, log[cut-1].Seq)
		}
		// the tail overlaps the prefix by one
		from := max(cut-1, 0)
		for _, e := range log[from:] {
			Apply(r, e)
		}
		if r.LastSeq != live.LastSeq || len(r.Members) != len(live.Members) || r.Owner != live.Owner {
			t.Fatalf("cut %d: replayed %+v, live %+v", cut, r, live)
		}
		for m := range live.Members {
			if _, ok := r.Members[m]; !ok {
				t.Fatalf("cut %d: member %s missing", cut, m)
			}
		}
	}
}

// TestKeyedMembershipRetries: a create, join, kick or leave that carries a
// client_message_id takes effect once however often it is retried; the
// retry of a join whose first attempt added the user does not add them
// again after a kick, and a key used for one command cannot answer another.
func TestKeyedMembershipRetries(t *testing.T) {
	c := NewConv()
	create := Command{Op: "create", ConversationID: "c", Sender: "a", Members: []string{"b"}, ClientMessageID: "k-create"}
	if d := step(t, c, create); d.Event == nil || d.Event.ClientMessageID != "k-create" {
		t.Fatalf("create: %+v", d)
	}
	if d := step(t, c, create); d.Event != nil || d.Reject != nil || d.Seq != 1 {
		t.Fatalf("retried create: %+v, want its first result seq 1", d)
	}
	if d := step(t, c, Command{Op: "create", ConversationID: "c", Sender: "a"}); code(d) != protocol.CodeConflict {
		t.Fatalf("create without a key of an existing conversation: %+v", d)
	}
	join := Command{Op: "join", ConversationID: "c", Sender: "b", UserID: "x", ClientMessageID: "k-join"}
	d := step(t, c, join)
	if d.Event == nil || d.Event.Seq != 2 {
		t.Fatalf("join: %+v", d)
	}
	if d := step(t, c, Command{Op: "kick", ConversationID: "c", Sender: "a", UserID: "x", ClientMessageID: "k-kick"}); d.Event == nil {
		t.Fatalf("kick: %+v", d)
	}
	if d := step(t, c, join); d.Event != nil || d.Seq != 2 {
		t.Fatalf("join retried after a kick: %+v, want its first result seq 2 and nothing written", d)
	}
	if _, ok := c.Members["x"]; ok {
		t.Fatal("the retried join re-added a kicked user")
	}
	if d := step(t, c, Command{Op: "leave", ConversationID: "c", Sender: "b", ClientMessageID: "k-join"}); code(d) != protocol.CodeConflict {
		t.Fatalf("a leave reusing a join's key: %+v, want conflict", d)
	}
	if d := step(t, c, Command{Op: "send", ConversationID: "c", Sender: "b", ClientMessageID: "k-kick", Body: "x"}); code(d) != protocol.CodeConflict {
		t.Fatalf("a send reusing a kick's key: %+v, want conflict", d)
	}
	// Without a key a join is idempotent only while the user is a member.
	if d := step(t, c, Command{Op: "join", ConversationID: "c", Sender: "b", UserID: "x"}); d.Event == nil {
		t.Fatalf("join without a key of a former member: %+v", d)
	}
}

// A read marker is decided like a write of a member, takes no seq, and
// changes nothing of the conversation's state.
func TestReadMarker(t *testing.T) {
	c := NewConv()
	if d := step(t, c, Command{Op: protocol.OpRead, ConversationID: "c", Sender: "a", Seq: 1}); code(d) != protocol.CodeForbidden {
		t.Fatalf("read of a missing conversation: %+v", d)
	}
	step(t, c, Command{Op: "create", ConversationID: "c", Sender: "a", Members: []string{"b"}})
	step(t, c, Command{Op: "send", ConversationID: "c", Sender: "b", ClientMessageID: "m1", Body: "hi"})
	before := *c
	d := step(t, c, Command{Op: protocol.OpRead, ConversationID: "c", Sender: "a", Seq: 2})
	e := d.Event
	if e == nil || e.Kind != logrecord.KindRead || e.Seq != 0 || e.ReadSeq != 2 || e.UserID != "a" || e.HasSeq() || e.V != 3 {
		t.Fatalf("read: %+v", d)
	}
	if c.LastSeq != before.LastSeq || len(c.Dedupe) != len(before.Dedupe) {
		t.Fatalf("a read marker changed the state: %+v", c)
	}
	if d := step(t, c, Command{Op: protocol.OpRead, ConversationID: "c", Sender: "a", Seq: 3}); code(d) != protocol.CodeBadRequest {
		t.Fatalf("read past the last seq: %+v", d)
	}
	if d := step(t, c, Command{Op: protocol.OpRead, ConversationID: "c", Sender: "z", Seq: 1}); code(d) != protocol.CodeForbidden {
		t.Fatalf("read by a stranger: %+v", d)
	}
	// Lower than before: recorded again; the read model keeps the highest.
	if d := step(t, c, Command{Op: protocol.OpRead, ConversationID: "c", Sender: "a", Seq: 1}); d.Event == nil || d.Event.ReadSeq != 1 {
		t.Fatalf("lower read: %+v", d)
	}
	step(t, c, Command{Op: "leave", ConversationID: "c", Sender: "b"})
	if d := step(t, c, Command{Op: protocol.OpRead, ConversationID: "c", Sender: "b", Seq: 2}); code(d) != protocol.CodeForbidden {
		t.Fatalf("read by a former member: %+v", d)
	}
}
