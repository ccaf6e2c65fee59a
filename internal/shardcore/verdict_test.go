package shardcore

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// settle runs the batch the writer asked for to its end: every state load
// is answered by state (nil: the harness's c1, owner u1, members u1 u2),
// every commit succeeds, and every housekeeping pass finds persist caught
// up.
func (h *harness) settle(state func(cid string) *Conv) {
	h.t.Helper()
	for off := int64(100); h.last != nil; off++ {
		switch e := h.last; e.Kind {
		case EffectLoadState:
			if state == nil {
				h.load()
				continue
			}
			convs := map[string]*Conv{}
			for _, cid := range e.Convs {
				convs[cid] = state(cid)
			}
			h.m.StateLoaded(h.now, convs, nil, nil)
		case EffectCommit:
			offs := make([]int64, len(e.Events))
			for i := range offs {
				offs[i] = off
				off++
			}
			h.m.Committed(h.now, offs, nil)
		case EffectPersistOffset:
			h.m.PersistOffset(h.now, 1<<40, true, nil)
		default:
			h.t.Fatalf("unexpected effect %v in phase %s", e.Kind, h.m.Phase())
		}
		h.ready()
	}
}

// run submits cmds as one batch (ids r0, r1, … after prefix) and settles it.
func (h *harness) run(prefix string, state func(cid string) *Conv, cmds ...Command) {
	h.t.Helper()
	for i, c := range cmds {
		h.submit(fmt.Sprintf("%s%d", prefix, i), c, time.Time{})
	}
	h.tick()
	h.settle(state)
}

// committed lists the conversation events the writer committed (markers
// left out), in order.
func (h *harness) committed() []*logrecord.Event {
	var out []*logrecord.Event
	for _, e := range h.effects {
		if e.Kind != EffectCommit {
			continue
		}
		for _, ev := range e.Events {
			if ev.Kind != logrecord.KindTakeover {
				out = append(out, ev)
			}
		}
	}
	return out
}

func (h *harness) accepted(id string, seq int64) {
	h.t.Helper()
	a, ok := h.answers[id]
	if !ok || a.Reply.Op != protocol.OpAccepted || a.Reply.Seq != seq || a.Wrote {
		h.t.Fatalf("%s: %+v (answered %v), want accepted at seq %d without a write", id, a.Reply, ok, seq)
	}
}

// A keyed join of a current member answers accepted and writes nothing;
// another attempt of that key, after the user left or was kicked, gets the
// same answer and does not add them again: one command, one effect.
func TestWriterRetriedNoopJoinDoesNotAddAgain(t *testing.T) {
	join := Command{Op: protocol.OpJoin, ConversationID: "c1", Sender: "u1", UserID: "u2", ClientMessageID: "j1"}
	t.Run("after a leave", func(t *testing.T) {
		h := newHarness(t, nil)
		h.takeOver()
		h.run("a", nil, join)
		h.accepted("a0", 1)
		h.run("b", nil, Command{Op: protocol.OpLeave, ConversationID: "c1", Sender: "u2"})
		h.now = h.now.Add(10 * time.Second)
		h.run("c", nil, join)
		if evs := h.committed(); len(evs) != 1 || evs[0].Kind != logrecord.KindLeave {
			t.Fatalf("committed %v, want the leave alone", kinds(evs))
		}
		h.accepted("c0", 1)
		if _, in := h.m.convs["c1"].Members["u2"]; in {
			t.Fatal("the retried join added u2 again")
		}
	})
	t.Run("after a kick, in one batch", func(t *testing.T) {
		h := newHarness(t, nil)
		h.takeOver()
		h.run("a", nil, join, Command{Op: protocol.OpKick, ConversationID: "c1", Sender: "u1", UserID: "u2"}, join)
		if evs := h.committed(); len(evs) != 1 || evs[0].Kind != logrecord.KindKick {
			t.Fatalf("committed %v, want the kick alone", kinds(evs))
		}
		h.accepted("a0", 1)
		h.accepted("a2", 1)
	})
}

func kinds(evs []*logrecord.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, fmt.Sprintf("%s@%d", e.Kind, e.Seq))
	}
	return out
}

// Refused commands to many conversations do not pin them: the cache stays
// within MaxConvs (persist being caught up), and a refusal still answers
// another attempt of its key after its conversation's state was evicted
// and loaded again — even from a state that would now accept it.
func TestWriterRefusalsDoNotPinConversations(t *testing.T) {
	const maxConvs = 8
	h := newHarness(t, func(c *WriterConfig) { c.MaxConvs, c.TrimInterval = maxConvs, 0 })
	h.takeOver()
	for i := range 5 * maxConvs {
		cid := fmt.Sprintf("r%d", i)
		h.run(cid+"-", nil, send(cid, "u9", "k"+cid)) // u9 is no member: forbidden
		if a := h.answers[cid+"-0"]; a.Reply.Code != protocol.CodeForbidden {
			t.Fatalf("%s: %+v, want forbidden", cid, a.Reply)
		}
		if n := len(h.m.convs); n > maxConvs {
			t.Fatalf("after %d refused conversations %d are cached, MaxConvs is %d", i+1, n, maxConvs)
		}
	}
	if _, cached := h.m.convs["r0"]; cached {
		t.Fatal("r0 is still cached")
	}
	// u9 is a member now, as far as the state loaded says.
	withU9 := func(cid string) *Conv {
		conv := NewConv()
		Apply(conv, &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: cid, Seq: 1, Sender: "u1", Members: []string{"u1", "u9"}})
		return conv
	}
	h.now = h.now.Add(30 * time.Second)
	h.run("again-", withU9, send("r0", "u9", "kr0"))
	if a := h.answers["again-0"]; a.Reply.Code != protocol.CodeForbidden || a.Wrote {
		t.Fatalf("retry of the refused key after eviction: %+v, want forbidden", a.Reply)
	}
	if evs := h.committed(); len(evs) != 0 {
		t.Fatalf("committed %v", kinds(evs))
	}
}

// A batch that fails tells each of its commands what it may do: one whose
// event was in a commit of unknown outcome may be sent again with the same
// ids only when it carries a key (or is a read marker); an unkeyed
// membership command is told the outcome is unknown; one that wrote
// nothing is told so.
func TestWriterFailedBatchSaysWhatToRetry(t *testing.T) {
	t.Run("unknown commit outcome", func(t *testing.T) {
		h := newHarness(t, nil)
		h.takeOver()
		cmds := map[string]Command{
			"join":     {Op: protocol.OpJoin, ConversationID: "c1", Sender: "u1", UserID: "u3"},
			"kjoin":    {Op: protocol.OpJoin, ConversationID: "c1", Sender: "u1", UserID: "u4", ClientMessageID: "j4"},
			"send":     send("c1", "u1", "m1"),
			"read":     {Op: protocol.OpRead, ConversationID: "c1", Sender: "u2", Seq: 1},
			"create":   {Op: protocol.OpCreate, ConversationID: "c2", Sender: "u1"},
			"kick-nf":  {Op: protocol.OpKick, ConversationID: "c1", Sender: "u1", UserID: "u9"},
			"leave-nf": {Op: protocol.OpLeave, ConversationID: "c1", Sender: "u9"},
		}
		for _, id := range []string{"join", "kjoin", "send", "read", "create", "kick-nf", "leave-nf"} {
			h.submit(id, cmds[id], time.Time{})
		}
		h.tick()
		e := h.want(EffectLoadState)
		convs := map[string]*Conv{}
		for _, cid := range e.Convs {
			conv := NewConv()
			if cid == "c1" {
				Apply(conv, &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: cid, Seq: 1, Sender: "u1", Members: []string{"u1", "u2"}})
			}
			convs[cid] = conv
		}
		h.m.StateLoaded(h.now, convs, nil, nil)
		h.ready()
		h.want(EffectCommit)
		h.m.Committed(h.now, nil, errors.New("EndTxn timed out"))
		h.ready()
		want := map[string]string{
			"join": "unknown", "create": "unknown",
			"kjoin": "same ids", "send": "same ids", "read": "same ids",
			"kick-nf": "nothing", "leave-nf": "nothing",
		}
		for _, id := range []string{"join", "kjoin", "send", "read", "create", "kick-nf", "leave-nf"} {
			checkFailed(t, h, id, want[id])
		}
	})
	t.Run("no message id", func(t *testing.T) {
		h := newHarness(t, nil)
		h.takeOver()
		h.m.cfg.NewID = func(time.Time) (string, error) { return "", errors.New("no entropy") }
		h.submit("join", Command{Op: protocol.OpJoin, ConversationID: "c1", Sender: "u1", UserID: "u3"}, time.Time{})
		h.tick()
		h.load()
		checkFailed(t, h, "join", "nothing")
	})
}

// checkFailed checks that call id of a failed batch was answered
// unavailable (no retry elsewhere) with a message of kind want: "unknown"
// (look before sending again), "same ids" (retry with the same ids), or
// "nothing" (nothing was written; retry).
func checkFailed(t *testing.T, h *harness, id, want string) {
	t.Helper()
	a, ok := h.answers[id]
	if !ok || a.Reply.Code != protocol.CodeUnavailable || a.Wrote || a.Retry || a.Reply.RetryAfterMS <= 0 {
		t.Fatalf("%s: %+v (answered %v), want unavailable with retry_after_ms", id, a.Reply, ok)
	}
	msg := a.Reply.Message
	var good bool
	switch want {
	case "unknown":
		good = strings.Contains(msg, "outcome of this command is unknown") && !strings.Contains(msg, "same ids")
	case "same ids":
		good = strings.Contains(msg, "retry with the same ids") && !strings.Contains(msg, "nothing was written")
	case "nothing":
		good = strings.Contains(msg, "nothing was written")
	}
	if !good {
		t.Errorf("%s: %q, want a %q message", id, msg, want)
	}
}

// BenchmarkWriterBatch is the writer's cost of one batch of 100 sends to
// 10 cached conversations, a tenth of them refused (the sender is no
// member), each with a fresh key (looked up, found nowhere), from Submit
// to the answers.
func BenchmarkWriterBatch(b *testing.B) {
	now := time.Unix(1_700_000_000, 0)
	ids := 0
	m := NewWriter(WriterConfig{
		VShard: 3, Epoch: 7, Worker: "w1", Limits: Limits{MaxMembers: 10}, MaxBatch: 100,
		RefusalMemory: time.Minute, DedupeMemory: time.Minute, DedupeKeep: 100, MaxConvs: 1000, TrimInterval: time.Second,
		NewID: func(time.Time) (string, error) { ids++; return fmt.Sprintf("m%d", ids), nil },
	}, now)
	off := int64(10)
	settle := func() int {
		n := 0
		for rd := m.Ready(); ; rd = m.Ready() {
			n += len(rd.Answers)
			if rd.Effect == nil {
				return n
			}
			switch e := rd.Effect; e.Kind {
			case EffectOpenProducer:
				m.ProducerOpened(now, nil)
			case EffectLoadState:
				convs := map[string]*Conv{}
				for _, cid := range e.Convs {
					conv := NewConv()
					Apply(conv, &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: cid, Seq: 1, Sender: "u0", Members: []string{"u0", "u1", "u2", "u3"}})
					convs[cid] = conv
				}
				m.StateLoaded(now, convs, nil, nil)
			case EffectCommit:
				offs := make([]int64, len(e.Events))
				for i := range offs {
					offs[i] = off
					off++
				}
				m.Committed(now, offs, nil)
			case EffectPersistOffset:
				m.PersistOffset(now, off, true, nil)
			default:
				b.Fatalf("effect %v", e.Kind)
			}
		}
	}
	settle()
	calls := make([]Call, 100)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now = now.Add(100 * time.Millisecond)
		for j := range calls {
			sender := fmt.Sprint("u", j%4)
			if j%10 == 9 {
				sender = "u9"
			}
			calls[j] = Call{ReqID: "r", Cmd: Command{Op: protocol.OpSend, ConversationID: fmt.Sprint("c", j%10), Sender: sender,
				ClientMessageID: fmt.Sprintf("k%d-%d", i, j), Body: "hi"}}
			m.Submit(now, &calls[j])
		}
		m.Tick(now)
		if n := settle(); n != len(calls) {
			b.Fatalf("%d answers for %d calls", n, len(calls))
		}
	}
}

// The writer remembers at most MaxVerdicts answers: when full, the oldest
// is forgotten first (and counted), and its key is decided again.
func TestWriterVerdictsAreBounded(t *testing.T) {
	h := newHarness(t, func(c *WriterConfig) { c.MaxVerdicts = 3 })
	h.takeOver()
	dropped := 0
	for i := range 5 {
		h.submit(fmt.Sprint("s", i), send("c1", "u9", fmt.Sprint("k", i)), time.Time{})
		h.tick()
		for h.last != nil {
			switch h.last.Kind {
			case EffectLoadState:
				h.load()
			case EffectCommit:
				h.m.Committed(h.now, []int64{int64(20 + i)}, nil)
				dropped += h.ready().Notice.VerdictsDropped
			default:
				h.housekeep()
			}
		}
	}
	if n := h.m.verdicts.len(); n != 3 || dropped != 2 {
		t.Fatalf("%d verdicts held, %d dropped; want 3 and 2", n, dropped)
	}
	// u9 is a member now: k0's refusal was forgotten, k4's stands.
	withU9 := func(cid string) *Conv {
		conv := NewConv()
		Apply(conv, &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: cid, Seq: 1, Sender: "u1", Members: []string{"u1", "u9"}})
		return conv
	}
	delete(h.m.convs, "c1")
	h.run("again", withU9, send("c1", "u9", "k0"), send("c1", "u9", "k4"))
	if a := h.answers["again0"]; a.Reply.Op != protocol.OpAccepted || !a.Wrote {
		t.Fatalf("k0 after its verdict was dropped: %+v, want decided again", a.Reply)
	}
	if a := h.answers["again1"]; a.Reply.Code != protocol.CodeForbidden {
		t.Fatalf("k4: %+v, want its remembered refusal", a.Reply)
	}
}

// A verdict is remembered only once its batch is answered: a batch whose
// commit fails forgets the verdicts it decided (its state held events
// that may never have been committed), while those of earlier batches
// stand in the next session of the same writer.
func TestWriterFailedBatchForgetsItsVerdicts(t *testing.T) {
	h := newHarness(t, nil)
	h.takeOver()
	h.run("a", nil, send("c1", "u9", "r1")) // refused, answered
	joinK1 := Command{Op: protocol.OpJoin, ConversationID: "c1", Sender: "u1", UserID: "u3", ClientMessageID: "k1"}
	joinK2 := Command{Op: protocol.OpJoin, ConversationID: "c1", Sender: "u1", UserID: "u3", ClientMessageID: "k2"}
	h.submit("b0", joinK1, time.Time{}) // adds u3
	h.submit("b1", joinK2, time.Time{}) // a member by b0: nothing to do
	h.tick()
	h.settleLoads()
	h.want(EffectCommit)
	h.m.Committed(h.now, nil, errors.New("EndTxn timed out"))
	h.ready()
	checkFailed(t, h, "b1", "nothing")
	if n := h.m.verdicts.len(); n != 1 {
		t.Fatalf("%d verdicts held, want the first batch's refusal alone", n)
	}
	h.now = h.now.Add(100 * time.Millisecond)
	h.tick()
	h.want(EffectReadOwner)
	h.m.OwnerRead(h.now, true, nil)
	h.ready()
	h.takeOver()
	// The join of b0 did not commit (durable state has no u3; u9 is a
	// member now).
	withU9 := func(cid string) *Conv {
		conv := NewConv()
		Apply(conv, &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: cid, Seq: 1, Sender: "u1", Members: []string{"u1", "u2", "u9"}})
		return conv
	}
	h.run("c", withU9, joinK2, send("c1", "u9", "r1"))
	if a := h.answers["c0"]; a.Reply.Op != protocol.OpAccepted || !a.Wrote {
		t.Fatalf("k2 in the next session: %+v, want decided again (u3 added)", a.Reply)
	}
	if a := h.answers["c1"]; a.Reply.Code != protocol.CodeForbidden {
		t.Fatalf("r1 in the next session: %+v, want its refusal", a.Reply)
	}
}

// settleLoads answers the state loads asked for with the harness's c1.
func (h *harness) settleLoads() {
	for h.last != nil && h.last.Kind == EffectLoadState {
		h.load()
	}
}

// A retry that a remembered refusal answers costs the conversation's
// message bucket nothing, like one that dedupe answers.
func TestWriterRememberedRefusalCostsNoToken(t *testing.T) {
	h := newHarness(t, func(c *WriterConfig) { c.ConvRate, c.ConvBurst = 1e-9, 1 })
	h.takeOver()
	h.run("a", nil, send("c1", "u9", "k1")) // forbidden; takes the one token
	h.run("b", nil, send("c1", "u9", "k1"))
	if a := h.answers["b0"]; a.Reply.Code != protocol.CodeForbidden {
		t.Fatalf("retry: %+v, want its refusal", a.Reply)
	}
}

// BenchmarkVerdictMemory reports the heap one remembered refusal costs
// (a 20-byte client_message_id, a short conversation and user id, its
// rejection's message), the figure MaxVerdicts' default is sized with.
func BenchmarkVerdictMemory(b *testing.B) {
	const n = 10000
	now := time.Unix(0, 0)
	var before, after runtime.MemStats
	for i := 0; i < b.N; i++ {
		runtime.GC()
		runtime.ReadMemStats(&before)
		var tb verdictTable
		for j := 0; j < n; j++ {
			cid, user := fmt.Sprintf("conv-%d", j%1000), fmt.Sprintf("user-%d", j%100)
			e := protocol.Errorf(protocol.CodeForbidden, "%s is not a member of %s", user, cid)
			tb.put(DedupeKey{cid, fmt.Sprintf("m-%018d", j)}, Verdict{Sender: user, Op: protocol.OpSend, Err: e, At: now}, now, n)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/entry")
		runtime.KeepAlive(&tb)
	}
}
