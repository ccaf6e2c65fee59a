package loadcheck

import (
	"fmt"
	"strings"
	"testing"

	"github.com/chatpipe/chatpipe/tools/loadgen"
)

// fixture is a small consistent run: conversation c1 created by a with b
// and c; a and b send; c leaves at seq 6; a sends once more at seq 7.
func fixture() (*loadgen.RunDir, *World) {
	run := &loadgen.RunDir{
		Info:   loadgen.RunInfo{Run: "t", Plan: loadgen.Plan{Users: []string{"a", "b", "c"}, Devices: 1}},
		Report: loadgen.Report{Status: loadgen.StatusFinished, DeliveryMode: "served"},
	}
	w := &World{}
	add := func(e Event, sent int64) {
		e.Conv, e.MessageID, e.Offset = "c1", fmt.Sprintf("M%d", e.Seq), e.Seq
		w.Log = append(w.Log, e)
		w.DB = append(w.DB, e)
		op := map[string]string{"create": "create", "message": "send", "leave": "leave"}[e.Kind]
		run.Accepted = append(run.Accepted, loadgen.Accepted{Op: op, Conv: "c1", Seq: e.Seq, MessageID: e.MessageID,
			ClientMessageID: e.ClientMessageID, Sender: e.Sender, Sent: sent, At: sent + 5})
	}
	add(Event{Seq: 1, Kind: "create", Sender: "a", Members: []string{"a", "b", "c"}}, 10)
	for s := int64(2); s <= 5; s++ {
		add(Event{Seq: s, Kind: "message", Sender: []string{"a", "b"}[s%2], ClientMessageID: fmt.Sprintf("m%d", s)}, 10*s)
	}
	add(Event{Seq: 6, Kind: "leave", Sender: "c", UserID: "c"}, 60)
	add(Event{Seq: 7, Kind: "message", Sender: "a", ClientMessageID: "m7"}, 70)
	for _, u := range []string{"a", "b", "c"} {
		last := int64(7)
		if u == "c" {
			last = 6
		}
		for s := int64(1); s <= last; s++ {
			run.Delivered = append(run.Delivered, loadgen.Delivered{Device: u + "/0", Conv: "c1", Seq: s, MessageID: fmt.Sprintf("M%d", s)})
		}
	}
	return run, w
}

func rules(r *Result) string {
	seen := map[string]bool{}
	var out []string
	for _, v := range r.Violations {
		if !seen[v.Rule] {
			seen[v.Rule] = true
			out = append(out, v.Rule)
		}
	}
	return strings.Join(out, ",")
}

func TestCheckPassesAConsistentRun(t *testing.T) {
	run, w := fixture()
	if res := Check(run, w); !res.OK() {
		t.Fatalf("violations on a consistent run:\n%s", res.Text())
	}
}

func TestCheckFindsEachBrokenInvariant(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(run *loadgen.RunDir, w *World)
		want   []string
	}{
		{"event removed from postgres", func(run *loadgen.RunDir, w *World) { w.DB = append(w.DB[:3], w.DB[4:]...) },
			[]string{RuleNotInDB, RuleLogVsDB}},
		{"seq duplicated in the answers", func(run *loadgen.RunDir, w *World) {
			a := run.Accepted[3]
			a.MessageID, a.ClientMessageID = "MX", "mx"
			run.Accepted = append(run.Accepted, a)
		}, []string{RuleCollision}},
		{"seq duplicated in the log", func(run *loadgen.RunDir, w *World) {
			e := w.Log[3]
			e.MessageID, e.Offset = "MX", 99
			w.Log = append(w.Log, e)
		}, []string{RuleCollision, RuleRegression}},
		{"seq_conflicts rows", func(run *loadgen.RunDir, w *World) { w.SeqConflicts = 1 }, []string{RuleCollision}},
		{"accepted event missing from the log", func(run *loadgen.RunDir, w *World) { w.Log = w.Log[:len(w.Log)-1] },
			[]string{RuleNotInLog, RuleLogVsDB}},
		{"a retry got another seq", func(run *loadgen.RunDir, w *World) {
			a := run.Accepted[2]
			a.Seq, a.MessageID = 8, "M8"
			run.Accepted = append(run.Accepted, a)
		}, []string{RuleDuplicate}},
		{"a message after the sender left", func(run *loadgen.RunDir, w *World) {
			e := Event{Conv: "c1", Seq: 8, Kind: "message", MessageID: "M8", Sender: "c", ClientMessageID: "late", Offset: 8}
			w.Log, w.DB = append(w.Log, e), append(w.DB, e)
			for _, u := range []string{"a", "b"} {
				run.Delivered = append(run.Delivered, loadgen.Delivered{Device: u + "/0", Conv: "c1", Seq: 8, MessageID: "M8"})
			}
		}, []string{RuleRemovedSender}},
		{"a rejected send was stored", func(run *loadgen.RunDir, w *World) {
			run.Rejected = append(run.Rejected, loadgen.Rejected{Op: "send", Conv: "c1", ClientMessageID: "m7", Sender: "a", Code: "forbidden"})
		}, []string{RuleRejectedStored}},
		{"seq went back for a later send", func(run *loadgen.RunDir, w *World) {
			run.Accepted[6].Sent = 1000                           // m7 (seq 7) sent after m5 (seq 5) was accepted: fine
			run.Accepted[4].Sent, run.Accepted[4].At = 2000, 2005 // m5 sent after seq 7 was accepted, yet got 5
		}, []string{RuleRegression}},
		{"a device missed an event", func(run *loadgen.RunDir, w *World) { run.Delivered = run.Delivered[1:] },
			[]string{RuleConverged}},
		{"a removed member got a later event", func(run *loadgen.RunDir, w *World) {
			run.Delivered = append(run.Delivered, loadgen.Delivered{Device: "c/0", Conv: "c1", Seq: 7, MessageID: "M7"})
		}, []string{RuleConverged}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run, w := fixture()
			tc.break_(run, w)
			res := Check(run, w)
			got := rules(res)
			for _, want := range tc.want {
				if !strings.Contains(got, want) {
					t.Errorf("want a %s violation, got %q:\n%s", want, got, res.Text())
				}
			}
			if res.OK() {
				t.Errorf("the check passed")
			}
		})
	}
}

func TestJoinOfACurrentMember(t *testing.T) {
	run, w := fixture()
	// b is already a member: the join writes nothing and names seq 1.
	run.Accepted = append(run.Accepted, loadgen.Accepted{Op: "join", Conv: "c1", Seq: 1, Sender: "a", UserID: "b"})
	if res := Check(run, w); !res.OK() {
		t.Fatalf("violations:\n%s", res.Text())
	}
	run.Accepted = append(run.Accepted, loadgen.Accepted{Op: "join", Conv: "c1", Seq: 2, Sender: "a", UserID: "b"})
	if res := Check(run, w); res.OK() {
		t.Fatal("a join answered with a seq that does not add the user passed")
	}
}

func TestConvergenceSkippedOnlyWithoutDelivery(t *testing.T) {
	run, w := fixture()
	run.Delivered = nil
	run.Report.DeliveryMode = "not served"
	res := Check(run, w)
	if !res.OK() || len(res.Skipped) != 1 {
		t.Fatalf("want a pass with convergence skipped:\n%s", res.Text())
	}
	run.Report.DeliveryMode = "served"
	if res := Check(run, w); res.OK() {
		t.Fatal("a served run with no deliveries passed")
	}
}

func TestWindows(t *testing.T) {
	log := map[string][]Event{"c": {
		{Seq: 1, Kind: "create", Sender: "a", Members: []string{"a", "b"}},
		{Seq: 3, Kind: "kick", Sender: "a", UserID: "b"},
		{Seq: 5, Kind: "join", Sender: "a", UserID: "b"},
		{Seq: 6, Kind: "leave", Sender: "b", UserID: "b"},
	}}
	got := fmt.Sprint(windows(log)["c"]["b"])
	if got != "[{1 3} {5 6}]" {
		t.Fatalf("windows of b: %s", got)
	}
	if a := windows(log)["c"]["a"]; len(a) != 1 || !a[0].has(100) {
		t.Fatalf("a is a member throughout: %v", a)
	}
}

// TestDuplicateSentLateIsNoRegression: a message is sent when its first
// copy is. A duplicate from another device of the sender (or a re-send)
// that goes out after later messages were accepted rightly gets the first
// copy's seq, which is lower than theirs: not a regression (the soak's
// reconnects and duplicates made exactly this, three times in 1.4 M).
func TestDuplicateSentLateIsNoRegression(t *testing.T) {
	run, w := fixture()
	dup := run.Accepted[2]                     // m3, seq 3, sent at 30
	dup.Sent, dup.At, dup.Dup = 100, 105, true // after m5 (seq 5) was accepted at 55
	run.Accepted = append(run.Accepted, dup)
	if res := Check(run, w); !res.OK() {
		t.Fatalf("a late duplicate counted as a regression:\n%s", res.Text())
	}
}

// The overload run's seq-regression: a message's first copy was given up
// (its re-send refused, its answer never heard) though it took seq 3; its
// duplicate from the sender's other device went out after m5 was
// accepted and got seq 3 by dedupe. The message was sent when the
// given-up copy was.
func TestGivenUpFirstCopyIsWhenTheMessageWasSent(t *testing.T) {
	for _, sent := range []int64{30, 0} { // 0: a record from before the field
		run, w := fixture()
		a := &run.Accepted[2] // m3, seq 3, sent at 30
		a.Sent, a.At, a.Dup = 100, 105, true
		run.GaveUp = append(run.GaveUp, loadgen.GaveUp{Op: "send", Conv: "c1", ClientMessageID: "m3", Sender: a.Sender, Attempts: 1, Why: loadgen.GaveUpBudget, Sent: sent})
		if res := Check(run, w); !res.OK() {
			t.Fatalf("sent %d: a given-up first copy counted as a regression:\n%s", sent, res.Text())
		}
	}
	// Without the given-up copy it is one.
	run, w := fixture()
	run.Accepted[2].Sent, run.Accepted[2].At = 100, 105
	if res := Check(run, w); res.OK() {
		t.Fatal("a real regression passed")
	}
}
