package loadcheck

import (
	"fmt"
	"slices"
	"testing"

	"github.com/chatpipe/chatpipe/internal/worldcheck"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/tools/loadgen"
)

// fixture is a small consistent run: conversation c1 created by a with b
// and c; a and b send; c leaves at seq 6; a sends once more at seq 7.
func fixture() (*loadgen.RunDir, *worldcheck.World) {
	run := &loadgen.RunDir{
		Info: loadgen.RunInfo{Run: "t", Plan: loadgen.Plan{Users: []string{"a", "b", "c"}, Devices: 1,
			Conversations: []loadgen.Conversation{{ID: "c1"}}}},
		Report: loadgen.Report{Status: loadgen.StatusFinished, DeliveryMode: "served"},
	}
	w := &worldcheck.World{}
	add := func(e logrecord.Event, sent int64) {
		e.ConversationID, e.MessageID = "c1", fmt.Sprintf("M%d", e.Seq)
		w.Log = append(w.Log, worldcheck.Event{Event: e, Offset: e.Seq})
		w.DB = append(w.DB, worldcheck.Event{Event: e})
		op := map[string]string{"create": "create", "message": "send", "leave": "leave"}[e.Kind]
		run.Accepted = append(run.Accepted, loadgen.Accepted{Op: op, Conv: "c1", Seq: e.Seq, MessageID: e.MessageID,
			ClientMessageID: e.ClientMessageID, Sender: e.Sender, Sent: sent, At: sent + 5})
	}
	add(logrecord.Event{Seq: 1, Kind: "create", Sender: "a", Members: []string{"a", "b", "c"}}, 10)
	for s := int64(2); s <= 5; s++ {
		add(logrecord.Event{Seq: s, Kind: "message", Sender: []string{"a", "b"}[s%2], ClientMessageID: fmt.Sprintf("m%d", s)}, 10*s)
	}
	add(logrecord.Event{Seq: 6, Kind: "leave", Sender: "c", UserID: "c", ClientMessageID: "l6"}, 60)
	add(logrecord.Event{Seq: 7, Kind: "message", Sender: "a", ClientMessageID: "m7"}, 70)
	for _, u := range []string{"a", "b", "c"} {
		for _, e := range w.Log {
			if u != "c" || e.Seq <= 6 {
				run.Delivered = append(run.Delivered, loadgen.Delivered{Device: loadgen.DeviceName(u, 0), Conv: "c1", Seq: e.Seq,
					Kind: e.Kind, MessageID: e.MessageID, Sender: e.Sender})
			}
		}
	}
	return run, w
}

func TestCheckPassesAConsistentRun(t *testing.T) {
	run, w := fixture()
	res := Check(run, w)
	if !res.OK() || res.Run != "t" || res.Checked["device views"] != 3 || res.Checked["deliveries"] != 20 {
		t.Fatalf("a consistent run:\n%s", res.Text())
	}
}

// TestCheckHandsTheRunToTheChecker: each of the run's records reaches the
// world checker — a broken answer, rejection, given-up time or delivery
// is reported under its rule.
func TestCheckHandsTheRunToTheChecker(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(run *loadgen.RunDir, w *worldcheck.World)
		want   string
	}{
		{"the run failed", func(run *loadgen.RunDir, w *worldcheck.World) { run.Report.Status = "failed" }, RuleNotFinished},
		{"an accepted message stored with another client id", func(run *loadgen.RunDir, w *worldcheck.World) {
			run.Accepted[2].ClientMessageID = "other"
		}, worldcheck.RuleMismatch},
		{"a rejected send was stored", func(run *loadgen.RunDir, w *worldcheck.World) {
			run.Rejected = append(run.Rejected, loadgen.Rejected{Op: "send", Conv: "c1", ClientMessageID: "m7", Sender: "a", Code: "forbidden"})
		}, worldcheck.RuleRejectedStored},
		{"a send's first copy went out after a later one was accepted", func(run *loadgen.RunDir, w *worldcheck.World) {
			run.GaveUp = append(run.GaveUp, loadgen.GaveUp{Op: "send", Conv: "c1", ClientMessageID: "m3", Sender: "a", Sent: 1000})
			run.Accepted[2].Sent, run.Accepted[2].At = 2000, 2005
		}, worldcheck.RuleRegression},
		{"a device of the plan got nothing", func(run *loadgen.RunDir, w *worldcheck.World) {
			run.Delivered = slices.DeleteFunc(run.Delivered, func(d loadgen.Delivered) bool { return d.Device == loadgen.DeviceName("b", 0) })
		}, worldcheck.RuleDeviceLacks},
		{"a device got another sender's message", func(run *loadgen.RunDir, w *worldcheck.World) { run.Delivered[3].Sender = "c" },
			worldcheck.RuleDeviceDiffers},
		{"a removed member got a later event", func(run *loadgen.RunDir, w *worldcheck.World) {
			run.Delivered = append(run.Delivered, loadgen.Delivered{Device: loadgen.DeviceName("c", 0), Conv: "c1", Seq: 7, Kind: "message", MessageID: "M7", Sender: "a"})
		}, worldcheck.RuleDeviceOutside},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run, w := fixture()
			tc.break_(run, w)
			res := Check(run, w)
			if res.Counts[tc.want] == 0 || res.OK() {
				t.Errorf("want a %s violation:\n%s", tc.want, res.Text())
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
	if !res.OK() || len(res.Skipped) != 2 { // placement too: the fixture's world has no layout
		t.Fatalf("want a pass with convergence skipped:\n%s", res.Text())
	}
	run.Report.DeliveryMode = "served"
	if res := Check(run, w); res.OK() {
		t.Fatal("a served run with no deliveries passed")
	}
}

func TestConfig(t *testing.T) {
	run, _ := fixture()
	cfg := Config(run, loadgen.Stack{Kafka: []string{"k:9092"}, Topic: "t", Postgres: "pg", VShards: 8, Partitions: 4}, 2)
	if !slices.Equal(cfg.Convs, []string{"c1"}) || cfg.Layout == nil || *cfg.Layout != (logrecord.Layout{VShards: 8, Partitions: 4, Dedicated: 2}) ||
		cfg.Topic != "t" || cfg.Postgres != "pg" {
		t.Errorf("config: %+v", cfg)
	}
	if cfg := Config(run, loadgen.Stack{Topic: "t"}, 0); cfg.Layout != nil {
		t.Errorf("a stack without vshards has a layout: %+v", cfg.Layout)
	}
	run.Info.Plan.Conversations = nil
	if cfg := Config(run, loadgen.Stack{}, 0); cfg.Convs == nil {
		t.Error("a run without conversations reads every conversation")
	}
}
