package sim

import (
	"slices"
	"testing"

	"github.com/chatpipe/chatpipe/protocol"
	"github.com/chatpipe/chatpipe/shardcore"
)

// reopenSchedule is the schedule of the issue doc.go describes: w0's
// marker commit reply is lost, w0 re-checks its row (still the owner) and
// freezes in the backoff before the next session; w1 takes over; w0 resumes
// and opens its producer without looking at the row again, which fences w1,
// and commits the create and u1's send after w1's marker. The send's reply
// is lost; the retry goes to w1, which never saw those commits and, persist
// lagging, answers forbidden without committing anything.
//
// It returns the world drained and checked, and the send op.
func reopenSchedule(t *testing.T, cfg Config) (*Result, *World, *op) {
	s := newScript(t, cfg)
	s.do("w0/v0@e1 open", "w0/v0@e1 marker, reply LOST", "w0/v0@e1 recheck")
	s.do("PAUSE w0")
	s.clock(10)
	s.do("coordinate", "manage w1")
	s.do("w1/v0@e2 open", "w1/v0@e2 marker", "w1/v0@e2 replay-offset", "w1/v0@e2 replay-tail")
	s.clock(1)
	send := s.w.issue(shardcore.Command{Op: protocol.OpSend, ConversationID: s.w.convs[0], Sender: "u1", ClientMessageID: "u1-x", Body: "hi"}, true)
	s.do("w0/v0@e1 open")
	if cfg.WhatIf.RecheckAtOpen {
		return s.w.finish(), s.w, send
	}
	s.do("w0/v0@e1 marker", "w0/v0@e1 replay-offset", "w0/v0@e1 replay-tail")
	s.deliver(1, true)       // the create
	s.deliver(send.id, true) // the send, routed by the gateway's old view
	s.do("w0/v0@e1 process", "w0/v0@e1 load", "w0/v0@e1 produce", "w0/v0@e1 commit")
	s.drop(send.id, false)
	s.do("gateway refresh")
	s.clock(int(cfg.ClientTimeout))
	s.do("retry op2")
	s.deliver(send.id, true)
	s.do("w1/v0@e2 process")
	return s.w.finish(), s.w, send
}

// TestKnownIssueFencedWriterAnswers reproduces an answer the log
// contradicts, as the writer gave it before the fix: a send that is
// committed gets a definitive `forbidden` on its retry (I4), from the
// legitimate owner whose producer a zombie re-opened over. The real order
// now (fence-checked answers) answers it with its first seq.
func TestKnownIssueFencedWriterAnswers(t *testing.T) {
	old := func() Config {
		cfg := oneShard()
		cfg.WhatIf.FenceCheckedAnswers, cfg.StrictAnswers = false, false
		return cfg
	}
	t.Run("before the fix", func(t *testing.T) {
		r, w, send := reopenSchedule(t, old())
		if r.Failed() {
			t.Fatalf("only counted, not a violation, without StrictAnswers:\n%s", r.Report(60))
		}
		if send.final.Op != protocol.OpRejected || send.final.Code != protocol.CodeForbidden {
			t.Fatalf("expected the retry to be rejected forbidden, got %+v", send.final)
		}
		if _, ok := w.firstMessage(send.cmd.ConversationID, "u1-x"); !ok {
			t.Fatal("the send should be committed")
		}
		if r.Stats.StaleAnswers == 0 || r.Stats.EpochRegressions == 0 {
			t.Fatalf("stale answers %d, epoch regressions %d; want both > 0", r.Stats.StaleAnswers, r.Stats.EpochRegressions)
		}
		t.Logf("committed at seq 2 by the zombie (epoch 1 after epoch 2's marker), retry answered %s: %s", send.final.Code, r.Stale)
	})
	t.Run("before the fix, strict", func(t *testing.T) {
		cfg := old()
		cfg.StrictAnswers = true
		r, _, _ := reopenSchedule(t, cfg)
		if ps := r.Properties(); !slices.Contains(ps, PropRetry) {
			t.Fatalf("strict answers should report %s, got %v", PropRetry, ps)
		}
	})
	t.Run("real order: fence-checked answers", func(t *testing.T) {
		r, _, send := reopenSchedule(t, oneShard())
		if r.Failed() || send.final.Op != protocol.OpAccepted || send.final.Seq != 2 {
			t.Fatalf("want the retry accepted with seq 2 and no violation, got %+v\n%s", send.final, r.Report(60))
		}
	})
	t.Run("what-if recheck at open", func(t *testing.T) {
		cfg := old()
		cfg.StrictAnswers, cfg.WhatIf.RecheckAtOpen = true, true
		r, _, _ := reopenSchedule(t, cfg)
		if r.Failed() || r.Stats.EpochRegressions != 0 {
			t.Fatalf("want no violation and no epoch regression:\n%s", r.Report(60))
		}
	})
}
