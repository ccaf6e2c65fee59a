package e2e

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestRemovalAndReads: kicks and a leave race with the removed users'
// sends; nothing of theirs lands after their removal seq and they receive
// nothing later (I5), yet they keep reading up to and including their
// removal; an outsider receives and reads nothing; a user added back sees
// the new period and not the gap. Then a device that stops reading is
// closed with 1008 and catches up with sync.
func TestRemovalAndReads(t *testing.T) {
	sharing(t, 40, 18)
	dir := t.TempDir()
	dev := startDev(t, dir, "--rate-user", "-1", "--rate-conv", "-1", "--max-convs-per-user", "3")
	connect := func(user string) *device {
		d := newDevice(t, dev, user, user)
		if err := d.connect(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.disconnect)
		return d
	}
	owner, watcher, outsider := connect("own"), connect("wat"), connect("out")
	victims := []*device{connect("v1"), connect("v2"), connect("v3"), connect("v4")}
	const g = "race-group"
	if f, err := owner.doRetrying(map[string]any{"op": "create", "conversation_id": g, "members": []string{"v1", "v2", "v3", "v4", "wat"}}); err != nil || f.Op != protocol.OpAccepted {
		t.Fatalf("create: %v %+v", err, f)
	}

	accepted := map[string]int{}
	var amu sync.Mutex
	var senders sync.WaitGroup
	for _, v := range victims {
		senders.Add(1)
		go func() {
			defer senders.Done()
			refused := 0
			for m := 0; m < 400 && refused < 3; m++ {
				f, err := v.doRetrying(map[string]any{"op": "send", "conversation_id": g,
					"client_message_id": fmt.Sprintf("%s-%d", v.user, m), "body": "hello from " + v.user})
				if err != nil {
					t.Errorf("%s: %v", v.user, err)
					return
				}
				switch {
				case f.Op == protocol.OpAccepted:
					amu.Lock()
					accepted[v.user]++
					amu.Unlock()
				case f.Code == string(protocol.CodeForbidden):
					refused++
				default:
					t.Errorf("%s send: %+v", v.user, f)
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	var removals sync.WaitGroup
	for _, op := range []func() (*frame, error){
		func() (*frame, error) {
			return owner.doRetrying(map[string]any{"op": "kick", "conversation_id": g, "user_id": "v1"})
		},
		func() (*frame, error) {
			return owner.doRetrying(map[string]any{"op": "kick", "conversation_id": g, "user_id": "v2"})
		},
		func() (*frame, error) {
			return victims[2].doRetrying(map[string]any{"op": "leave", "conversation_id": g})
		},
		func() (*frame, error) {
			time.Sleep(300 * time.Millisecond)
			return owner.doRetrying(map[string]any{"op": "kick", "conversation_id": g, "user_id": "v4"})
		},
	} {
		removals.Add(1)
		go func() {
			defer removals.Done()
			if f, err := op(); err != nil || f.Op != protocol.OpAccepted {
				t.Errorf("removal: %v %+v", err, f)
			}
		}()
	}
	removals.Wait()
	senders.Wait()

	rows := readLog(t, dev.EP)
	readDB(t, dev.EP, len(rows))
	waitProjected(t, dev.EP, len(rows))
	var mine []row
	for _, r := range rows {
		if r.Conv == g {
			mine = append(mine, r)
		}
	}
	per := periods(mine)[g]
	last := int64(0)
	logged := map[string]int{}
	for _, r := range mine {
		last = max(last, r.Seq)
		if r.Kind == "message" {
			logged[r.Sender]++
			if ps := per[r.Sender]; len(ps) == 0 || r.Seq > ps[len(ps)-1][1] {
				t.Errorf("%s's message at seq %d is after their removal (%v)", r.Sender, r.Seq, ps)
			}
		}
	}
	for _, v := range victims {
		if ps := per[v.user]; len(ps) != 1 || ps[0][1] == 1<<62 {
			t.Fatalf("%s's periods %v: want one, closed", v.user, ps)
		}
		if logged[v.user] != accepted[v.user] {
			t.Errorf("%s: %d messages accepted, %d in the log", v.user, accepted[v.user], logged[v.user])
		}
	}
	t.Logf("accepted before removal: %v; removal seqs: v1 %d, v2 %d, v3 %d, v4 %d; last seq %d",
		accepted, per["v1"][0][1], per["v2"][0][1], per["v3"][0][1], per["v4"][0][1], last)

	// The watcher gets everything live; each victim got everything up to and
	// including its removal, live, and nothing after.
	stacktest.WaitFor(t, 30*time.Second, "the watcher to receive the whole conversation", func() bool {
		s := watcher.seqs(g)
		return len(s) > 0 && s[len(s)-1] == last
	})
	time.Sleep(500 * time.Millisecond) // anything wrongly sent to the victims would be here by now
	for _, v := range victims {
		want := visibleTo(mine, per[v.user])
		got := v.seqs(g)
		if len(got) != len(want) || got[len(got)-1] != per[v.user][0][1] {
			t.Errorf("%s received %d events up to %d; may see %d up to %d", v.user, len(got), got[len(got)-1], len(want), per[v.user][0][1])
		}
	}

	// A removed user reads up to the removal and no further, by history and
	// by sync from a fresh device.
	v1 := victims[0]
	r1 := per["v1"][0][1]
	seqs, err := v1.history(g, 200)
	if err != nil {
		t.Fatal(err)
	}
	if len(seqs) != int(r1) || seqs[len(seqs)-1] != r1 {
		t.Errorf("v1's history: %d events up to %d, want 1..%d", len(seqs), seqs[len(seqs)-1], r1)
	}
	if f, err := v1.do(map[string]any{"op": "history", "conversation_id": g, "before_seq": last + 10}); err != nil || f.Op != protocol.OpHistory ||
		len(f.Events) == 0 || f.Events[len(f.Events)-1].Seq != r1 {
		t.Errorf("v1's history before %d: %v %+v", last+10, err, f)
	}
	fresh := connect("v1")
	if fresh.cursors[g] != r1 || len(fresh.seqs(g)) != int(r1) {
		t.Errorf("v1's sync from 0: cursor %d and %d events, want %d", fresh.cursors[g], len(fresh.seqs(g)), r1)
	}

	// The outsider received nothing and may read nothing.
	if c := outsider.convs(); len(c) != 0 {
		t.Errorf("the outsider received events of %v", c)
	}
	if f, err := outsider.do(map[string]any{"op": "history", "conversation_id": g}); err != nil || f.Code != string(protocol.CodeForbidden) {
		t.Errorf("the outsider's history: %v %+v", err, f)
	}
	if f, err := outsider.do(map[string]any{"op": "sync", "cursors": map[string]int64{g: 0}}); err != nil || f.Op != protocol.OpSynced || len(f.Cursors) != 0 {
		t.Errorf("the outsider's sync: %v %+v", err, f)
	}

	// Added back: v1 sees the new period live and by history, not the gap.
	join, err := watcher.doRetrying(map[string]any{"op": "join", "conversation_id": g, "user_id": "v1"})
	if err != nil || join.Op != protocol.OpAccepted {
		t.Fatalf("join: %v %+v", err, join)
	}
	msg, err := owner.doRetrying(map[string]any{"op": "send", "conversation_id": g, "client_message_id": "welcome-back", "body": "hi again"})
	if err != nil || msg.Op != protocol.OpAccepted {
		t.Fatalf("send: %v %+v", err, msg)
	}
	stacktest.WaitFor(t, 30*time.Second, "v1 to receive the join and the message", func() bool {
		return v1.get(g, join.Seq) != nil && v1.get(g, msg.Seq) != nil
	})
	again := newDevice(t, dev, "v1", "v1-again")
	if err := again.connect(); err != nil {
		t.Fatal(err)
	}
	defer again.disconnect()
	seqs, err = again.history(g, 30)
	if err != nil {
		t.Fatal(err)
	}
	if want := int(r1) + 2; len(seqs) != want || seqs[int(r1)-1] != r1 || seqs[int(r1)] != join.Seq || seqs[int(r1)+1] != msg.Seq {
		t.Errorf("v1's history after rejoining: %d events, want %d (1..%d, %d, %d)", len(seqs), want, r1, join.Seq, msg.Seq)
	}
	for s := r1 + 1; s < join.Seq; s++ {
		if v1.get(g, s) != nil || again.get(g, s) != nil {
			t.Errorf("v1 holds seq %d, from while it was not a member", s)
		}
	}

	t.Run("SlowReaderIsClosed", func(t *testing.T) { slowReader(t, dev) })
	t.Run("ConversationListAndCap", func(t *testing.T) { conversationListAndCap(t, dev) })
}

// conversationListAndCap: the conversations op lists a user's current
// conversations, most recently active first; a create or join that would
// put someone in more than --max-convs-per-user (3 here) answers too_large;
// a repeated join of a member at the cap still answers its first result.
func conversationListAndCap(t *testing.T, dev *devProc) {
	d := newDevice(t, dev, "capped", "capped")
	if err := d.connect(); err != nil {
		t.Fatal(err)
	}
	defer d.disconnect()
	other := newDevice(t, dev, "other", "other")
	if err := other.connect(); err != nil {
		t.Fatal(err)
	}
	defer other.disconnect()
	must := func(d *device, req map[string]any) *frame {
		t.Helper()
		f, err := d.doRetrying(req)
		if err != nil || f.Op != protocol.OpAccepted {
			t.Fatalf("%v: %v %+v", req, err, f)
		}
		return f
	}
	list := func() []string {
		f, err := d.do(map[string]any{"op": "conversations"})
		if err != nil || f.Op != "conversations" {
			t.Fatalf("conversations: %v %+v", err, f)
		}
		var ids []string
		for _, c := range f.Conversations {
			ids = append(ids, c.ConversationID)
		}
		return ids
	}
	waitList := func(want string) {
		t.Helper()
		stacktest.WaitFor(t, 30*time.Second, "the list "+want, func() bool { return strings.Join(list(), ",") == want })
	}
	for _, c := range []string{"x1", "x2", "x3"} {
		must(d, map[string]any{"op": "create", "conversation_id": c, "members": []string{}})
		time.Sleep(20 * time.Millisecond) // distinct activity times
	}
	must(d, map[string]any{"op": "send", "conversation_id": "x1", "client_message_id": "m1", "body": "bump"})
	waitList("x1,x3,x2")

	tooLarge := func(d *device, req map[string]any) {
		t.Helper()
		f, err := d.doRetrying(req)
		if err != nil || f.Code != string(protocol.CodeTooLarge) {
			t.Errorf("%v at the cap: %v %+v", req, err, f)
		}
	}
	tooLarge(d, map[string]any{"op": "create", "conversation_id": "x4", "members": []string{}})
	tooLarge(other, map[string]any{"op": "create", "conversation_id": "y1", "members": []string{"capped"}})
	must(other, map[string]any{"op": "create", "conversation_id": "y2", "members": []string{}})
	tooLarge(other, map[string]any{"op": "join", "conversation_id": "y2", "user_id": "capped"})
	if f := must(d, map[string]any{"op": "join", "conversation_id": "x2", "user_id": "capped"}); f.Seq != 1 {
		t.Errorf("a member's join at the cap answered seq %d, want 1 (the create)", f.Seq)
	}
	must(d, map[string]any{"op": "leave", "conversation_id": "x3"})
	waitList("x1,x2")
	must(d, map[string]any{"op": "create", "conversation_id": "x4", "members": []string{}})
}

// slowReader: a device that stops reading while thousands of events are
// pushed to it is closed with 1008 once a frame has waited --slow-reader
// (10 s) for room in its send buffer (1024 frames)
// and gets everything back with sync.
func slowReader(t *testing.T, dev *devProc) {
	fast := newDevice(t, dev, "fast", "fast")
	if err := fast.connect(); err != nil {
		t.Fatal(err)
	}
	defer fast.disconnect()
	const g = "slow-group"
	if f, err := fast.doRetrying(map[string]any{"op": "create", "conversation_id": g, "members": []string{"slow"}}); err != nil || f.Op != protocol.OpAccepted {
		t.Fatalf("create: %v %+v", err, f)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, dev.EP.WebSocket+"?token="+dev.Token(t, "slow"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	metricsURL := dev.EP.Admin + "/metrics"
	before := stacktest.Metric(t, metricsURL, "chatpipe_gateway_slow_readers_closed_total")

	body := strings.Repeat("x", 4000)
	const n = 3000 // 12 MB: more than the socket buffers and the 1024 frames queued
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := w; m < n; m += 4 {
				if f, err := fast.doRetrying(map[string]any{"op": "send", "conversation_id": g, "client_message_id": fmt.Sprintf("m%d", m), "body": body}); err != nil || f.Op != protocol.OpAccepted {
					t.Errorf("send: %v %+v\n%s", err, f, stacktest.Tail(dev.Dir+"/dev.log"))
					return
				}
			}
		}()
	}
	wg.Wait()
	stacktest.WaitForOr(t, 60*time.Second, "the gateway to close the slow reader", func() bool {
		return stacktest.Metric(t, metricsURL, "chatpipe_gateway_slow_readers_closed_total") > before
	}, func() string {
		return fmt.Sprintf("backlogs %v; the gateway's log:\n%s", stacktest.Metric(t, metricsURL, "chatpipe_gateway_backlogs_total"),
			grepLines(filepath.Join(dev.Dir, "dev.log"), "slow", "closing", "read back"))
	})
	// Drain what the socket held: the connection ends before all n events.
	got := 0
	var end error
	for {
		_, _, err := c.Read(ctx)
		if err != nil {
			end = err
			break
		}
		got++
	}
	var ce websocket.CloseError
	t.Logf("the slow reader read %d of %d frames, then %v", got, n+1, end)
	if got >= n+1 {
		t.Errorf("the slow reader got all %d frames; it should have been cut off", got)
	}
	if errors.As(end, &ce) && ce.Code != websocket.StatusPolicyViolation {
		t.Errorf("closed with %d, want 1008", ce.Code)
	}
	// It catches up with sync.
	slow := newDevice(t, dev, "slow", "slow")
	if err := slow.connect(); err != nil {
		t.Fatal(err)
	}
	defer slow.disconnect()
	if s := slow.seqs(g); len(s) != n+1 || slow.cursors[g] != n+1 {
		t.Errorf("after sync the slow reader holds %d events (cursor %d), want %d", len(s), slow.cursors[g], n+1)
	}
}
