package worldcheck

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/chatpipe/chatpipe/logrecord"
)

// layout is the fixture's stack: 4 hashed vshards over 2 partitions and
// one dedicated vshard (4) with partition 2.
var layout = logrecord.Layout{VShards: 4, Partitions: 2, Dedicated: 1}

// ev makes an event of conversation c1.
func ev(seq int64, kind, sender, cmid string) Event {
	return Event{Event: logrecord.Event{ConversationID: "c1", Seq: seq, Kind: kind, MessageID: fmt.Sprintf("M%d", seq),
		ClientMessageID: cmid, Sender: sender}}
}

// fixture is a small consistent world and run: conversation c1 created by
// a with b and c; a and b send; c leaves at seq 6 and is refused a send
// after it; a sends once more at seq 7. Each user has one device holding
// what they may see; c's view ends with their leave.
func fixture() (*Run, *World) {
	home := logrecord.VShard("c1", layout.VShards)
	part := layout.Partition(home)
	run := &Run{}
	w := &World{Layout: &layout}
	w.Writes = append(w.Writes, Write{VShard: home, Epoch: 1, Kind: logrecord.KindTakeover, Partition: part, Offset: 0})
	add := func(e Event, sent int64) {
		e.VShard, e.Epoch, e.Partition, e.Offset = home, 1, part, e.Seq
		if e.Kind == logrecord.KindMessage {
			e.Body = "hello " + e.ClientMessageID
		}
		w.Log = append(w.Log, e)
		w.DB = append(w.DB, e)
		w.Writes = append(w.Writes, Write{VShard: home, Epoch: 1, Kind: e.Kind, Partition: part, Offset: e.Seq})
		op := map[string]string{"create": "create", "message": "send", "leave": "leave"}[e.Kind]
		run.Accepted = append(run.Accepted, Accepted{Op: op, Conv: "c1", Seq: e.Seq, MessageID: e.MessageID,
			ClientMessageID: e.ClientMessageID, Sender: e.Sender, UserID: e.UserID, Sent: sent, At: sent + 5})
	}
	create := ev(1, logrecord.KindCreate, "a", "k-create")
	create.Members = []string{"b", "c"}
	add(create, 10)
	for s := int64(2); s <= 5; s++ {
		add(ev(s, logrecord.KindMessage, []string{"a", "b"}[s%2], fmt.Sprintf("m%d", s)), 10*s)
	}
	leave := ev(6, logrecord.KindLeave, "c", "k-leave")
	leave.UserID = "c"
	add(leave, 60)
	add(ev(7, logrecord.KindMessage, "a", "m7"), 70)
	run.Rejected = append(run.Rejected, Rejected{Op: "send", Conv: "c1", ClientMessageID: "late", Sender: "c", Code: "forbidden"})
	for _, u := range []string{"a", "b", "c"} {
		v := View{Name: u + "/0", User: u, Bodies: true}
		for _, e := range w.Log {
			if u != "c" || e.Seq <= 6 {
				v.Events = append(v.Events, e)
			}
		}
		run.Views = append(run.Views, v)
	}
	return run, w
}

func rules(r *Result) []string {
	return slices.Sorted(func(yield func(string) bool) {
		for k := range r.Counts {
			if !yield(k) {
				return
			}
		}
	})
}

func TestCheckPassesAConsistentWorld(t *testing.T) {
	run, w := fixture()
	res := Check(run, w)
	if !res.OK() || len(res.Violations) != 0 || len(res.Skipped) != 0 {
		t.Fatalf("a consistent world:\n%s", res.Text())
	}
	if res.Checked["log events"] != 7 || res.Checked["device views"] != 3 || res.Checked["log records"] != 8 {
		t.Errorf("checked: %v", res.Checked)
	}
}

// TestCheckFindsEachBrokenInvariant breaks one property at a time and
// wants it reported under its rule, standing for the events it concerns.
func TestCheckFindsEachBrokenInvariant(t *testing.T) {
	home := logrecord.VShard("c1", layout.VShards)
	other := (home + 1) % layout.VShards
	for _, tc := range []struct {
		name   string
		break_ func(run *Run, w *World)
		want   map[string]int // rule → count (0: any)
	}{
		// I1
		{"an accepted event missing from postgres", func(run *Run, w *World) { w.DB = slices.Delete(w.DB, 3, 4) },
			map[string]int{RuleNotInDB: 1, RuleNotPersisted: 1}},
		{"an accepted event missing from the log", func(run *Run, w *World) {
			w.Log = w.Log[:6]
			for i := range run.Views {
				run.Views[i].Events = slices.DeleteFunc(run.Views[i].Events, func(e Event) bool { return e.Seq == 7 })
			}
		}, map[string]int{RuleNotInLog: 1, RuleNotCommitted: 1}},
		{"an accepted seq holding another message", func(run *Run, w *World) { run.Accepted[2].MessageID = "MX" },
			map[string]int{RuleMismatch: 2}},
		{"an accepted send stored with another client id", func(run *Run, w *World) { run.Accepted[2].ClientMessageID = "other" },
			map[string]int{RuleMismatch: 2}},
		{"an accepted send stored with another sender", func(run *Run, w *World) { run.Accepted[2].Sender = "c" },
			map[string]int{RuleMismatch: 2}},
		{"an accepted leave stored as another kind", func(run *Run, w *World) { run.Accepted[5].Op = "kick" },
			map[string]int{RuleMismatch: 2}},
		{"a join of a member answered with a seq that does not add them", func(run *Run, w *World) {
			run.Accepted = append(run.Accepted, Accepted{Op: "join", Conv: "c1", Seq: 2, Sender: "a", UserID: "b"})
		}, map[string]int{RuleNotInLog: 1, RuleNotInDB: 1}},
		// I2
		{"a record of an older epoch after a newer one", func(run *Run, w *World) {
			w.Writes = append(w.Writes, Write{VShard: home, Epoch: 2, Kind: logrecord.KindTakeover, Partition: w.Writes[0].Partition, Offset: 8},
				Write{VShard: home, Epoch: 1, Kind: logrecord.KindMessage, Partition: w.Writes[0].Partition, Offset: 9},
				Write{VShard: home, Epoch: 1, Kind: logrecord.KindTakeover, Partition: w.Writes[0].Partition, Offset: 10})
		}, map[string]int{RuleStaleEpoch: 2}},
		{"a record outside its vshard's partition", func(run *Run, w *World) {
			w.Writes = append(w.Writes, Write{VShard: 4, Epoch: 1, Kind: logrecord.KindTakeover, Partition: 0, Offset: 20})
		}, map[string]int{RulePlacement: 1}},
		{"an event written by another conversation's vshard", func(run *Run, w *World) { w.Log[3].VShard = other },
			map[string]int{RulePlacement: 1}},
		// I3
		{"a seq used twice in the log", func(run *Run, w *World) {
			e := w.Log[3]
			e.MessageID, e.ClientMessageID, e.Offset = "MX", "mx", 99
			w.Log = append(w.Log, e)
		}, map[string]int{RuleCollision: 1, RuleRegression: 1}},
		{"a seq used twice in postgres", func(run *Run, w *World) {
			e := w.DB[3]
			e.MessageID, e.ClientMessageID = "MX", "mx"
			w.DB = append(w.DB, e)
		}, map[string]int{RuleCollision: 1}},
		{"seq_conflicts rows", func(run *Run, w *World) { w.SeqConflicts = 2 }, map[string]int{RuleCollision: 2}},
		{"one seq answered to two commands", func(run *Run, w *World) {
			a := run.Accepted[3]
			a.MessageID, a.ClientMessageID = "MX", "mx"
			run.Accepted = append(run.Accepted, a)
		}, map[string]int{RuleCollision: 1, RuleMismatch: 2}},
		{"a gap in a conversation's seqs", func(run *Run, w *World) {
			e := ev(9, logrecord.KindMessage, "a", "m9")
			e.VShard, e.Epoch, e.Partition, e.Offset, e.Body = home, 1, w.Log[0].Partition, 9, "hello m9"
			w.Log, w.DB = append(w.Log, e), append(w.DB, e)
			for i := range run.Views[:2] {
				run.Views[i].Events = append(run.Views[i].Events, e)
			}
		}, map[string]int{RuleGap: 1}},
		{"a seq going back in its partition", func(run *Run, w *World) { w.Log[4], w.Log[5] = w.Log[5], w.Log[4] },
			map[string]int{RuleRegression: 1}},
		{"a send accepted before another was sent has the larger seq", func(run *Run, w *World) {
			run.Accepted[6].Sent = 1000                           // m7 (seq 7) sent after m5 (seq 5) was accepted: fine
			run.Accepted[4].Sent, run.Accepted[4].At = 2000, 2005 // m5 sent after seq 7 was accepted, yet got 5
		}, map[string]int{RuleRegression: 1}},
		{"a leave accepted before a send was sent has the larger seq", func(run *Run, w *World) {
			run.Accepted[5].Sent, run.Accepted[5].At = 1, 2 // the leave (seq 6) accepted before the create and m2…m5 were sent
		}, map[string]int{RuleRegression: 5}},
		// I4
		{"a retry answered with another seq", func(run *Run, w *World) {
			a := run.Accepted[2]
			a.Seq, a.MessageID = 7, "M7"
			run.Accepted = append(run.Accepted, a)
		}, map[string]int{RuleDuplicate: 1, RuleMismatch: 2, RuleCollision: 1}},
		{"a client id stored twice in the log", func(run *Run, w *World) { w.Log[4].ClientMessageID = "m3" },
			map[string]int{RuleDuplicate: 1, RuleLogVsDB: 1, RuleMismatch: 1}},
		{"a client id stored twice in postgres", func(run *Run, w *World) { w.DB[4].ClientMessageID = "m3" },
			map[string]int{RuleDuplicate: 1, RuleLogVsDB: 1, RuleMismatch: 1}},
		{"a membership command's key stored twice", func(run *Run, w *World) {
			e := ev(8, logrecord.KindLeave, "c", "k-leave")
			e.UserID, e.VShard, e.Partition, e.Offset = "c", home, w.Log[0].Partition, 8
			w.Log, w.DB = append(w.Log, e), append(w.DB, e)
			for i := range run.Views[:2] {
				run.Views[i].Events = append(run.Views[i].Events, e)
			}
		}, map[string]int{RuleDuplicate: 2}},
		{"a message id stored at two seqs", func(run *Run, w *World) {
			w.Log[4].MessageID, w.DB[4].MessageID = "M3", "M3"
			for i := range run.Views {
				run.Views[i].Events[4].MessageID = "M3"
			}
			run.Accepted = slices.Delete(run.Accepted, 4, 5)
		}, map[string]int{RuleStoredTwice: 2}},
		{"a rejected send stored", func(run *Run, w *World) {
			run.Rejected = append(run.Rejected, Rejected{Op: "send", Conv: "c1", ClientMessageID: "m7", Sender: "a", Code: "forbidden"})
		}, map[string]int{RuleRejectedStored: 1}},
		// I5
		{"a message after the sender left", func(run *Run, w *World) {
			e := ev(8, logrecord.KindMessage, "c", "late")
			e.VShard, e.Epoch, e.Partition, e.Offset, e.Body = home, 1, w.Log[0].Partition, 8, "late"
			w.Log, w.DB = append(w.Log, e), append(w.DB, e)
			for i := range run.Views[:2] {
				run.Views[i].Events = append(run.Views[i].Events, e)
			}
		}, map[string]int{RuleRemovedSender: 1, RuleRejectedStored: 1}},
		{"a leave naming nobody", func(run *Run, w *World) { w.Log[5].UserID, w.DB[5].UserID = "", "" },
			map[string]int{RuleNoUser: 1, RuleDeviceLacks: 1}},
		// Postgres is the log
		{"postgres lacking an event nobody was told of", func(run *Run, w *World) {
			w.DB = slices.Delete(w.DB, 3, 4)
			run.Accepted = slices.Delete(run.Accepted, 3, 4)
		}, map[string]int{RuleNotPersisted: 1}},
		{"postgres holding an event the log does not", func(run *Run, w *World) {
			e := ev(8, logrecord.KindMessage, "a", "aborted")
			w.DB = append(w.DB, e)
		}, map[string]int{RuleNotCommitted: 1}},
		{"postgres holding another body", func(run *Run, w *World) { w.DB[2].Body = "tampered" },
			map[string]int{RuleLogVsDB: 1}},
		{"postgres holding other members", func(run *Run, w *World) { w.DB[0].Members = []string{"b"} },
			map[string]int{RuleLogVsDB: 1}},
		// I5, I6: the devices
		{"a device missing events", func(run *Run, w *World) { run.Views[1].Events = run.Views[1].Events[2:] },
			map[string]int{RuleDeviceLacks: 2}},
		{"a removed member given a later event", func(run *Run, w *World) {
			run.Views[2].Events = append(run.Views[2].Events, w.Log[6])
		}, map[string]int{RuleDeviceOutside: 1}},
		{"a device holding an event of a conversation its user never was in", func(run *Run, w *World) {
			e := ev(1, logrecord.KindCreate, "x", "")
			e.ConversationID, e.MessageID = "c2", "N1"
			w.Log, w.DB = append(w.Log, e), append(w.DB, e)
			run.Views[0].Events = append(run.Views[0].Events, e)
			w.Layout = nil
		}, map[string]int{RuleDeviceOutside: 1}},
		{"a device holding an event the log does not", func(run *Run, w *World) {
			run.Views[0].Events = append(run.Views[0].Events, ev(9, logrecord.KindMessage, "b", "ghost"))
		}, map[string]int{RuleDeviceNotInLog: 1}},
		{"a device holding another body", func(run *Run, w *World) { run.Views[0].Events[1].Body = "other" },
			map[string]int{RuleDeviceDiffers: 1}},
		{"a device holding another message at a seq", func(run *Run, w *World) { run.Views[1].Events[2].MessageID = "MX" },
			map[string]int{RuleDeviceDiffers: 1}},
		{"a device given two events at one seq", func(run *Run, w *World) {
			e := run.Views[0].Events[2]
			e.MessageID = "MX"
			run.Views[0].Events = append(run.Views[0].Events, e)
		}, map[string]int{RuleDeviceDiffers: 2}},
		{"a history read lacking the removal event", func(run *Run, w *World) {
			run.Views = append(run.Views, View{Name: "c's history", User: "c", Convs: []string{"c1"}, Events: w.Log[:5]})
		}, map[string]int{RuleDeviceLacks: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run, w := fixture()
			tc.break_(run, w)
			res := Check(run, w)
			if res.OK() {
				t.Fatalf("the check passed:\n%s", res.Text())
			}
			for rule, n := range tc.want {
				if got := res.Counts[rule]; got == 0 || (n > 0 && got != n) {
					t.Errorf("%s: counted %d, want %d", rule, got, n)
				}
			}
			for _, rule := range rules(res) {
				if _, ok := tc.want[rule]; !ok {
					t.Errorf("%s also reported", rule)
				}
			}
			if t.Failed() {
				t.Logf("%s", res.Text())
			}
		})
	}
}

func TestJoinOfACurrentMember(t *testing.T) {
	run, w := fixture()
	// b is a member already: the join writes nothing and names seq 1.
	run.Accepted = append(run.Accepted, Accepted{Op: "join", Conv: "c1", Seq: 1, Sender: "a", UserID: "b", Sent: 100, At: 105})
	if res := Check(run, w); !res.OK() {
		t.Fatalf("violations:\n%s", res.Text())
	}
}

// TestDuplicateSentLateIsNoRegression: a message is sent when its first
// copy is. A duplicate from another device of the sender (or a re-send)
// that goes out after later messages were accepted rightly gets the first
// copy's seq, which is lower than theirs: not a regression.
func TestDuplicateSentLateIsNoRegression(t *testing.T) {
	run, w := fixture()
	dup := run.Accepted[2] // m3, seq 3, sent at 30
	dup.Sent, dup.At = 100, 105
	run.Accepted = append(run.Accepted, dup)
	if res := Check(run, w); !res.OK() {
		t.Fatalf("a late duplicate counted as a regression:\n%s", res.Text())
	}
}

// TestGivenUpFirstCopyIsWhenTheMessageWasSent: a message's first copy was
// given up (its answer never heard) though it took seq 3; a copy sent
// after m5 was accepted got seq 3 by dedupe. The message was sent when the
// given-up copy was, and with that time unknown it is not held to later
// acceptances.
func TestGivenUpFirstCopyIsWhenTheMessageWasSent(t *testing.T) {
	for _, sent := range []int64{30, 0} {
		run, w := fixture()
		a := &run.Accepted[2]
		a.Sent, a.At = 100, 105
		run.GaveUp = append(run.GaveUp, GaveUp{Op: "send", Conv: "c1", ClientMessageID: "m3", Sender: a.Sender, Sent: sent})
		if res := Check(run, w); !res.OK() {
			t.Fatalf("sent %d: a given-up first copy counted as a regression:\n%s", sent, res.Text())
		}
	}
	run, w := fixture()
	run.Accepted[2].Sent, run.Accepted[2].At = 100, 105
	if res := Check(run, w); res.Counts[RuleRegression] != 1 {
		t.Fatalf("a real regression (m3 sent after m7 was accepted) not counted once:\n%s", res.Text())
	}
}

// TestUnknownTimesAreNotCompared: an answer without its times (0) is held
// to no order.
func TestUnknownTimesAreNotCompared(t *testing.T) {
	run, w := fixture()
	run.Accepted[6].Sent, run.Accepted[6].At = 0, 0
	run.Accepted[2].Sent, run.Accepted[2].At = 0, 0
	if res := Check(run, w); !res.OK() {
		t.Fatalf("violations:\n%s", res.Text())
	}
}

func TestScopedViewIsHeldToItsConversations(t *testing.T) {
	run, w := fixture()
	e := ev(1, logrecord.KindCreate, "b", "")
	e.MessageID = "N1"
	e.ConversationID, e.VShard, e.Partition = "c2", logrecord.VShard("c2", layout.VShards), layout.Partition(logrecord.VShard("c2", layout.VShards))
	w.Log, w.DB = append(w.Log, e), append(w.DB, e)
	run.Views[1].Events = append(run.Views[1].Events, e)
	// b's history of c1 alone need not hold c2.
	run.Views = append(run.Views, View{Name: "b's history of c1", User: "b", Convs: []string{"c1"}, Events: w.Log[:7]})
	if res := Check(run, w); !res.OK() {
		t.Fatalf("violations:\n%s", res.Text())
	}
}

func TestPlacementSkippedWithoutLayout(t *testing.T) {
	run, w := fixture()
	w.Layout = nil
	w.Writes[0].Partition = 7
	res := Check(run, w)
	if !res.OK() || len(res.Skipped) != 1 || !strings.Contains(res.Skipped[0], "placement") {
		t.Fatalf("want a pass with placement skipped:\n%s", res.Text())
	}
}

func TestViolationsListedPerRuleAndCounted(t *testing.T) {
	res := newResult()
	for i := 0; i < maxPerRule+5; i++ {
		res.Add(RuleGap, 2, "gap %d", i)
	}
	res.Add(RuleCollision, 0, "collision")
	if len(res.Violations) != maxPerRule+1 || res.Violations[0].Rule != RuleCollision || res.Violations[0].N != 1 {
		t.Fatalf("listed %d, first %+v", len(res.Violations), res.Violations[0])
	}
	if res.Truncated[RuleGap] != 5 || res.Counts[RuleGap] != 2*(maxPerRule+5) || res.OK() {
		t.Fatalf("truncated %v, counts %v", res.Truncated, res.Counts)
	}
	if txt := res.Text(); !strings.Contains(txt, "world check: FAIL") || !strings.Contains(txt, "VIOLATION seq-gap: … and 5 more") {
		t.Fatalf("text:\n%s", txt)
	}
}

// TestRulesDocumented: every rule is named in docs/loadgen.md's table of
// what `chatpipe check` verifies, once in Rules.
func TestRulesDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/loadgen.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range Rules() {
		if seen[r] {
			t.Errorf("%s listed twice", r)
		}
		seen[r] = true
		if !strings.Contains(string(b), "`"+r+"`") {
			t.Errorf("docs/loadgen.md does not name %s", r)
		}
	}
}
