package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestMoveWithMergedLoads: one worker process holds a conversation's
// hashed vshard and the dedicated ones, and its writers' state loads are
// slow and merged (CHATPIPE_FAULT_LOADER_SLOW: every load waits, and one
// Postgres round trip every 150 ms answers all that queued meanwhile). The
// hashed vshard's writer caches 4 of the 13 conversations it writes, so
// the hot one, idle before each move, is loaded again when the move is
// routed: by that writer, by the dedicated vshard it goes to for the burst
// of sends that arrive with the route, and by the other dedicated one, in
// one round trip. The conversation is isolated and released three times.
// Each writer must get a state of its own from such a round trip: the
// worker neither crashes nor races (its log), no seq is handed out twice,
// every send and every retry of an earlier one gets its first answer, and
// the conversation's seqs run 1…n across the moves, each written by the
// vshard it was at.
func TestMoveWithMergedLoads(t *testing.T) {
	sharing(t, 15, 27)
	dev := startDev(t, t.TempDir(), "--workers", "0", "--rate-user", "-1", "--rate-conv", "-1")
	if dev.EP.Dedicated == 0 {
		t.Fatal("chatpipe dev has no dedicated vshards")
	}
	ep := filepath.Join(dev.Dir, "endpoints.json")
	w := stacktest.StartProc(t, dev.Dir, "w1", []string{"CHATPIPE_FAULT_LOADER_SLOW=150ms"},
		"worker", "--endpoints", ep, "--id", "w1", "--log-level", "warn", "--cache-convs", "4")
	stacktest.WaitOwned(t, 120*time.Second, "w1 to own every vshard", dev.EP, dev.EP.All(), "w1", dev.EP.All())

	const hot, cycles = "mm-hot", 3
	home := logrecord.VShard(hot, dev.EP.VShards)
	var convs []string // the hot one's neighbours on its hashed vshard
	for i := 0; len(convs) < 12; i++ {
		if c := fmt.Sprintf("mm-%d", i); logrecord.VShard(c, dev.EP.VShards) == home {
			convs = append(convs, c)
		}
	}
	users := []string{"mm-u0", "mm-u1", "mm-u2", "mm-u3"}
	owner := dev.Dial(t, "mm-owner")
	for _, c := range append([]string{hot}, convs...) {
		owner.Must(map[string]any{"op": "create", "conversation_id": c, "members": users})
	}
	loaders := []string{}
	for i := range 8 {
		loaders = append(loaders, users[i%len(users)])
	}

	var mu sync.Mutex
	var accepted []acceptedMsg
	record := func(conv, user, cmid string, r *protocol.Reply, sent time.Time) {
		mu.Lock()
		accepted = append(accepted, acceptedMsg{Conv: conv, ClientMessageID: cmid, MessageID: r.MessageID, Sender: user, Seq: r.Seq, SentAt: sent, AcceptedAt: time.Now()})
		mu.Unlock()
	}
	// The neighbours take sends all along: the hashed vshard's writer
	// loads and evicts without pause.
	stop := make(chan struct{})
	var load sync.WaitGroup
	for i, u := range loaders {
		cl := dev.Dial(t, u)
		load.Add(1)
		go func() {
			defer load.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				conv, cmid, sent := convs[(n*len(loaders)+i)%len(convs)], fmt.Sprintf("%s-%d-n%d", u, i, n), time.Now()
				r, err := cl.SendRetrying(conv, cmid, "load")
				if err != nil || r.Op != protocol.OpAccepted {
					t.Errorf("%s's send %s to %s: %+v %v", u, cmid, conv, r, err)
					return
				}
				record(conv, u, cmid, r, sent)
			}
		}()
	}
	stopLoad := sync.OnceFunc(func() { close(stop); load.Wait() })
	defer stopLoad()

	cli := stacktest.EtcdClient(t, dev.EP)
	hotClients := make([]*client, len(users))
	for i, u := range users {
		hotClients[i] = dev.Dial(t, u)
	}
	// burst sends to the hot conversation from every member at once until
	// done closes: new sends, and retries of each member's first send.
	burst := func(phase string, done <-chan struct{}) {
		var wg sync.WaitGroup
		for i, u := range users {
			wg.Add(1)
			go func() {
				defer wg.Done()
				first := fmt.Sprintf("%s-hot-first", u)
				for n := 0; ; n++ {
					cmid := fmt.Sprintf("%s-hot-%s-%d", u, phase, n)
					if n%3 == 2 {
						cmid = first
					}
					sent := time.Now()
					r, err := hotClients[i].SendRetrying(hot, cmid, "hot")
					if err != nil || r.Op != protocol.OpAccepted {
						t.Errorf("%s: %s's send %s to %s: %+v %v", phase, u, cmid, hot, r, err)
						return
					}
					record(hot, u, cmid, r, sent)
					select {
					case <-done:
						return
					default:
					}
				}
			}()
		}
		wg.Wait()
	}
	for _, u := range hotClients { // the first sends that the bursts retry
		if r, err := u.SendRetrying(hot, u.User+"-hot-first", "hot"); err != nil || r.Op != protocol.OpAccepted {
			t.Fatalf("%s's first send to %s: %+v %v", u.User, hot, r, err)
		} else {
			record(hot, u.User, u.User+"-hot-first", r, time.Now())
		}
	}
	// move runs admin args while a burst starts as soon as the route is
	// in etcd, and ends the burst a second after the command returned;
	// false if the command failed.
	move := func(phase string, args ...string) bool {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		routed := cli.Watch(ctx, lease.RouteKey(lease.DefaultPrefix, hot))
		out := make(chan string, 1)
		go func() {
			b, err := exec.Command(binary, append([]string{"admin", args[0], "--endpoints", ep}, args[1:]...)...).CombinedOutput()
			if err != nil {
				b = append(b, []byte("; "+err.Error())...)
			}
			out <- string(b)
		}()
		select {
		case <-routed:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: %s's route did not change within 30 s", phase, hot)
		}
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); burst(phase, done) }()
		res := <-out
		t.Logf("%s: admin %v: %s", phase, args, strings.TrimSpace(res))
		time.Sleep(time.Second)
		close(done)
		wg.Wait()
		if strings.Contains(res, "exit status") {
			t.Errorf("%s: admin %v failed", phase, args)
			return false
		}
		return true
	}
	for c := range cycles {
		// Idle, the hot conversation leaves the hashed writer's cache.
		time.Sleep(1500 * time.Millisecond)
		if !move(fmt.Sprintf("isolate%d", c), "isolate", "--vshard", fmt.Sprint(dev.EP.VShards+c%dev.EP.Dedicated), hot) ||
			!move(fmt.Sprintf("release%d", c), "unisolate", hot) {
			break
		}
	}
	stopLoad()

	select {
	case <-w.Done():
		t.Fatalf("w1 exited during the test; its log:\n%s", stacktest.Tail(w.Log))
	default:
	}
	merged := grepLines(w.Log, "PLANTED FAULT: one round trip loads a conversation for several writers", "conversation="+hot)
	t.Logf("round trips that loaded %s for several writers:\n%s", hot, grepLines(w.Log, "conversation="+hot))
	if !strings.Contains(merged, "conversation="+hot) {
		t.Errorf("no round trip loaded %s for two writers: the moves were not tested with merged loads", hot)
	}
	if bad := grepLines(w.Log, "concurrent map", "DATA RACE", "panic:"); bad != "" {
		t.Errorf("w1 crashed or raced:\n%s\n%s", bad, stacktest.TailN(w.Log, 200))
	}
	if bad := grepLines(filepath.Join(dev.Dir, "dev.log"), "BROKEN INVARIANT"); bad != "" {
		t.Errorf("persist found a seq or client_message_id taken twice:\n%s", bad)
	}

	// Every answer was the first one, and no seq was handed out twice.
	mu.Lock()
	defer mu.Unlock()
	first := map[string]acceptedMsg{}
	var unique []acceptedMsg
	for _, a := range accepted {
		k := a.Conv + "/" + a.ClientMessageID
		if f, ok := first[k]; ok {
			if f.Seq != a.Seq || f.MessageID != a.MessageID {
				t.Errorf("%s: first accepted as seq %d %s, a retry as seq %d %s", k, f.Seq, f.MessageID, a.Seq, a.MessageID)
			}
			continue
		}
		first[k] = a
		unique = append(unique, a)
	}
	checkWorld(t, dev.EP, unique)

	// The hot conversation's seqs run 1…n, each event written by the
	// vshard it was at: its hashed one, or the one of the last move.
	var mine []*logrecord.Event
	eachLogEvent(t, dev.EP, func(_ *kgo.Record, e *logrecord.Event) {
		if e.ConversationID == hot && e.HasSeq() {
			mine = append(mine, e)
		}
	})
	sort.Slice(mine, func(i, j int) bool { return mine[i].Seq < mine[j].Seq })
	at, moves := home, 0
	var trail []string
	for i, e := range mine {
		if e.Seq != int64(i+1) {
			t.Fatalf("%s: seq %d at position %d: seqs are not 1…n", hot, e.Seq, i)
		}
		if e.VShard != at {
			t.Errorf("%s/%d (%s) written by vshard %d, but it was at vshard %d", hot, e.Seq, e.Kind, e.VShard, at)
		}
		if e.Kind == logrecord.KindMoved {
			at, moves = *e.ToVShard, moves+1
			trail = append(trail, fmt.Sprintf("%d:%d→%d", e.Seq, e.VShard, at))
		}
	}
	if moves != 2*cycles || at != home {
		t.Errorf("%s moved %d times (%v) and is at vshard %d; want %d moves, home at %d", hot, moves, trail, at, 2*cycles, home)
	}
	t.Logf("%d sends accepted (%d distinct); %s: seqs 1…%d, moves at %v", len(accepted), len(unique), hot, len(mine), trail)
}
