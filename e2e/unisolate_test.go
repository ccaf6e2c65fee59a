package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestUnisolateWhilePersistIsBehind: a conversation is isolated and at
// once released again while persist (its own process) is paused, so
// Postgres shows neither move. `admin unisolate` must not report the
// conversation home — nor delete the override — before it is: the
// dedicated vshard's writer can move it home only once the moved record
// that brought it there is stored. Once persist resumes, the override is
// removed by the hashed vshard's writer, the conversation takes writes
// at its hashed vshard, and its moved records in the log go there and
// back in seq order.
func TestUnisolateWhilePersistIsBehind(t *testing.T) {
	sharing(t, 15, 23)
	dev := startDev(t, t.TempDir(), "--persist=false")
	if dev.EP.Dedicated == 0 {
		t.Fatal("chatpipe dev has no dedicated vshards")
	}
	epPath := filepath.Join(dev.Dir, "endpoints.json")
	persist := stacktest.StartProc(t, dev.Dir, "persist", nil, "persist", "--endpoints", epPath, "--log-level", "warn")
	const conv = "uz"
	home := logrecord.VShard(conv, dev.EP.VShards)
	owner := dev.Dial(t, "uo")
	owner.Must(map[string]any{"op": "create", "conversation_id": conv, "members": []string{"um"}})
	send := func(cmid string) *protocol.Reply {
		t.Helper()
		r, err := owner.SendRetrying(conv, cmid, "hello")
		if err != nil {
			t.Fatalf("send %s to %s: %v", cmid, conv, err)
		}
		return r
	}
	if r := send("before"); r.Op != protocol.OpAccepted {
		t.Fatalf("send before the moves: %+v", r)
	}
	admin := func(args ...string) (string, error) {
		out, err := exec.Command(binary, append([]string{"admin", args[0], "--endpoints", epPath}, args[1:]...)...).CombinedOutput()
		t.Logf("admin %v: %s", args, strings.TrimSpace(string(out)))
		return string(out), err
	}

	persist.Signal(syscall.SIGSTOP)
	// The move out is committed, but persist does not store it: isolate
	// gives up waiting for it (and says so).
	if out, err := admin("isolate", "--wait", "2s", conv); err == nil {
		t.Fatalf("isolate said the move was stored while persist is paused: %s", out)
	}
	if out, err := admin("unisolate", "--wait", "3s", conv); err == nil {
		t.Errorf("unisolate reported %s home while persist is paused (its moved record to a dedicated vshard is not stored, so nobody can have moved it back): %s", conv, out)
	}
	persist.Signal(syscall.SIGCONT)

	// Running it again finishes the release (or finds it finished).
	if _, err := admin("unisolate", "--wait", "60s", conv); err != nil {
		t.Errorf("unisolate after persist resumed: %v", err)
	}
	start := time.Now()
	var r *protocol.Reply
	for {
		r = send(fmt.Sprintf("after-%d", time.Now().UnixNano()))
		if r.Op == protocol.OpAccepted || time.Since(start) > 60*time.Second {
			break
		}
	}
	if r.Op != protocol.OpAccepted {
		t.Fatalf("%s takes no writes %v after persist resumed: %+v", conv, time.Since(start).Round(time.Second), r)
	}

	// The log: the moved records of conv go to a dedicated vshard and
	// back home, and its seqs only grow in commit order per vshard.
	// The log is read a partition at a time, so the moves are put in seq
	// order before they are judged.
	var moved []*logrecord.Event
	var seqs []int64
	eachLogEvent(t, dev.EP, func(_ *kgo.Record, e *logrecord.Event) {
		if e.ConversationID != conv || !e.HasSeq() {
			return
		}
		seqs = append(seqs, e.Seq)
		if e.Kind == logrecord.KindMoved {
			moved = append(moved, e)
		}
	})
	sort.Slice(moved, func(i, j int) bool { return moved[i].Seq < moved[j].Seq })
	var moves []string
	for _, e := range moved {
		moves = append(moves, fmt.Sprintf("seq %d v%d→v%d", e.Seq, e.VShard, *e.ToVShard))
	}
	if len(moves) != 2 || !strings.HasSuffix(moves[1], fmt.Sprintf("→v%d", home)) {
		t.Errorf("moved records of %s: %v, want one to a dedicated vshard and one back to v%d", conv, moves, home)
	}
	seen := map[int64]bool{}
	for _, s := range seqs {
		if seen[s] {
			t.Errorf("%s: seq %d twice in the log (seqs %v)", conv, s, seqs)
		}
		seen[s] = true
	}
	if n := stacktest.Metric(t, dev.EP.Admin+"/metrics", "chatpipe_worker_overrides_released_total"); n != 1 {
		t.Errorf("chatpipe_worker_overrides_released_total = %v, want 1", n)
	}
}
