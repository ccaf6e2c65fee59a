package sim

import (
	"fmt"
	"testing"

	"pgregory.net/rapid"

	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/protocol"
)

// kickSendConfig is one conversation on one or two vshards: u0 owns it, u1
// is the member who keeps sending while u0 kicks and re-adds them, u2 is a
// member whose devices watch. The random workload is off (MaxOps is the
// setup's create): runKickSend issues the ops.
func kickSendConfig() Config {
	cfg := DefaultConfig()
	cfg.VShards, cfg.Partitions, cfg.Workers, cfg.Conversations, cfg.Users = 2, 1, 2, 1, 3
	cfg.MaxOps = 1
	cfg.Steps = 200
	return cfg
}

// kickSendRun is what one kick-vs-send schedule did.
type kickSendRun struct {
	r *Result
	// races counts kicks and re-adds issued while a send of u1 was
	// unanswered, and sends of u1 issued while a kick or re-add was.
	races int
	// accepted and forbidden count u1's sends by their final answer.
	accepted, forbidden int
}

// runKickSend runs one schedule in which, between the world's own steps
// (writers, deliveries, retries, persist, clock, takeovers and faults), u1
// sends and u0 kicks and re-adds u1, in an order the chooser picks. I5 (no
// message from u1 at a seq where u1 is not a member) is checked on the log,
// I6 on every device (a device shows exactly the log as its user may see
// it), and the rest of the properties as always.
func runKickSend(cfg Config, ch Chooser) kickSendRun {
	w := newWorld(cfg, ch)
	w.setup()
	conv := w.convs[0]
	owner, member := w.users[0], w.users[1]
	var sends, changes []*op
	open := func(ops []*op) bool {
		for _, o := range ops {
			if !o.done {
				return true
			}
		}
		return false
	}
	races := 0
	for i := 0; i < cfg.Steps; i++ {
		if ch.Choose(3, "client op or world step") != 0 {
			w.randomStep()
			continue
		}
		switch ch.Choose(3, "kick-send op") {
		case 0:
			if open(changes) {
				races++
			}
			w.sends++
			sends = append(sends, w.issue(shardcore.Command{Op: protocol.OpSend, ConversationID: conv, Sender: member,
				ClientMessageID: fmt.Sprintf("%s-%d", member, w.sends), Body: "racing"}, true))
		case 1:
			if open(sends) {
				races++
			}
			changes = append(changes, w.issue(shardcore.Command{Op: protocol.OpKick, ConversationID: conv, Sender: owner, UserID: member}, true))
		default:
			if open(sends) {
				races++
			}
			changes = append(changes, w.issue(shardcore.Command{Op: protocol.OpJoin, ConversationID: conv, Sender: owner, UserID: member}, false))
		}
	}
	run := kickSendRun{r: w.finish(), races: races}
	for _, o := range sends {
		switch {
		case o.final == nil:
		case o.final.Op == protocol.OpAccepted:
			run.accepted++
		case o.final.Code == protocol.CodeForbidden:
			run.forbidden++
		}
	}
	return run
}

// TestKickVersusSend runs seeded kick-vs-send schedules of the correct
// writer until they hold 10,000 races of a kick or re-add against a send of
// the kicked member; every property must hold in each. Both outcomes of
// the race must occur: sends accepted and sends refused as forbidden.
func TestKickVersusSend(t *testing.T) {
	t.Parallel()
	races, accepted, forbidden, seed := 0, 0, 0, 0
	for races < 10000 {
		if seed++; seed > 2000 {
			t.Fatalf("only %d races in %d schedules", races, seed-1)
		}
		cfg := kickSendConfig()
		cfg.Untraced = true
		run := runKickSend(cfg, NewSeededChooser(uint64(seed)))
		races, accepted, forbidden = races+run.races, accepted+run.accepted, forbidden+run.forbidden
		if run.r.Failed() {
			// the same schedule again, with its trace
			run = runKickSend(kickSendConfig(), NewSeededChooser(uint64(seed)))
			t.Fatalf("seed %d: %v\n%s", seed, run.r.Properties(), run.r.Report(150))
		}
	}
	t.Logf("%d schedules, %d kick/send races; u1's sends: %d accepted, %d forbidden; every property held", seed, races, accepted, forbidden)
	if accepted == 0 || forbidden == 0 {
		t.Errorf("the race had one outcome only (%d accepted, %d forbidden)", accepted, forbidden)
	}
}

// TestKickVersusSendProperty is TestKickVersusSend as a rapid property:
// random kick-vs-send schedules, shrunk to a small failing one if any
// property breaks.
func TestKickVersusSendProperty(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		cfg := kickSendConfig()
		cfg.VShards = rapid.IntRange(1, 2).Draw(rt, "vshards")
		cfg.Workers = rapid.IntRange(2, 3).Draw(rt, "workers")
		if run := runKickSend(cfg, newRapidChooser(rt)); run.r.Failed() {
			rt.Fatalf("properties broken:\n%s", run.r.Report(200))
		}
	})
}

// TestKickVersusSendCatchesStaleMembership plants the membership bug (the
// writer checks a send against the members it knew when the command
// arrived, not at seq assignment) in the same schedules: I5 must catch it.
func TestKickVersusSendCatchesStaleMembership(t *testing.T) {
	t.Parallel()
	caught := 0
	for seed := 1; seed <= 300; seed++ {
		cfg := kickSendConfig()
		cfg.Bugs.MembershipOutsideMailbox = true
		cfg.Untraced = true // only the properties are counted
		run := runKickSend(cfg, NewSeededChooser(uint64(seed)))
		for _, p := range run.r.Properties() {
			if p == PropRemoved {
				caught++
				if caught == 1 {
					t.Logf("seed %d caught: %v", seed, run.r.Properties())
				}
				break
			}
		}
	}
	t.Logf("%s caught the planted bug in %d of 300 schedules", PropRemoved, caught)
	if caught == 0 {
		t.Fatalf("checking membership outside the mailbox was never caught by %s in 300 kick-vs-send schedules", PropRemoved)
	}
}
