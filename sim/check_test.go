package sim

import (
	"slices"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// The checks themselves are tested on hand-made worlds: a clean one passes,
// and each planted violation is reported by its property.

func event(kind, conv, sender, user, cmid string, seq int64) *logrecord.Event {
	e := &logrecord.Event{V: logrecord.VersionOf(kind), Kind: kind, ConversationID: conv, Seq: seq, Sender: sender, UserID: user,
		ClientMessageID: cmid, MessageID: "m" + conv + "-" + string(rune('0'+seq)), CreatedAt: time.Unix(0, 0), VShard: 0, Epoch: 1}
	if kind == logrecord.KindCreate {
		e.Members = []string{"u1", "u2"}
	}
	return e
}

// handWorld is a one-conversation world whose log holds: u0 creates with
// u1 and u2 (seq 1), u1 says a (2), u0 kicks u1 (3), plus extra.
func handWorld(t *testing.T, extra ...*logrecord.Event) (*World, string) {
	t.Helper()
	w := newWorld(oneShard(), zeroChooser{})
	c := w.convs[0]
	evs := append([]*logrecord.Event{
		event(logrecord.KindCreate, c, "u0", "", "", 1),
		event(logrecord.KindMessage, c, "u1", "", "a", 2),
		event(logrecord.KindKick, c, "u0", "u1", "", 3),
	}, extra...)
	ep := w.log.InitProducer("t")
	for _, e := range evs {
		if _, err := w.log.Produce("t", ep, 0, e, 0); err != nil {
			t.Fatal(err)
		}
	}
	w.step++
	if err := w.log.Commit("t", ep, w.step); err != nil {
		t.Fatal(err)
	}
	for w.sink.Pending(w.log, 0) {
		w.sink.Poll(w.log, 0, 100, w.step)
	}
	for w.proj.Pending(w.sink, 0) {
		w.proj.Poll(w, []int32{0}, 100)
	}
	for _, d := range w.devices {
		d.sync(w.proj, w.sink, w.convs)
	}
	return w, c
}

// answered adds a done op with an accepted answer.
func answered(w *World, cmd string, conv, cmid string, fresh bool, issued, done int, seq int64, mid string) {
	o := &op{id: len(w.ops) + 1, fresh: fresh, issuedStep: issued, done: true, doneStep: done}
	o.cmd.Op, o.cmd.ConversationID, o.cmd.ClientMessageID, o.cmd.Sender = cmd, conv, cmid, "u2"
	a := &attempt{op: o, n: 1, sentStep: issued}
	r := &protocol.Reply{Op: protocol.OpAccepted, ConversationID: conv, Seq: seq, MessageID: mid, ClientMessageID: cmid}
	o.attempts, o.final = []*attempt{a}, r
	o.answers = []*answer{{att: a, reply: r, wrote: true, sentStep: done}}
	w.ops = append(w.ops, o)
}

func TestChecksPassCleanWorld(t *testing.T) {
	w, c := handWorld(t)
	answered(w, protocol.OpSend, c, "a", true, 0, 1, 2, "m"+c+"-2")
	answered(w, protocol.OpSend, c, "a", false, 2, 3, 2, "m"+c+"-2")
	w.check()
	if len(w.violations) > 0 {
		t.Fatalf("clean world: %v", w.violations)
	}
}

// conv0 is the conversation of oneShard's world.
var conv0 = conversationIDs("c", 1, 1)[0]

func TestChecksCatchPlantedViolations(t *testing.T) {
	msg := func(sender, cmid string, seq int64) *logrecord.Event {
		return event(logrecord.KindMessage, conv0, sender, "", cmid, seq)
	}
	mid := func(seq int64) string { return "m" + conv0 + "-" + string(rune('0'+seq)) }
	for _, tc := range []struct {
		want  string
		plant func(t *testing.T) *World
	}{
		{PropCollision, func(t *testing.T) *World {
			e := msg("u2", "b", 3)
			e.MessageID = "other"
			w, _ := handWorld(t, e)
			return w
		}},
		{PropRegression, func(t *testing.T) *World {
			w, _ := handWorld(t, msg("u2", "b", 5), msg("u2", "d", 4))
			return w
		}},
		{PropDuplicate, func(t *testing.T) *World {
			w, _ := handWorld(t, msg("u2", "b", 4), msg("u2", "b", 5))
			return w
		}},
		{PropSinkConflict, func(t *testing.T) *World {
			w, _ := handWorld(t, msg("u2", "b", 4), msg("u2", "b", 5))
			return w
		}},
		{PropRemoved, func(t *testing.T) *World {
			w, _ := handWorld(t, msg("u1", "late", 4))
			return w
		}},
		{PropLost, func(t *testing.T) *World {
			w, c := handWorld(t)
			answered(w, protocol.OpSend, c, "z", true, 0, 1, 9, "m9")
			return w
		}},
		{PropRetry, func(t *testing.T) *World {
			w, c := handWorld(t)
			answered(w, protocol.OpSend, c, "a", true, 0, 1, 2, mid(2))
			answered(w, protocol.OpSend, c, "a", false, 2, 3, 3, mid(3))
			return w
		}},
		{PropRealTime, func(t *testing.T) *World {
			w, c := handWorld(t)
			answered(w, protocol.OpKick, c, "", true, 0, 5, 3, mid(3))
			answered(w, protocol.OpSend, c, "a", true, 6, 7, 2, mid(2))
			return w
		}},
		{PropDevices, func(t *testing.T) *World {
			w, c := handWorld(t)
			d := w.devices[0]
			d.got[c] = d.got[c][1:]
			return w
		}},
		{PropUnpersisted, func(t *testing.T) *World {
			w, c := handWorld(t)
			delete(w.sink.rows[c], 2)
			answered(w, protocol.OpSend, c, "a", true, 0, 1, 2, mid(2))
			return w
		}},
		{PropDuplicate, func(t *testing.T) *World {
			j := event(logrecord.KindJoin, conv0, "u0", "u1", "k", 4)
			l := event(logrecord.KindLeave, conv0, "u1", "u1", "k", 5)
			w, _ := handWorld(t, j, l)
			return w
		}},
		{PropArrival, func(t *testing.T) *World {
			e := msg("u2", "b", 4)
			e.VShard = 3 // a vshard the conversation never moved to
			w, _ := handWorld(t, e)
			return w
		}},
		{PropProjection, func(t *testing.T) *World {
			w, c := handWorld(t)
			// u1's period left open, as if the kick at 3 were lost
			w.proj.periods[c][periodKey{"u1", 1}] = nil
			return w
		}},
		{PropOneEffect, func(t *testing.T) *World {
			// u0's keyed join of u2 is answered accepted without a write
			// (u2 a member since seq 1) by the writer of vshard 0, epoch
			// 1, which then commits a join of u2 for the same key.
			w, c := handWorld(t, event(logrecord.KindJoin, conv0, "u0", "u2", "j", 4))
			o := &op{id: len(w.ops) + 1, issuedStep: 0, done: true}
			o.cmd.Op, o.cmd.ConversationID, o.cmd.Sender, o.cmd.UserID, o.cmd.ClientMessageID = protocol.OpJoin, c, "u0", "u2", "j"
			a := &attempt{op: o, n: 1}
			r := &protocol.Reply{Op: protocol.OpAccepted, ConversationID: c, Seq: 1, ClientMessageID: "j"}
			o.attempts, o.final = []*attempt{a}, r
			o.decided = []*answer{{att: a, reply: r, by: &writer{v: 0, epoch: 1}}}
			o.answers = o.decided
			w.ops = append(w.ops, o)
			return w
		}},
	} {
		t.Run(tc.want, func(t *testing.T) {
			w := tc.plant(t)
			w.check()
			var got []string
			for _, v := range w.violations {
				got = append(got, v.Property)
			}
			if !slices.Contains(got, tc.want) {
				t.Fatalf("want %s, got %v", tc.want, w.violations)
			}
		})
	}
}
