package shardcore

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// harness drives a Writer by hand: each test feeds the results it wants.
type harness struct {
	t   *testing.T
	m   *Writer
	now time.Time
	ids int
	// answers by request id, and the effects asked for, in order
	answers map[string]Answer
	effects []*Effect
	last    *Effect
}

func newHarness(t *testing.T, mod func(*WriterConfig)) *harness {
	h := &harness{t: t, now: time.Unix(1_700_000_000, 0), answers: map[string]Answer{}}
	cfg := WriterConfig{
		VShard: 3, Epoch: 7, Worker: "w1", Limits: Limits{MaxMembers: 10}, MaxBatch: 100,
		RefusalMemory: time.Minute, DedupeMemory: time.Minute, DedupeKeep: 100, MaxConvs: 100, TrimInterval: time.Hour,
		Backoff: 100 * time.Millisecond, BackoffMax: time.Second, OwnerRetry: 500 * time.Millisecond,
		NewID: func(time.Time) (string, error) { h.ids++; return fmt.Sprintf("m%d", h.ids), nil },
	}
	if mod != nil {
		mod(&cfg)
	}
	h.m = NewWriter(cfg, h.now)
	h.ready()
	return h
}

// ready collects what the writer asks.
func (h *harness) ready() Ready {
	rd := h.m.Ready()
	for _, a := range rd.Answers {
		if _, dup := h.answers[a.Call.ReqID]; dup {
			h.t.Fatalf("%s answered twice", a.Call.ReqID)
		}
		h.answers[a.Call.ReqID] = a
	}
	h.last = rd.Effect
	if rd.Effect != nil {
		h.effects = append(h.effects, rd.Effect)
	}
	return rd
}

func (h *harness) want(k EffectKind) *Effect {
	h.t.Helper()
	if h.last == nil || h.last.Kind != k {
		h.t.Fatalf("effect %v, want %s (phase %s)", h.last, k, h.m.Phase())
	}
	return h.last
}

// takeOver runs a session's takeover with an empty log tail.
func (h *harness) takeOver() {
	h.t.Helper()
	h.want(EffectOpenProducer)
	h.m.ProducerOpened(h.now, nil)
	h.ready()
	if e := h.want(EffectCommit); !e.Marker || len(e.Events) != 1 || e.Events[0].Kind != logrecord.KindTakeover || e.Events[0].Epoch != 7 {
		h.t.Fatalf("first commit %+v, want the takeover marker", e)
	}
	h.m.Committed(h.now, []int64{10}, nil)
	h.ready()
	h.want(EffectPersistOffset)
	h.m.PersistOffset(h.now, 11, true, nil)
	rd := h.ready()
	if !h.m.Accepting() || !rd.Notice.TookOver {
		h.t.Fatalf("phase %s after the takeover, want accepting", h.m.Phase())
	}
}

func (h *harness) submit(id string, cmd Command, deadline time.Time) {
	h.m.Submit(h.now, &Call{ReqID: id, Cmd: cmd, Deadline: deadline})
}

func (h *harness) tick() Ready {
	h.m.Tick(h.now)
	return h.ready()
}

// load answers a state load with conversation c1 (owner u1, members u1 u2)
// for every conversation asked.
func (h *harness) load() {
	h.t.Helper()
	e := h.want(EffectLoadState)
	convs := map[string]*Conv{}
	for _, c := range e.Convs {
		conv := NewConv()
		Apply(conv, &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: c, Seq: 1, Sender: "u1", Members: []string{"u1", "u2"}})
		convs[c] = conv
	}
	h.m.StateLoaded(h.now, convs, nil, nil)
	h.ready()
}

func send(conv, user, cmid string) Command {
	return Command{Op: protocol.OpSend, ConversationID: conv, Sender: user, ClientMessageID: cmid, Body: "hi"}
}

// The takeover order: open the producer, commit the marker, read persist's
// offset, read the tail up to the marker, load its conversations, then
// accept; a command queued meanwhile waits.
func TestWriterTakeoverOrder(t *testing.T) {
	h := newHarness(t, nil)
	h.submit("early", send("c1", "u1", "k0"), time.Time{})
	h.want(EffectOpenProducer)
	h.m.ProducerOpened(h.now, nil)
	h.ready()
	h.want(EffectCommit)
	h.m.Committed(h.now, []int64{40}, nil)
	h.ready()
	h.want(EffectPersistOffset)
	h.m.PersistOffset(h.now, 20, true, nil)
	h.ready()
	if e := h.want(EffectReadTail); e.From != 20 || e.FromStart || e.To != 40 {
		t.Fatalf("tail read %+v, want [20, 40)", e)
	}
	tail := []*logrecord.Event{
		{Kind: logrecord.KindCreate, ConversationID: "c1", Seq: 1, Sender: "u1", Members: []string{"u1", "u2"}},
		{Kind: logrecord.KindMessage, ConversationID: "c1", Seq: 2, Sender: "u2", ClientMessageID: "k9", MessageID: "old"},
	}
	h.m.TailRead(h.now, tail, nil)
	h.ready()
	if e := h.want(EffectLoadState); len(e.Convs) != 1 || e.Convs[0] != "c1" {
		t.Fatalf("load %+v, want c1", e)
	}
	if len(h.answers) != 0 {
		t.Fatalf("answered %v before accepting", h.answers)
	}
	h.m.StateLoaded(h.now, map[string]*Conv{"c1": NewConv()}, nil, nil)
	rd := h.ready()
	if !rd.Notice.TookOver || rd.Notice.Replayed != 2 || rd.Wake.IsZero() {
		t.Fatalf("notice %+v wake %v: want a takeover of 2 events and a wake-up for the queued command", rd.Notice, rd.Wake)
	}
	h.submit("retry", send("c1", "u2", "k9"), time.Time{})
	h.tick()
	// k9 is known from the tail; k0 is asked of durable state.
	if e := h.want(EffectLoadState); len(e.Convs) != 0 || len(e.Keys) != 1 || e.Keys[0] != (DedupeKey{"c1", "k0"}) {
		t.Fatalf("load %+v, want the lookup of k0 alone", e)
	}
	h.m.StateLoaded(h.now, nil, nil, nil)
	h.ready()
	e := h.want(EffectCommit)
	if len(e.Events) != 1 || e.Events[0].Seq != 3 {
		t.Fatalf("commit %+v, want the new message at seq 3", e.Events)
	}
	if len(h.answers) != 0 {
		t.Fatal("answered before the commit returned")
	}
	h.m.Committed(h.now, []int64{41}, nil)
	h.ready()
	if a := h.answers["early"]; a.Reply.Op != protocol.OpAccepted || a.Reply.Seq != 3 || !a.Wrote {
		t.Fatalf("early: %+v, want accepted at seq 3", a.Reply)
	}
	if a := h.answers["retry"]; a.Reply.Op != protocol.OpAccepted || a.Reply.Seq != 2 || a.Reply.MessageID != "old" || a.Wrote {
		t.Fatalf("retry: %+v, want its first result (seq 2)", a.Reply)
	}
}

// A batch that writes nothing still commits a marker before it answers
// from the writer's state; a fenced marker answers unavailable and the
// writer re-reads its owner row, ending when the row moved.
func TestWriterEmptyBatchCommitsMarker(t *testing.T) {
	h := newHarness(t, nil)
	h.takeOver()
	h.submit("s1", send("c1", "u9", "k1"), time.Time{}) // not a member: forbidden
	h.tick()
	h.load()
	if e := h.want(EffectCommit); len(e.Events) != 1 || e.Events[0].Kind != logrecord.KindTakeover {
		t.Fatalf("commit %+v, want a marker alone", e.Events)
	}
	h.m.Committed(h.now, nil, errors.New("fenced"))
	rd := h.ready()
	if a := h.answers["s1"]; a.Reply.Code != protocol.CodeUnavailable || a.Retry {
		t.Fatalf("s1: %+v, want unavailable (no retry elsewhere: the outcome is the writer's)", a)
	}
	if rd.Notice.Failed == nil || h.m.Phase() != PhaseBackoff || !rd.Wake.Equal(h.now.Add(100*time.Millisecond)) {
		t.Fatalf("phase %s wake %v failed %v, want a 100ms backoff", h.m.Phase(), rd.Wake, rd.Notice.Failed)
	}
	h.submit("s2", send("c1", "u1", "k2"), time.Time{})
	h.now = h.now.Add(100 * time.Millisecond)
	h.tick()
	h.want(EffectReadOwner)
	h.m.OwnerRead(h.now, false, nil)
	rd = h.ready()
	if !rd.Done {
		t.Fatal("writer whose row moved did not end")
	}
	if a := h.answers["s2"]; a.Reply.Code != protocol.CodeUnavailable || !a.Retry {
		t.Fatalf("s2: %+v, want unavailable with a retry elsewhere", a)
	}
}

// Without the fault, the writer answers nothing before its commit; with
// NoEmptyBatchMarker an empty batch answers without one.
func TestWriterNoEmptyBatchMarkerFault(t *testing.T) {
	h := newHarness(t, func(c *WriterConfig) { c.Faults.NoEmptyBatchMarker = true })
	h.takeOver()
	h.submit("s1", send("c1", "u9", "k1"), time.Time{})
	h.tick()
	h.load()
	if h.last != nil || h.answers["s1"].Reply == nil || h.answers["s1"].Reply.Code != protocol.CodeForbidden {
		t.Fatalf("effect %v answer %+v, want forbidden with no commit", h.last, h.answers["s1"])
	}
}

// A command that waited in the queue past its deadline (the gateway has
// told its client the outcome is unknown, and may have sent it again) is
// not decided: it is answered unavailable with a retry (nothing written)
// and the batch holds only the commands still in time.
func TestWriterExpiredQueuedCommandIsNotDecided(t *testing.T) {
	h := newHarness(t, nil)
	h.takeOver()
	h.submit("late1", send("c1", "u1", "k1"), h.now.Add(20*time.Millisecond))
	h.submit("ontime", send("c1", "u1", "k2"), h.now.Add(time.Minute))
	h.submit("late2", send("c1", "u1", "k3"), h.now.Add(20*time.Millisecond))
	h.submit("nolimit", send("c1", "u1", "k4"), time.Time{})
	h.now = h.now.Add(50 * time.Millisecond)
	h.tick()
	for _, id := range []string{"late1", "late2"} {
		if a := h.answers[id]; a.Reply == nil || !a.Retry || a.Reply.Code != protocol.CodeUnavailable {
			t.Fatalf("%s: %+v, want unavailable with a retry", id, a)
		}
	}
	h.load()
	if e := h.want(EffectCommit); len(e.Events) != 2 || e.Events[0].ClientMessageID != "k2" || e.Events[1].ClientMessageID != "k4" {
		t.Fatalf("commit %+v, want k2 and k4", e.Events)
	}
}

// A command collected in time whose deadline passes while the batch's
// state is loaded (a slow Postgres) is not decided either, and with
// nothing else decided nothing is committed.
func TestWriterCommandExpiredBeforeDecideIsNotDecided(t *testing.T) {
	h := newHarness(t, nil)
	h.takeOver()
	h.submit("k", Command{Op: protocol.OpKick, ConversationID: "c1", Sender: "u1", UserID: "u2"}, h.now.Add(10*time.Millisecond))
	h.tick()
	h.now = h.now.Add(time.Second)
	h.load()
	if h.last != nil {
		t.Fatalf("effect %+v, want none", h.last)
	}
	if a := h.answers["k"]; a.Reply == nil || a.Reply.Code != protocol.CodeUnavailable {
		t.Fatalf("answer %+v, want unavailable", a)
	}
	if _, still := h.m.convs["c1"].Members["u2"]; !still {
		t.Fatal("the expired kick was applied")
	}
}

// An unknown commit outcome answers the batch unavailable, never
// accepted, and ends the session; the next session replays.
func TestWriterUnknownCommitOutcome(t *testing.T) {
	h := newHarness(t, func(c *WriterConfig) { c.Backoff = 0 })
	h.takeOver()
	h.submit("a", send("c1", "u1", "k1"), time.Time{})
	h.tick()
	h.load()
	h.want(EffectCommit)
	h.m.Committed(h.now, nil, errors.New("EndTxn timed out"))
	h.ready()
	if a := h.answers["a"]; a.Reply.Code != protocol.CodeUnavailable || a.Wrote {
		t.Fatalf("answer %+v, want unavailable", a)
	}
	h.want(EffectReadOwner)
	h.m.OwnerRead(h.now, true, nil)
	h.ready()
	h.want(EffectOpenProducer)
	if h.m.convs != nil {
		t.Fatal("the failed session's state survived")
	}
}

// A state load that fails answers the batch unavailable with a retry and
// keeps the session.
func TestWriterStateLoadFailureKeepsSession(t *testing.T) {
	h := newHarness(t, nil)
	h.takeOver()
	h.submit("a", send("c1", "u1", "k1"), time.Time{})
	h.tick()
	h.want(EffectLoadState)
	h.m.StateLoaded(h.now, nil, nil, errors.New("postgres down"))
	rd := h.ready()
	if a := h.answers["a"]; !a.Retry || a.Reply.Code != protocol.CodeUnavailable || rd.Notice.StateErr == nil {
		t.Fatalf("answer %+v, want unavailable with a retry", a)
	}
	if !h.m.Accepting() {
		t.Fatalf("phase %s, want accepting", h.m.Phase())
	}
}

// Stop while a batch's commit is in flight lets it finish and answers the
// batch from its outcome; the queued commands are answered unavailable.
func TestWriterStopDuringCommit(t *testing.T) {
	h := newHarness(t, nil)
	h.takeOver()
	h.submit("a", send("c1", "u1", "k1"), time.Time{})
	h.tick()
	h.load()
	h.want(EffectCommit)
	h.submit("b", send("c1", "u1", "k2"), time.Time{})
	h.m.Stop(h.now)
	h.ready()
	if len(h.answers) != 0 {
		t.Fatalf("answered %v before the commit returned", h.answers)
	}
	h.m.Committed(h.now, []int64{50}, nil)
	rd := h.ready()
	if !rd.Done || h.answers["a"].Reply.Op != protocol.OpAccepted || h.answers["b"].Reply.Code != protocol.CodeUnavailable || !h.answers["b"].Retry {
		t.Fatalf("done %v answers %+v", rd.Done, h.answers)
	}
}

// The linger: a batch waits for the group commit's wait, or until it is
// full.
func TestWriterLinger(t *testing.T) {
	h := newHarness(t, func(c *WriterConfig) { c.Linger = 5 * time.Millisecond; c.MaxBatch = 3 })
	h.takeOver()
	h.submit("a", send("c1", "u1", "k1"), time.Time{})
	rd := h.tick()
	if h.last != nil || !rd.Wake.Equal(h.now.Add(5*time.Millisecond)) {
		t.Fatalf("effect %v wake %v, want a 5ms linger", h.last, rd.Wake)
	}
	h.submit("b", send("c1", "u1", "k2"), time.Time{})
	h.submit("c", send("c1", "u1", "k3"), time.Time{})
	h.tick()
	h.load()
	if e := h.want(EffectCommit); len(e.Events) != 3 {
		t.Fatalf("commit of %d events, want the full batch of 3", len(e.Events))
	}
}

// AcceptedBeforeCommit (a planted bug) answers when the commit is sent.
func TestWriterAcceptedBeforeCommitFault(t *testing.T) {
	h := newHarness(t, func(c *WriterConfig) { c.Faults.AcceptedBeforeCommit = true })
	h.takeOver()
	h.submit("a", send("c1", "u1", "k1"), time.Time{})
	h.tick()
	h.load()
	h.want(EffectCommit)
	if h.answers["a"].Reply == nil || h.answers["a"].Reply.Op != protocol.OpAccepted {
		t.Fatal("the planted bug did not answer before the commit")
	}
	h.m.Committed(h.now, nil, errors.New("fenced"))
	h.ready() // no second answer (ready fails the test on one)
}

// AcceptBeforeMarker (a planted bug) replays to the partition's end,
// accepts without a producer, and writes the marker last in its first
// commit.
func TestWriterAcceptBeforeMarkerFault(t *testing.T) {
	h := newHarness(t, func(c *WriterConfig) { c.Faults.AcceptBeforeMarker = true })
	h.want(EffectPersistOffset)
	h.m.PersistOffset(h.now, 5, true, nil)
	h.ready()
	if e := h.want(EffectReadTail); e.To >= 0 {
		t.Fatalf("tail to %d, want the partition's end", e.To)
	}
	h.m.TailRead(h.now, nil, nil)
	h.ready()
	if e := h.want(EffectLoadState); !e.AllOfVShard {
		t.Fatal("the broken order loads every conversation")
	}
	h.m.StateLoaded(h.now, map[string]*Conv{}, nil, nil)
	h.ready()
	h.submit("a", send("c1", "u1", "k1"), time.Time{})
	h.tick()
	h.load()
	e := h.want(EffectCommit)
	if !e.Open || len(e.Events) != 2 || e.Events[1].Kind != logrecord.KindTakeover {
		t.Fatalf("first commit %+v, want the producer opened and the marker last", e)
	}
}
