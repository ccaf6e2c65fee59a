package sim

import (
	"slices"
	"testing"

	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/protocol"
)

// reopenSchedule is the schedule of interleaving 1 in doc.go's "Answers
// that write nothing": w0's marker commit reply is lost, w0 re-checks its
// row (still the owner) and freezes in the backoff before the next
// session; w1 takes over; w0 resumes and opens its producer without
// looking at the row again, which fences w1, and commits the create and
// u1's send after w1's marker. The send's reply is lost; the retry goes to
// w1, which never saw those commits and, persist lagging, answers
// forbidden without committing anything.
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
	if !cfg.WhatIf.NoMarkerConfirm {
		// The marker reads the owner row before it commits: the zombie's
		// marker is aborted, and it re-checks and ends.
		s.do("w0/v0@e1 marker")
		return s.w.finish(), s.w, send
	}
	s.do("w0/v0@e1 marker", "w0/v0@e1 replay-offset", "w0/v0@e1 replay-tail")
	s.deliver(1, true)       // the create
	s.deliver(send.id, true) // the send, routed by the gateway's old view
	s.do("w0/v0@e1 process", "w0 load", "w0/v0@e1 produce", "w0/v0@e1 commit")
	s.drop(send.id, false)
	s.do("gateway refresh")
	s.clock(int(cfg.ClientTimeout))
	s.do("retry op2")
	s.deliver(send.id, true)
	s.do("w1/v0@e2 process")
	return s.w.finish(), s.w, send
}

// TestKnownIssueFencedWriterAnswers reproduces an answer the log
// contradicts, as a writer without fence-checked answers gives it: a send
// that is committed gets a definitive `forbidden` on its retry (I4), from
// the legitimate owner whose producer a zombie re-opened over. The real
// order (fence-checked answers) answers it with its first seq.
func TestKnownIssueFencedWriterAnswers(t *testing.T) {
	// Without fence-checked answers and without the marker's confirm: the
	// zombie's marker commits after the new owner's.
	old := func() Config {
		cfg := oneShard()
		cfg.WhatIf.FenceCheckedAnswers, cfg.StrictAnswers, cfg.WhatIf.NoMarkerConfirm = false, false, true
		return cfg
	}
	t.Run("before the fix", func(t *testing.T) {
		r, w, send := reopenSchedule(t, old())
		if ps := r.Properties(); !slices.Equal(ps, []string{PropOwnerEpochs}) {
			t.Fatalf("only the epoch order is a violation (the stale answer only counted) without StrictAnswers, got %v:\n%s", ps, r.Report(60))
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
	t.Run("fence-checked answers, before the marker's confirm", func(t *testing.T) {
		cfg := oneShard()
		cfg.WhatIf.NoMarkerConfirm = true
		r, _, send := reopenSchedule(t, cfg)
		if ps := r.Properties(); !slices.Equal(ps, []string{PropOwnerEpochs}) || send.final.Op != protocol.OpAccepted || send.final.Seq != 2 {
			t.Fatalf("want the retry accepted with seq 2 and only the epoch order violated, got %+v %v\n%s", send.final, ps, r.Report(60))
		}
	})
	t.Run("real order: the marker confirms the owner row", func(t *testing.T) {
		r, _, send := reopenSchedule(t, oneShard())
		if r.Failed() || r.Stats.EpochRegressions != 0 || send.final.Op != protocol.OpAccepted {
			t.Fatalf("want no violation, no epoch regression and the send accepted, got %+v\n%s", send.final, r.Report(60))
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
