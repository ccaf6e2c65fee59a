package e2e

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestRefusalsDoNotPinConversations: a user who is in none of them sends
// to many conversations of one vshard — far more than a writer caches
// (--cache-convs 8) — and every send is refused. The writer remembers each
// refusal of a key for a while (docs/protocol.md, "Attempts in flight"),
// but the conversations are evicted all the same: the cache stays within
// its bound (docs/operations.md, "Memory bounds"). And the memory holds
// through the evictions: a retry of a refused send, after the user was
// added to the conversation meanwhile, is still refused.
func TestRefusalsDoNotPinConversations(t *testing.T) {
	parallel(t)
	const cacheConvs, refused = 8, 200
	dev := startDev(t, t.TempDir(), "--cache-convs", fmt.Sprint(cacheConvs), "--rate-user", "-1")
	metrics := dev.EP.Admin + "/metrics"

	// The conversations, all of one vshard: the first exists, the others
	// do not.
	home := logrecord.VShard("rb-0", dev.EP.VShards)
	convs := []string{"rb-0"}
	for i := 1; len(convs) < refused; i++ {
		if c := fmt.Sprintf("rb-%d", i); logrecord.VShard(c, dev.EP.VShards) == home {
			convs = append(convs, c)
		}
	}
	owner := dev.Dial(t, "rb-owner")
	owner.Must(map[string]any{"op": "create", "conversation_id": convs[0], "members": []string{}})
	evictedBefore := stacktest.Metric(t, metrics, "chatpipe_worker_evictions_total")

	// Every send refused, by four connections at once.
	const conns = 4
	var wg sync.WaitGroup
	for w := range conns {
		cl := dev.Dial(t, "rb-outsider")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(convs); i += conns {
				r, err := cl.SendRetrying(convs[i], "rb-key-"+convs[i], "let me in")
				if err != nil || r.Code != protocol.CodeForbidden {
					t.Errorf("rb-outsider's send to %s answered %+v %v, want forbidden", convs[i], r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// Each conversation was loaded once for its refusal; what the writer
	// still holds of them is at most the ones it did not evict.
	held := func() int {
		return refused - int(stacktest.Metric(t, metrics, "chatpipe_worker_evictions_total")-evictedBefore)
	}
	stacktest.WaitForOr(t, 30*time.Second, fmt.Sprintf("vshard %d's writer to hold at most %d conversations after refusing sends to %d", home, cacheConvs, refused),
		func() bool { return held() <= cacheConvs },
		func() string {
			return fmt.Sprintf("it evicted %d of them: at least %d are cached", refused-held(), held())
		})

	// The refusal of rb-0's key stands although the outsider is a member
	// now: a fresh decision would accept it.
	owner.Must(map[string]any{"op": "join", "conversation_id": convs[0], "user_id": "rb-outsider", "client_message_id": "rb-join"})
	cl := dev.Dial(t, "rb-outsider")
	if r, err := cl.SendRetrying(convs[0], "rb-key-"+convs[0], "let me in"); err != nil || r.Code != protocol.CodeForbidden {
		t.Errorf("the retry of rb-outsider's refused send to %s, after the join, answered %+v %v; want forbidden, as first answered", convs[0], r, err)
	}
	if r, err := cl.SendRetrying(convs[0], "rb-key-new", "in"); err != nil || r.Op != protocol.OpAccepted {
		t.Errorf("rb-outsider's new send to %s after the join answered %+v %v, want accepted", convs[0], r, err)
	}
	// And the log holds no message of the refused keys.
	for _, r := range readLog(t, dev.EP) {
		if r.Kind == logrecord.KindMessage && r.Sender == "rb-outsider" && r.ClientMessageID != "rb-key-new" {
			t.Errorf("%s/%d: a message of rb-outsider with the refused key %s", r.Conv, r.Seq, r.ClientMessageID)
		}
	}
}
