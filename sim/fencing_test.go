package sim

import (
	"testing"

	"github.com/chatpipe/chatpipe/protocol"
)

// TestPausedWriterIsFenced is the fixed schedule that proves the fence is
// exercised: w0 produces a batch, freezes with it uncommitted for longer
// than its lease, w1 takes the vshard over (InitProducer fences w0 and
// aborts its transaction), w0 resumes and tries to commit. The commit must
// be fenced, the client must hear unavailable, and its retry must get the
// one result, written by w1.
func TestPausedWriterIsFenced(t *testing.T) {
	s := newScript(t, oneShard())
	s.do("w0/v0@e1 open", "w0/v0@e1 marker", "w0/v0@e1 replay-offset", "w0/v0@e1 replay-tail")
	s.deliver(1, true) // u0's create reaches w0's mailbox
	s.do("w0/v0@e1 process", "w0 load", "w0/v0@e1 produce")
	s.do("PAUSE w0") // frozen with the batch produced, not committed
	s.clock(10)      // w0's lease runs out
	s.do("coordinate", "manage w1")
	s.do("w1/v0@e2 open", "w1/v0@e2 marker", "w1/v0@e2 replay-offset", "w1/v0@e2 replay-tail")
	s.clock(1) // w0 resumes and goes on where it was
	s.do("w0/v0@e1 commit")
	if got := s.w.stats.FencedCommits; got != 1 {
		t.Fatalf("the resumed writer's commit was not fenced (fenced commits %d)", got)
	}
	r := s.w.finish()
	if r.Failed() {
		t.Fatalf("properties broken:\n%s", r.Report(100))
	}
	create := s.w.ops[0]
	if create.final.Op != protocol.OpAccepted || create.final.Seq != 1 {
		t.Fatalf("create answered %+v, want accepted seq 1", create.final)
	}
	if rec, ok := s.w.log.CommittedAt(create.cmd.ConversationID, 1); !ok || rec.Event.Epoch != 2 {
		t.Fatalf("seq 1 should be w1's (epoch 2): %+v", rec)
	}
	t.Logf("fenced writes %d, fenced commits %d; create retried %d times", r.Stats.FencedWrites, r.Stats.FencedCommits, create.retryCount)
}
