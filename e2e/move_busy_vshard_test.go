package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestMoveFromBusyVShard: a conversation is isolated and released while
// its hashed vshard's writer always has commands waiting (sends paced
// faster than its transactions, each held 100 ms by
// CHATPIPE_FAULT_SLEEP_BEFORE_COMMIT): the writer takes the override
// changes between its batches all the same. The conversation moves out and
// back home, once each, takes sends after both moves, and the sends to its
// neighbours are all there once.
func TestMoveFromBusyVShard(t *testing.T) {
	sharing(t, 20, 14)
	dev := startDev(t, t.TempDir(), "--workers", "0", "--rate-user", "-1", "--rate-conv", "-1")
	if dev.EP.Dedicated == 0 {
		t.Fatal("chatpipe dev has no dedicated vshards")
	}
	ep := filepath.Join(dev.Dir, "endpoints.json")
	stacktest.StartProc(t, dev.Dir, "w1", []string{"CHATPIPE_FAULT_SLEEP_BEFORE_COMMIT=100ms"},
		"worker", "--endpoints", ep, "--id", "w1", "--log-level", "warn")
	stacktest.WaitOwned(t, 120*time.Second, "w1 to own every vshard", dev.EP, dev.EP.All(), "w1", dev.EP.All())

	const hot = "mb-hot"
	home := logrecord.VShard(hot, dev.EP.VShards)
	var convs []string
	for i := 0; len(convs) < 4; i++ {
		if c := fmt.Sprintf("mb-%d", i); logrecord.VShard(c, dev.EP.VShards) == home {
			convs = append(convs, c)
		}
	}
	owner := dev.Dial(t, "mb-owner")
	for _, c := range append([]string{hot}, convs...) {
		owner.Must(map[string]any{"op": "create", "conversation_id": c, "members": []string{"mb-u"}})
	}

	var mu sync.Mutex
	var accepted []acceptedMsg
	var refused []string
	// Two connections send to the neighbours every 20 ms each, whether or
	// not the earlier sends were answered: about 10 sends arrive during
	// each of the writer's transactions.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for s := range 2 {
		cl := dev.Dial(t, "mb-u")
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for n := 0; ; n++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				conv, cmid, sent := convs[n%len(convs)], fmt.Sprintf("mb-u-%d-%d", s, n), time.Now()
				id := cl.Conn.NewID()
				b, _ := json.Marshal(map[string]any{"op": "send", "id": id, "conversation_id": conv, "client_message_id": cmid, "body": "busy"})
				err := cl.Conn.Go(ctx, id, b, func(f []byte) {
					var r protocol.Reply
					if err := json.Unmarshal(f, &r); err != nil {
						t.Errorf("answer to %s: %s", cmid, f)
						return
					}
					mu.Lock()
					defer mu.Unlock()
					if r.Op == protocol.OpAccepted {
						accepted = append(accepted, acceptedMsg{Conv: conv, ClientMessageID: cmid, MessageID: r.MessageID, Sender: "mb-u", Seq: r.Seq, SentAt: sent, AcceptedAt: time.Now()})
					} else {
						refused = append(refused, fmt.Sprintf("%s: %s %s", cmid, r.Code, r.Message))
					}
				})
				if err != nil && ctx.Err() == nil {
					t.Errorf("send %s: %v", cmid, err)
					return
				}
			}
		}()
	}
	// The hot conversation takes sends throughout.
	hotSender := dev.Dial(t, "mb-owner")
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ctx.Err() == nil; n++ {
			cmid, sent := fmt.Sprintf("mb-hot-%d", n), time.Now()
			r, err := hotSender.SendRetrying(hot, cmid, "hot")
			if err != nil || r.Op != protocol.OpAccepted {
				if ctx.Err() == nil {
					t.Errorf("send %s to %s: %+v %v", cmid, hot, r, err)
				}
				return
			}
			mu.Lock()
			accepted = append(accepted, acceptedMsg{Conv: hot, ClientMessageID: cmid, MessageID: r.MessageID, Sender: "mb-owner", Seq: r.Seq, SentAt: sent, AcceptedAt: time.Now()})
			mu.Unlock()
		}
	}()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(accepted) }
	stacktest.WaitFor(t, 30*time.Second, "sends to flow", func() bool { return count() > 100 })

	adminCmd(t, dev, "isolate", "--wait", "20s", hot)
	adminCmd(t, dev, "unisolate", "--wait", "20s", hot)
	// Sends go on at home while the writers look at the move again.
	n := count()
	stacktest.WaitFor(t, 30*time.Second, "sends to flow after the moves", func() bool { return count() > n+300 })
	if r, err := owner.SendRetrying(hot, "mb-after-the-moves", "home"); err != nil || r.Op != protocol.OpAccepted {
		t.Errorf("a send to %s after both moves answered %+v, %v; want accepted", hot, r, err)
	}
	cancel()
	wg.Wait()

	mu.Lock()
	if len(refused) > 0 {
		t.Errorf("%d sends to %v were refused, e.g. %s", len(refused), convs, refused[0])
	}
	checkWorld(t, dev.EP, accepted)
	// Answers to the paced sends still in flight arrive after cancel, on
	// the connections' read goroutines: accepted is read under mu only.
	nAccepted := len(accepted)
	mu.Unlock()
	var moves []string
	var mine []*logrecord.Event
	eachLogEvent(t, dev.EP, func(_ *kgo.Record, e *logrecord.Event) {
		if e.ConversationID == hot && e.Kind == logrecord.KindMoved {
			mine = append(mine, e)
		}
	})
	sort.Slice(mine, func(i, j int) bool { return mine[i].Seq < mine[j].Seq })
	for _, e := range mine {
		moves = append(moves, fmt.Sprintf("%d:%d→%d", e.Seq, e.VShard, *e.ToVShard))
	}
	if len(mine) != 2 || mine[0].VShard != home || *mine[1].ToVShard != home {
		t.Errorf("%s's moved records: %v; want one out of vshard %d and one back", hot, moves, home)
	}
	t.Logf("%d sends accepted; %s moved %v", nAccepted, hot, moves)
}
