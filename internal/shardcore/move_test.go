package shardcore

import (
	"fmt"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// A conversation routed elsewhere is moved by the writer that has it: a
// moved event with the next seq, after the batch's commands; from then on
// its new commands are answered retry, and a retry of a message accepted
// before the move still gets its first result.
func TestWriterMovesAConversation(t *testing.T) {
	h := newHarness(t, func(c *WriterConfig) { c.VShards = 4 })
	c1 := convAt(3, 4)
	h.takeOver()
	h.submit("s1", send(c1, "u1", "k1"), time.Time{})
	h.tick()
	h.load()
	h.want(EffectCommit)
	h.m.Committed(h.now, []int64{20}, nil)
	h.ready()
	h.housekeep()
	if a := h.answers["s1"]; a.Reply.Op != protocol.OpAccepted || a.Reply.Seq != 2 {
		t.Fatalf("s1 %+v", a.Reply)
	}

	h.m.Route(h.now, c1, 6)
	h.submit("s2", send(c1, "u1", "k2"), time.Time{})
	h.tick()
	h.want(EffectLoadState) // k2's dedupe lookup
	h.m.StateLoaded(h.now, nil, nil, nil)
	h.ready()
	e := h.want(EffectCommit)
	if len(e.Events) != 2 || e.Events[0].Seq != 3 || e.Events[1].Kind != logrecord.KindMoved || e.Events[1].Seq != 4 || *e.Events[1].ToVShard != 6 {
		t.Fatalf("commit %+v, want s2's message at 3, then moved to 6 at 4", e.Events)
	}
	if e.Events[1].V != 2 {
		t.Fatalf("moved event written with version %d", e.Events[1].V)
	}
	h.m.Committed(h.now, []int64{21, 22}, nil)
	rd := h.ready()
	h.housekeep()
	if len(rd.Notice.Moved) != 1 || h.m.Moving() != 1 {
		t.Fatalf("notice %+v, moving %d", rd.Notice.Moved, h.m.Moving())
	}

	h.submit("s3", send(c1, "u1", "k3"), time.Time{})
	h.submit("s1-again", send(c1, "u1", "k1"), time.Time{})
	h.tick()
	h.want(EffectLoadState) // k3's dedupe lookup
	h.m.StateLoaded(h.now, nil, nil, nil)
	h.ready()
	// The retry's first result comes from this writer's state: a marker
	// confirms the writer still owns the vshard first.
	if e := h.want(EffectCommit); len(e.Events) != 1 || e.Events[0].Kind != logrecord.KindTakeover {
		t.Fatalf("commit %+v, want a marker alone", e.Events)
	}
	h.m.Committed(h.now, []int64{23}, nil)
	h.ready()
	if a := h.answers["s3"]; !a.Retry || a.Reply.Code != protocol.CodeUnavailable || a.Wrote {
		t.Fatalf("s3 after the move: %+v", a)
	}
	if a := h.answers["s1-again"]; a.Reply.Op != protocol.OpAccepted || a.Reply.Seq != 2 {
		t.Fatalf("retry of s1 after the move: %+v", a.Reply)
	}
}

// The writer a conversation is routed to answers retry until its state
// says the conversation is here (the old writer's moved record is in
// durable state), loading it again each time; then it continues the seq.
func TestDedicatedWriterWaitsForTheMovedRecord(t *testing.T) {
	h := newHarness(t, func(c *WriterConfig) { c.VShard, c.VShards, c.Dedicated = 6, 4, true })
	h.takeOver()
	h.m.Route(h.now, "c1", 6)
	state := func(moved bool) map[string]*Conv {
		conv := NewConv()
		Apply(conv, &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: "c1", Seq: 1, Sender: "u1", Members: []string{"u1"}})
		if moved {
			to := 6
			Apply(conv, &logrecord.Event{Kind: logrecord.KindMoved, ConversationID: "c1", Seq: 2, ToVShard: &to})
		}
		return map[string]*Conv{"c1": conv}
	}
	h.submit("s1", send("c1", "u1", "k1"), time.Time{})
	h.tick()
	h.want(EffectLoadState)
	h.m.StateLoaded(h.now, state(false), nil, nil)
	h.ready()
	if a := h.answers["s1"]; !a.Retry || a.Reply.Code != protocol.CodeUnavailable {
		t.Fatalf("s1 before the moved record: %+v", a)
	}
	h.submit("s1b", send("c1", "u1", "k1"), time.Time{})
	h.tick()
	if e := h.want(EffectLoadState); len(e.Convs) != 1 || len(e.Keys) != 1 {
		t.Fatalf("second try loads %+v, want c1 and its key again", e)
	}
	h.m.StateLoaded(h.now, state(true), nil, nil)
	h.ready()
	e := h.want(EffectCommit)
	if len(e.Events) != 1 || e.Events[0].Seq != 3 || e.Events[0].VShard != 6 {
		t.Fatalf("commit %+v, want seq 3 from vshard 6", e.Events)
	}
}

// A move the writer cannot make (the conversation is not here) is looked
// at again, less and less often, while the override stands: a move decided
// on an older route may still bring the conversation here.
func TestWriterMoveLooksAgainLessOften(t *testing.T) {
	h := newHarness(t, func(c *WriterConfig) {
		c.VShard, c.VShards, c.Dedicated, c.MoveRetry, c.MoveRetryMax = 6, 4, true, time.Second, 4*time.Second
	})
	h.takeOver()
	h.m.Route(h.now, "c1", 5)
	look := func(conv *Conv) Ready {
		t.Helper()
		h.tick()
		h.want(EffectLoadState)
		h.m.StateLoaded(h.now, map[string]*Conv{"c1": conv}, nil, nil)
		return h.ready()
	}
	// Not here (never moved: at its hashed vshard): looked at again after
	// 1 s, then 2 s, then 4 s, 4 s.
	for _, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
		rd := look(NewConv())
		if h.last != nil || h.m.Moving() != 1 || !rd.Wake.Equal(h.now.Add(wait)) {
			t.Fatalf("effect %v, moving %d, wake in %v, want %v", h.last, h.m.Moving(), rd.Wake.Sub(h.now), wait)
		}
		h.now = rd.Wake
	}
	// It arrived (the moved record to 6 is stored): moved on to 5.
	to := 6
	conv := NewConv()
	Apply(conv, &logrecord.Event{Kind: logrecord.KindMoved, ConversationID: "c1", Seq: 1, ToVShard: &to})
	look(conv)
	if e := h.want(EffectCommit); len(e.Events) != 1 || e.Events[0].Kind != logrecord.KindMoved || *e.Events[0].ToVShard != 5 || e.Events[0].Seq != 2 {
		t.Fatalf("commit %+v, want the move to 5", e.Events)
	}
	h.m.Committed(h.now, []int64{30}, nil)
	h.ready()
	h.housekeep()
	// Routed here again: nothing more to look at.
	h.m.Route(h.now, "c1", 6)
	if h.m.Moving() != 0 {
		t.Fatalf("moving %d after the route came back", h.m.Moving())
	}
}

// housekeep answers a housekeeping pass, if one was asked for.
func (h *harness) housekeep() {
	if h.last != nil && h.last.Kind == EffectPersistOffset {
		h.m.PersistOffset(h.now, 0, false, nil)
		h.ready()
	}
}

// convAt is a conversation id that hashes to vshard v of vshards.
func convAt(v, vshards int) string {
	for i := 0; ; i++ {
		if id := fmt.Sprintf("c%d", i); logrecord.VShard(id, vshards) == v {
			return id
		}
	}
}

// A hashed vshard's writer holds only the conversations that hash to it
// (or were moved to it): one routed to it by a mistaken override is
// answered retry, never decided from a state its own writer may be adding
// to.
func TestWriterRefusesAConversationOfAnotherVShard(t *testing.T) {
	h := newHarness(t, func(c *WriterConfig) { c.VShards = 4 })
	h.takeOver()
	other := convAt(1, 4)
	h.submit("s1", send(other, "u1", "k1"), time.Time{})
	h.tick()
	h.load()
	if a := h.answers["s1"]; !a.Retry || a.Reply.Code != protocol.CodeUnavailable || h.last != nil && h.last.Kind == EffectCommit {
		t.Fatalf("a send to %s (vshard 1) at vshard 3: %+v, effect %v", other, a, h.last)
	}
}

// A move called off before its batch leaves no wake-up behind: a wake in
// the past that a Tick does not clear would make the driver call Tick in
// a loop (a busy writer after every release).
func TestWriterCalledOffMoveLeavesNoWake(t *testing.T) {
	h := newHarness(t, func(c *WriterConfig) { c.VShard, c.VShards, c.Dedicated = 6, 4, true })
	h.takeOver()
	h.m.Route(h.now, "c1", 5)
	h.m.Unroute("c1")
	if rd := h.tick(); !rd.Wake.IsZero() || h.last != nil {
		t.Fatalf("after the move was called off: wake %v, effect %v", rd.Wake, h.last)
	}
	h.m.Route(h.now, "c1", 5)
	h.m.Route(h.now, "c1", 6) // routed here: nothing to move
	if rd := h.tick(); !rd.Wake.IsZero() || h.last != nil {
		t.Fatalf("after the route came here: wake %v, effect %v", rd.Wake, h.last)
	}
	// A move that is only looked at later keeps its (future) wake.
	h.m.Route(h.now, "c1", 5)
	h.tick()
	h.want(EffectLoadState)
	h.m.StateLoaded(h.now, map[string]*Conv{"c1": NewConv()}, nil, nil)
	rd := h.ready()
	h.now = h.now.Add(100 * time.Millisecond)
	if rd = h.tick(); !rd.Wake.After(h.now) {
		t.Fatalf("a pending move's wake %v is not after now %v", rd.Wake, h.now)
	}
}

// BenchmarkHolds is the per-command cost of the writer's location check
// for a conversation that never moved (its hashed vshard is computed).
func BenchmarkHolds(b *testing.B) {
	st := Stamp{VShard: 3, VShards: 4096}
	c := NewConv()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		st.Holds(c, "conversation-0123456789")
	}
}

// An override that names a conversation's hashed vshard is a release:
// that vshard's writer reports it (Notice.Released) only once its state
// says the conversation is here, which is once durable state holds the
// moved record that brings it home; until then it looks again, less and
// less often. A dedicated writer that an override names reports nothing.
func TestWriterReleasesOnlyWhatIsHere(t *testing.T) {
	h := newHarness(t, func(c *WriterConfig) { c.VShards, c.MoveRetry, c.MoveRetryMax = 4, time.Second, 4*time.Second })
	c1 := convAt(3, 4)
	h.takeOver()
	h.m.Route(h.now, c1, 3)
	look := func(conv *Conv) Ready {
		t.Helper()
		h.tick()
		h.want(EffectLoadState)
		h.m.StateLoaded(h.now, map[string]*Conv{c1: conv}, nil, nil)
		return h.ready()
	}
	away := func(seq int64, to int) *Conv {
		conv := NewConv()
		Apply(conv, &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: c1, Seq: 1, Sender: "u1", Members: []string{"u1"}})
		for i, v := range []int{6, to} {
			Apply(conv, &logrecord.Event{Kind: logrecord.KindMoved, ConversationID: c1, Seq: seq + int64(i), ToVShard: &v})
		}
		return conv
	}
	// Durable state has it at vshard 6 still (the move home is not
	// stored yet): nothing to release, look again later.
	for _, wait := range []time.Duration{time.Second, 2 * time.Second} {
		rd := look(away(2, 6))
		if len(rd.Notice.Released) != 0 || h.last != nil || !rd.Wake.Equal(h.now.Add(wait)) {
			t.Fatalf("released %v, effect %v, wake in %v; want nothing until the move home is stored, a look in %v", rd.Notice.Released, h.last, rd.Wake.Sub(h.now), wait)
		}
		h.now = rd.Wake
	}
	// The moved record home is stored: released, without writing.
	rd := look(away(2, 3))
	if fmt.Sprint(rd.Notice.Released) != "["+c1+"]" || h.last != nil {
		t.Fatalf("released %v, effect %v; want %s released, nothing written", rd.Notice.Released, h.last, c1)
	}
	// Until Unroute, each look reports it again (a failed delete is
	// tried again); after it, nothing is looked at.
	h.now = rd.Wake
	rd = h.tick() // (cached and here: nothing to load)
	if fmt.Sprint(rd.Notice.Released) != "["+c1+"]" {
		t.Fatalf("second look: released %v", rd.Notice.Released)
	}
	h.m.Unroute(c1)
	if h.m.Moving() != 0 {
		t.Fatalf("moving %d after Unroute", h.m.Moving())
	}

	// A dedicated vshard named by its conversation's override is where it
	// is isolated to, not a release.
	d := newHarness(t, func(c *WriterConfig) { c.VShard, c.VShards, c.Dedicated = 6, 4, true })
	d.takeOver()
	d.m.Route(d.now, c1, 6)
	if d.m.Moving() != 0 {
		t.Fatalf("a dedicated writer looks after %d conversations routed to it", d.m.Moving())
	}
}

// A rejection remembered for a key goes with its conversation: the moved
// record carries the verdicts of the conversation's keys still within
// RefusalMemory, and the writer it moves to answers another attempt of
// such a key as the first writer did, even after the state changed
// (here: the refused sender was added since). Told no, never stored.
func TestWriterVerdictsMoveWithTheConversation(t *testing.T) {
	c1 := convAt(3, 4)
	old := newHarness(t, func(c *WriterConfig) { c.VShards = 4 })
	old.takeOver()
	state := func(string) *Conv {
		conv := NewConv()
		Apply(conv, &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: c1, Seq: 1, Sender: "u1", Members: []string{"u1"}})
		return conv
	}
	refused := send(c1, "u2", "k-refused")
	old.run("a", state, refused)
	if a := old.answers["a0"]; a.Reply.Code != protocol.CodeForbidden {
		t.Fatalf("u2's send: %+v, want forbidden", a.Reply)
	}
	old.m.Route(old.now, c1, 6)
	old.tick()
	old.settle(state)
	evs := old.committed()
	if len(evs) != 1 || evs[0].Kind != logrecord.KindMoved {
		t.Fatalf("committed %v, want the moved record", kinds(evs))
	}
	moved := evs[0]
	if len(moved.Verdicts) != 1 || moved.Verdicts[0].ClientMessageID != "k-refused" || moved.Verdicts[0].Code != string(protocol.CodeForbidden) {
		t.Fatalf("the moved record carries %+v, want k-refused's forbidden", moved.Verdicts)
	}

	// The dedicated writer loads the conversation as Postgres has it:
	// the create and the moved record.
	nw := newHarness(t, func(c *WriterConfig) { c.VShard, c.VShards, c.Dedicated = 6, 4, true })
	nw.now = old.now.Add(10 * time.Second)
	nw.takeOver()
	nw.m.Route(nw.now, c1, 6)
	arrived := func(string) *Conv {
		conv := state(c1)
		Apply(conv, moved)
		return conv
	}
	nw.run("b", arrived, Command{Op: protocol.OpJoin, ConversationID: c1, Sender: "u1", UserID: "u2", ClientMessageID: "j-u2"})
	if a := nw.answers["b0"]; a.Reply.Op != protocol.OpAccepted || a.Reply.Seq != 3 {
		t.Fatalf("u2's join at the new writer: %+v, want accepted at 3", a.Reply)
	}
	// The refused send's late attempt reaches the new writer.
	nw.run("c", arrived, refused)
	if a := nw.answers["c0"]; a.Reply.Code != protocol.CodeForbidden {
		t.Fatalf("the refused send's late attempt after the move: %+v, want forbidden as first answered (moved record %+v)", a.Reply, moved)
	}
	// Past RefusalMemory it is decided again, as at the first writer.
	nw.now = old.now.Add(2 * time.Minute)
	nw.run("d", arrived, refused)
	if a := nw.answers["d0"]; a.Reply.Op != protocol.OpAccepted {
		t.Fatalf("the refused send after RefusalMemory: %+v, want decided again (accepted)", a.Reply)
	}
}

// However many keys a conversation's senders had refused, its moved
// record carries at most MaxCarriedVerdicts of them, the newest.
func TestMovedRecordCarriesBoundedVerdicts(t *testing.T) {
	c1 := convAt(3, 4)
	h := newHarness(t, func(c *WriterConfig) { c.VShards, c.MaxBatch = 4, 1000 })
	h.takeOver()
	state := func(string) *Conv {
		conv := NewConv()
		Apply(conv, &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: c1, Seq: 1, Sender: "u1", Members: []string{"u1"}})
		return conv
	}
	var cmds []Command
	for i := range MaxCarriedVerdicts + 44 {
		cmds = append(cmds, send(c1, "u2", fmt.Sprintf("k%03d", i)))
	}
	h.run("a", state, cmds...)
	h.m.Route(h.now, c1, 6)
	h.tick()
	h.settle(state)
	evs := h.committed()
	if len(evs) != 1 || evs[0].Kind != logrecord.KindMoved {
		t.Fatalf("committed %v, want the moved record", kinds(evs))
	}
	vs := evs[0].Verdicts
	if len(vs) != MaxCarriedVerdicts || vs[0].ClientMessageID != "k044" || vs[len(vs)-1].ClientMessageID != fmt.Sprintf("k%03d", MaxCarriedVerdicts+43) {
		t.Fatalf("the moved record carries %d verdicts (%s … %s), want the newest %d", len(vs), vs[0].ClientMessageID, vs[len(vs)-1].ClientMessageID, MaxCarriedVerdicts)
	}
}
