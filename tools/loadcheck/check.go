// Package loadcheck verifies a loadgen run directory against the world —
// the committed log read read_committed and Postgres — with the world
// checker (internal/worldcheck): what `chatpipe check` does. It hands the
// checker the run's answers, final rejections, commands given up and
// every planned device's deliveries, and adds what only a run has: it must
// have finished, and device convergence is left out (and said so) when
// the stack served no delivery.
package loadcheck

import (
	"github.com/chatpipe/chatpipe/internal/worldcheck"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/tools/loadgen"
)

// RuleNotFinished is violated when the run's report says it failed.
const RuleNotFinished = "run-not-finished"

// Config is the world reader's configuration for run on stack: the run's
// conversations, and the stack's layout when it is known (vshards and
// partitions recorded; dedicated is 0 when not known, which ReadWorld
// then takes from the topic).
func Config(run *loadgen.RunDir, stack loadgen.Stack, dedicated int) worldcheck.WorldConfig {
	cfg := worldcheck.WorldConfig{Kafka: stack.Kafka, Topic: stack.Topic, Postgres: stack.Postgres, Convs: []string{}}
	for _, c := range run.Info.Plan.Conversations {
		cfg.Convs = append(cfg.Convs, c.ID)
	}
	if stack.VShards > 0 && stack.Partitions > 0 {
		cfg.Layout = &logrecord.Layout{VShards: stack.VShards, Partitions: stack.Partitions, Dedicated: dedicated}
	}
	return cfg
}

// Check verifies run against w.
func Check(run *loadgen.RunDir, w *worldcheck.World) *worldcheck.Result {
	in := &worldcheck.Run{}
	for _, a := range run.Accepted {
		in.Accepted = append(in.Accepted, worldcheck.Accepted{Op: a.Op, Conv: a.Conv, Seq: a.Seq, MessageID: a.MessageID,
			ClientMessageID: a.ClientMessageID, Sender: a.Sender, UserID: a.UserID, Sent: a.Sent, At: a.At})
	}
	for _, r := range run.Rejected {
		in.Rejected = append(in.Rejected, worldcheck.Rejected{Op: r.Op, Conv: r.Conv, ClientMessageID: r.ClientMessageID, Sender: r.Sender, Code: r.Code})
	}
	for _, g := range run.GaveUp {
		in.GaveUp = append(in.GaveUp, worldcheck.GaveUp{Op: g.Op, Conv: g.Conv, ClientMessageID: g.ClientMessageID, Sender: g.Sender, Sent: g.Sent})
	}
	skipDevices := len(run.Delivered) == 0 && run.Report.DeliveryMode != "served"
	if !skipDevices {
		in.Views = views(run)
	}
	res := worldcheck.Check(in, w)
	res.Run = run.Info.Run
	res.Checked["deliveries"] = len(run.Delivered)
	if skipDevices {
		res.Skipped = append(res.Skipped, "device convergence: the stack answered sync with bad_request and delivered nothing (delivery not served)")
	}
	if run.Report.Status != loadgen.StatusFinished {
		res.Add(RuleNotFinished, 1, "the run ended %q in phase %s: %s", run.Report.Status, run.Report.Phase, run.Report.Error)
	}
	return res
}

// views is every planned device's deliveries, a device that got nothing
// included: each must hold exactly what its user may see.
func views(run *loadgen.RunDir) []worldcheck.View {
	byDev := map[string][]worldcheck.Event{}
	for _, d := range run.Delivered {
		byDev[d.Device] = append(byDev[d.Device], worldcheck.Event{Event: logrecord.Event{ConversationID: d.Conv, Seq: d.Seq,
			Kind: d.Kind, MessageID: d.MessageID, Sender: d.Sender}})
	}
	var out []worldcheck.View
	for _, u := range run.Info.Plan.Users {
		for i := 0; i < run.Info.Plan.Devices; i++ {
			dev := loadgen.DeviceName(u, i)
			out = append(out, worldcheck.View{Name: dev, User: u, Events: byDev[dev]})
		}
	}
	return out
}
