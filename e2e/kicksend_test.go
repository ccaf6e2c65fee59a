package e2e

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestKickVersusSend: on one conversation a member sends without pause
// while the owner kicks them and adds them back, 2,000 times
// (CHATPIPE_E2E_KICK_CYCLES sets another count; 10,000 for the full-scale
// run). Every send is
// answered accepted or forbidden, and no message of the member's lies
// outside their membership periods (I5): not in the log, not in Postgres,
// not at a watching member's device, and the member's own device holds
// nothing from while they were out (the watcher writes now and then while
// they are).
func TestKickVersusSend(t *testing.T) {
	sharing(t, 60, 22)
	cycles := stacktest.EnvInt(t, "CHATPIPE_E2E_KICK_CYCLES", 2000)
	dev := startDev(t, t.TempDir(), "--rate-user", "-1", "--rate-conv", "-1")
	connect := func(user string) *device {
		d := newDevice(t, dev, user, user)
		if err := d.connect(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.disconnect)
		return d
	}
	owner, member, watcher := connect("kown"), connect("kmem"), connect("kwat")
	const g = "kick-race"
	if f, err := owner.doRetrying(map[string]any{"op": "create", "conversation_id": g, "members": []string{"kmem", "kwat"}}); err != nil || f.Op != protocol.OpAccepted {
		t.Fatalf("create: %v %+v", err, f)
	}

	stop := make(chan struct{})
	accepted := map[string]int64{} // client_message_id → seq
	forbidden := 0
	var wg sync.WaitGroup
	var halted sync.Once
	halt := func() { halted.Do(func() { close(stop) }) }
	defer func() { halt(); wg.Wait() }() // no sender outlives a test that fails half-way
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			cmid := fmt.Sprintf("kmem-%d", i)
			f, err := member.doRetrying(map[string]any{"op": "send", "conversation_id": g, "client_message_id": cmid, "body": "racing"})
			switch {
			case err != nil:
				t.Errorf("send %s: %v", cmid, err)
				return
			case f.Op == protocol.OpAccepted:
				accepted[cmid] = f.Seq
			case f.Code == string(protocol.CodeForbidden):
				forbidden++
			default:
				t.Errorf("send %s: %+v", cmid, f)
				return
			}
		}
	}()
	start := time.Now()
	gaps := 0 // watcher messages sent while the member was out
	for i := 0; i < cycles && !t.Failed(); i++ {
		if f, err := owner.doRetrying(map[string]any{"op": "kick", "conversation_id": g, "user_id": "kmem"}); err != nil || f.Op != protocol.OpAccepted {
			t.Fatalf("kick %d: %v %+v", i, err, f)
		}
		if i%10 == 0 { // something the member must not see
			if f, err := watcher.doRetrying(map[string]any{"op": "send", "conversation_id": g, "client_message_id": fmt.Sprintf("gap-%d", i), "body": "not for kmem"}); err != nil || f.Op != protocol.OpAccepted {
				t.Fatalf("gap message %d: %v %+v", i, err, f)
			}
			gaps++
		}
		if f, err := owner.doRetrying(map[string]any{"op": "join", "conversation_id": g, "user_id": "kmem"}); err != nil || f.Op != protocol.OpAccepted {
			t.Fatalf("join %d: %v %+v", i, err, f)
		}
	}
	halt()
	wg.Wait()
	t.Logf("%d kick/re-add cycles in %v; the member's sends: %d accepted, %d forbidden", cycles, time.Since(start).Round(time.Millisecond), len(accepted), forbidden)
	if len(accepted) == 0 || forbidden == 0 {
		t.Errorf("the race had one outcome only (%d accepted, %d forbidden)", len(accepted), forbidden)
	}

	logRows := readLog(t, dev.EP)
	dbRows := readDB(t, dev.EP, len(logRows))
	waitProjected(t, dev.EP, len(logRows))
	var last int64
	for name, rows := range map[string][]row{"log": logRows, "postgres": dbRows} {
		var mine []row
		for _, r := range rows {
			if r.Conv == g {
				mine = append(mine, r)
			}
		}
		per := periods(mine)[g]["kmem"]
		if len(per) != cycles+1 {
			t.Errorf("%s: the member has %d membership periods, want %d", name, len(per), cycles+1)
		}
		got := map[string]int64{}
		for _, r := range mine {
			last = max(last, r.Seq)
			if r.Kind != "message" || r.Sender != "kmem" {
				continue
			}
			got[r.ClientMessageID] = r.Seq
			if len(visibleTo([]row{r}, per)) == 0 {
				t.Errorf("%s: the member's message %s at seq %d is outside their membership periods", name, r.ClientMessageID, r.Seq)
			}
		}
		if len(got) != len(accepted) {
			t.Errorf("%s: %d messages of the member, %d accepted", name, len(got), len(accepted))
		}
		for cmid, seq := range accepted {
			if got[cmid] != seq {
				t.Errorf("%s: accepted %s at seq %d, stored at %d", name, cmid, seq, got[cmid])
			}
		}
	}

	// Devices: the watcher receives the whole conversation, which is the
	// log's; the member's device holds nothing from outside its periods.
	stacktest.WaitFor(t, 60*time.Second, "the watcher to receive the whole conversation", func() bool {
		s := watcher.seqs(g)
		return len(s) > 0 && s[len(s)-1] == last
	})
	time.Sleep(500 * time.Millisecond) // anything wrongly pushed to the member would be here by now
	var mine []row
	bySeq := map[int64]row{}
	for _, r := range logRows {
		if r.Conv == g {
			mine = append(mine, r)
			bySeq[r.Seq] = r
		}
	}
	per := periods(mine)[g]["kmem"]
	visible := visibleTo(mine, per)
	if n := len(watcher.seqs(g)); n != len(mine) {
		t.Errorf("the watcher holds %d events, the log %d", n, len(mine))
	}
	for _, s := range watcher.seqs(g) {
		e := watcher.get(g, s)
		if r, ok := bySeq[s]; !ok || r.MessageID != e.MessageID {
			t.Errorf("the watcher holds %+v at seq %d, the log %+v", e, s, r)
		}
		if e.Kind == "message" && e.Sender == "kmem" {
			if _, ok := visible[s]; !ok {
				t.Errorf("the watcher received the member's message at seq %d, outside their periods", s)
			}
		}
	}
	if len(mine)-len(visible) != gaps {
		t.Errorf("%d events outside the member's periods, %d messages sent while they were out", len(mine)-len(visible), gaps)
	}
	held := member.seqs(g)
	for _, s := range held {
		if _, ok := visible[s]; !ok {
			t.Errorf("the member's device holds seq %d, from while they were not a member", s)
		}
	}
	t.Logf("conversation of %d events; the member may see %d, their device holds %d", len(mine), len(visible), len(held))
}
