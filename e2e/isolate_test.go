package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestIsolateUnderLoad: a conversation is isolated to a dedicated vshard
// and released again while its members send (with retries), its owner
// kicks and re-adds a member who sends too, and other conversations that
// share its hashed vshard go on. Nothing accepted is lost or doubled, seq
// keeps growing across both moves, a retry of a message accepted before a
// move gets its first result after it, no message of the kicked member
// lies outside their membership periods, the moved records mark where the
// conversation's events changed vshard while its neighbours stayed on
// theirs, the read model's membership periods are the log's, the kicked
// member reads exactly the events of their periods, a member's device
// converges on the log, and the conversation takes sends and membership
// changes after both moves.
func TestIsolateUnderLoad(t *testing.T) {
	sharing(t, 75, 15)
	dev := startDev(t, t.TempDir(), "--rate-user", "-1", "--rate-conv", "-1")
	if dev.EP.Dedicated == 0 {
		t.Fatal("chatpipe dev has no dedicated vshards")
	}
	l := stacktest.StartLoad(t, dev.Dev, 4, 6) // lu0 owns lc0…lc5, lu1…lu3 are members
	const hot = "lc0"
	home := logrecord.VShard(hot, dev.EP.VShards)

	// The kicked member and a watcher who stays a member throughout.
	owner := dev.Dial(t, "lu0")
	watcher := newDevice(t, dev, "lu1", "lu1-watch")
	if err := watcher.connect(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(watcher.disconnect)
	kx := dev.Dial(t, "ikx")
	owner.Must(map[string]any{"op": "join", "conversation_id": hot, "user_id": "ikx"})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var halted sync.Once
	halt := func() { halted.Do(func() { close(stop) }) }
	defer func() { halt(); wg.Wait() }() // no sender outlives a test that fails half-way
	var mu sync.Mutex
	kxAccepted := map[string]int64{}
	kicks := 0

	// Two conversations of the same hashed vshard, written all along.
	var neighbours []string
	for i := 0; len(neighbours) < 2; i++ {
		if c := fmt.Sprintf("in-%d", i); logrecord.VShard(c, dev.EP.VShards) == home {
			neighbours = append(neighbours, c)
		}
	}
	var nbAccepted []acceptedMsg
	for _, c := range neighbours {
		owner.Must(map[string]any{"op": "create", "conversation_id": c, "members": []string{"lu2"}})
	}
	nb := dev.Dial(t, "lu2")
	wg.Add(1)
	go func() { // lu2 sends to the neighbours without pause
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			conv, cmid, sent := neighbours[i%len(neighbours)], fmt.Sprintf("in-lu2-%d", i), time.Now()
			r, err := nb.SendRetrying(conv, cmid, "next door")
			if err != nil || r.Op != protocol.OpAccepted {
				t.Errorf("lu2's send %s to %s: %+v %v", cmid, conv, r, err)
				return
			}
			mu.Lock()
			nbAccepted = append(nbAccepted, acceptedMsg{Conv: conv, ClientMessageID: cmid, MessageID: r.MessageID, Sender: "lu2", Seq: r.Seq, SentAt: sent, AcceptedAt: time.Now()})
			mu.Unlock()
		}
	}()
	wg.Add(2)
	go func() { // ikx sends without pause: accepted while a member, forbidden while out
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			cmid := fmt.Sprintf("ikx-%d", i)
			r, err := kx.SendRetrying(hot, cmid, "racing")
			switch {
			case err != nil:
				t.Errorf("ikx send %s: %v", cmid, err)
				return
			case r.Op == protocol.OpAccepted:
				mu.Lock()
				kxAccepted[cmid] = r.Seq
				mu.Unlock()
			case r.Code != protocol.CodeForbidden:
				t.Errorf("ikx send %s: %+v", cmid, r)
				return
			}
		}
	}()
	go func() { // the owner kicks ikx and adds them back
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			for _, op := range []string{"kick", "join"} {
				key := fmt.Sprintf("ik-%s-%d", op, i)
				for {
					r, err := owner.Do(map[string]any{"op": op, "conversation_id": hot, "user_id": "ikx", "client_message_id": key})
					if err != nil {
						t.Errorf("%s ikx: %v", op, err)
						return
					}
					if r.Code == protocol.CodeUnavailable {
						time.Sleep(time.Duration(r.RetryAfterMS) * time.Millisecond)
						continue
					}
					if r.Op != protocol.OpAccepted {
						t.Errorf("%s ikx: %+v", op, r)
						return
					}
					break
				}
			}
			mu.Lock()
			kicks++
			mu.Unlock()
		}
	}()

	retryEarlier := func(phase string) {
		t.Helper()
		var earlier []acceptedMsg
		for _, a := range l.Snapshot() {
			if a.Conv == hot && len(earlier) < 20 {
				earlier = append(earlier, a)
			}
		}
		cl := dev.Dial(t, "lu2")
		for _, a := range earlier {
			if a.Sender != "lu2" {
				continue
			}
			r, err := cl.SendRetrying(hot, a.ClientMessageID, "load")
			if err != nil || r.Op != protocol.OpAccepted || r.Seq != a.Seq || r.MessageID != a.MessageID {
				t.Errorf("%s: retry of %s (accepted seq %d %s) answered %+v %v", phase, a.ClientMessageID, a.Seq, a.MessageID, r, err)
			}
		}
	}

	time.Sleep(2 * time.Second)
	isolatedAt := time.Now()
	adminCmd(t, dev, "isolate", hot)
	time.Sleep(2 * time.Second)
	retryEarlier("after isolating")
	releasedAt := time.Now()
	adminCmd(t, dev, "unisolate", hot)
	time.Sleep(2 * time.Second)
	retryEarlier("after releasing")
	halt()
	wg.Wait()
	// Moved there and back, the conversation takes writes at once: a
	// send, and a kick that ends what the kicked member may send.
	if r, err := owner.SendRetrying(hot, "after-the-moves", "still here"); err != nil || r.Op != protocol.OpAccepted {
		t.Errorf("a send to %s after both moves answered %+v, %v; want accepted", hot, r, err)
	}
	owner.Must(map[string]any{"op": "kick", "conversation_id": hot, "user_id": "ikx", "client_message_id": "ik-last-kick"})
	if r, err := kx.SendRetrying(hot, "ikx-after-the-moves", "still in?"); err != nil || r.Code != protocol.CodeForbidden {
		t.Errorf("ikx's send to %s after the last kick answered %+v, %v; want forbidden", hot, r, err)
	}
	accepted := append(l.Finish(), nbAccepted...)
	checkWorld(t, dev.EP, accepted)
	// The neighbours went on while the conversation was away.
	var during int
	for _, a := range nbAccepted {
		if a.AcceptedAt.After(isolatedAt) && a.AcceptedAt.Before(releasedAt) {
			during++
		}
	}
	if during == 0 {
		t.Errorf("no send to %v (vshard %d, like %s) was accepted between the isolate and the release", neighbours, home, hot)
	}

	// The log: two moved records, to a dedicated vshard and back; the
	// events between them written by the dedicated vshard, the others by
	// the hashed one; seqs of the conversation gap-free.
	logRows := readLog(t, dev.EP)
	var moves []int64
	var mine []row
	for _, r := range logRows {
		if r.Conv == hot {
			mine = append(mine, r)
		}
	}
	sort.Slice(mine, func(i, j int) bool { return mine[i].Seq < mine[j].Seq })
	vs := map[int64]int{}
	eachLogEvent(t, dev.EP, func(_ *kgo.Record, e *logrecord.Event) {
		switch {
		case e.ConversationID == hot:
			vs[e.Seq] = e.VShard
		case slices.Contains(neighbours, e.ConversationID) && e.HasSeq() && e.VShard != home:
			t.Errorf("%s/%d written by vshard %d, not its own %d", e.ConversationID, e.Seq, e.VShard, home)
		}
	})
	for i, r := range mine {
		if r.Seq != int64(i+1) {
			t.Fatalf("%s: seq %d at position %d: seqs are not 1…n", hot, r.Seq, i)
		}
		if r.Kind == logrecord.KindMoved {
			moves = append(moves, r.Seq)
		}
	}
	if len(moves) != 2 || moves[1] == int64(len(mine)) {
		t.Fatalf("%s has moved records at seqs %v of %d, want 2 (isolated, released) with events after each", hot, moves, len(mine))
	}
	dedicated := vs[moves[0]+1]
	if dedicated < dev.EP.VShards || dedicated >= dev.EP.VShards+dev.EP.Dedicated {
		t.Errorf("after the first move %s was written by vshard %d, not a dedicated one", hot, dedicated)
	}
	for _, r := range mine {
		want := home
		if r.Seq > moves[0] && r.Seq <= moves[1] {
			want = dedicated
		}
		if vs[r.Seq] != want {
			t.Errorf("%s seq %d (%s) written by vshard %d, want %d (moves at %v)", hot, r.Seq, r.Kind, vs[r.Seq], want, moves)
		}
	}

	// I5 for the kicked member, in the log.
	per := periods(mine)[hot]["ikx"]
	visible := visibleTo(mine, per)
	n := 0
	for _, r := range mine {
		if r.Kind == logrecord.KindMessage && r.Sender == "ikx" {
			n++
			if _, ok := visible[r.Seq]; !ok {
				t.Errorf("ikx's message at seq %d lies outside their membership periods", r.Seq)
			}
		}
	}
	mu.Lock()
	if n != len(kxAccepted) || kicks == 0 {
		t.Errorf("ikx: %d messages in the log, %d accepted; %d kick cycles", n, len(kxAccepted), kicks)
	}
	mu.Unlock()

	// The watcher's device converges on the log, moved records included.
	waitProjected(t, dev.EP, len(logRows))

	// The read model agrees with the log across both moves: persist
	// applied the conversation's events of three partitions in seq order,
	// so every membership period — the kicked member's above all — is the
	// log's.
	if got, want := projectedPeriods(t, dev.EP)[hot], periods(mine)[hot]; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s's membership periods in Postgres differ from the log's:\n got %v\nwant %v", hot, got, want)
	}
	// The kicked member reads the events of their periods and no other.
	kxDev := newDevice(t, dev, "ikx", "ikx-read")
	if err := kxDev.connect(); err != nil {
		t.Fatal(err)
	}
	defer kxDev.disconnect()
	hist, err := kxDev.history(hot, 200)
	if err != nil {
		t.Fatal(err)
	}
	var wantKx []int64
	for s := range visible {
		wantKx = append(wantKx, s)
	}
	slices.Sort(wantKx)
	if !slices.Equal(hist, wantKx) {
		t.Errorf("ikx's history of %s has %d events, their periods %v hold %d", hot, len(hist), per, len(wantKx))
	}
	if got := kxDev.seqs(hot); !slices.Equal(got, wantKx) {
		t.Errorf("ikx's sync of %s gave %d events, their periods %v hold %d", hot, len(got), per, len(wantKx))
	}

	last := mine[len(mine)-1].Seq
	stacktest.WaitFor(t, 60*time.Second, "the watcher's device to hold the whole conversation", func() bool {
		s := watcher.seqs(hot)
		return len(s) > 0 && s[len(s)-1] == last
	})
	want := make([]int64, 0, len(mine))
	for _, r := range mine {
		want = append(want, r.Seq)
	}
	if got := watcher.seqs(hot); !slices.Equal(got, want) {
		t.Errorf("the watcher holds %d events of %s, the log %d", len(got), hot, len(want))
	}

	// What clients saw: the longest time without an accepted send of the
	// hot conversation around each move (its clients retry through it),
	// and the slowest accepted send of the other conversations.
	var hotAt []time.Time
	var otherMax time.Duration
	for _, a := range accepted {
		if a.Conv == hot {
			hotAt = append(hotAt, a.AcceptedAt)
		} else {
			otherMax = max(otherMax, a.AcceptedAt.Sub(a.SentAt))
		}
	}
	slices.SortFunc(hotAt, func(a, b time.Time) int { return a.Compare(b) })
	gap := func(around time.Time) time.Duration {
		var g time.Duration
		for i := 1; i < len(hotAt); i++ {
			if hotAt[i].After(around.Add(-time.Second)) && hotAt[i-1].Before(around.Add(3*time.Second)) {
				g = max(g, hotAt[i].Sub(hotAt[i-1]))
			}
		}
		return g
	}
	t.Logf("%d sends accepted (%d kick cycles); %s: seqs 1…%d, moved at seqs %v; longest pause between accepted sends of %s: %v around the isolate, %v around the release; slowest accepted send of the other conversations %v",
		len(accepted), kicks, hot, last, moves, hot, gap(isolatedAt).Round(time.Millisecond), gap(releasedAt).Round(time.Millisecond), otherMax.Round(time.Millisecond))
}

// adminCmd runs `chatpipe admin args[0] --endpoints … args[1:]…` against
// dev's stack and fails the test if it fails.
func adminCmd(t *testing.T, dev *devProc, args ...string) {
	t.Helper()
	out, err := exec.Command(binary, append([]string{"admin", args[0], "--endpoints", filepath.Join(dev.Dir, "endpoints.json")}, args[1:]...)...).CombinedOutput()
	t.Logf("admin %v: %s", args, out)
	if err != nil {
		t.Fatalf("admin %v: %v", args, err)
	}
}
