package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestDedupeBounded: a writer's in-memory dedupe is bounded by
// --dedupe-keep and --dedupe-memory once persist has stored the results,
// and a retry of a trimmed send or keyed membership command still gets its
// first result (from Postgres), never a second event. A first send to a
// cached conversation asks Postgres nothing: the conversation's filter of
// known keys rules its new key out.
func TestDedupeBounded(t *testing.T) {
	parallel(t)
	dev := startDev(t, t.TempDir(), "--dedupe-keep", "2", "--dedupe-memory", "1s", "--rate-user", "-1")
	metrics := dev.EP.Admin + "/metrics"
	alice := dev.Dial(t, "alice")
	alice.Must(map[string]any{"op": "create", "conversation_id": "dd", "members": []string{"bob"}, "client_message_id": "k-create"})
	// Keyed membership commands, each later retried once its result is
	// only in Postgres.
	join := map[string]any{"op": "join", "conversation_id": "dd", "user_id": "carol", "client_message_id": "k-join"}
	joined := alice.Must(join)
	alice.Must(map[string]any{"op": "kick", "conversation_id": "dd", "user_id": "carol", "client_message_id": "k-kick"})
	const n = 60
	loads := stacktest.Metric(t, metrics, "chatpipe_worker_state_loads_total")
	first := make([]*protocol.Reply, n)
	for i := range first {
		first[i] = alice.Must(map[string]any{"op": "send", "conversation_id": "dd", "client_message_id": fmt.Sprint("m", i), "body": "x"})
	}
	if more := stacktest.Metric(t, metrics, "chatpipe_worker_state_loads_total") - loads; more != 0 {
		t.Errorf("%d first sends to the cached conversation dd asked Postgres %.0f times, want none", n, more)
	}
	readEvents(t, dev.EP.Postgres, n+3) // persist has stored them
	time.Sleep(1200 * time.Millisecond) // older than --dedupe-memory
	// The next batch of the writer trims (at most once a second).
	alice.Must(map[string]any{"op": "send", "conversation_id": "dd", "client_message_id": "trigger", "body": "x"})
	deadline := time.Now().Add(10 * time.Second)
	for {
		held := stacktest.Metric(t, metrics, "chatpipe_worker_dedupe_entries")
		trimmed := stacktest.Metric(t, metrics, "chatpipe_worker_dedupe_trimmed_total")
		if trimmed >= n && held <= 2 {
			t.Logf("dedupe: %.0f held, %.0f trimmed", held, trimmed)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dedupe not trimmed: %.0f held, %.0f trimmed after %d stored sends", held, trimmed, n)
		}
		time.Sleep(200 * time.Millisecond)
		alice.Must(map[string]any{"op": "send", "conversation_id": "dd", "client_message_id": "trigger", "body": "x"})
	}
	// Every retry finds its first result, now answered from Postgres.
	for i, f := range first {
		r := alice.Must(map[string]any{"op": "send", "conversation_id": "dd", "client_message_id": fmt.Sprint("m", i), "body": "again"})
		if r.Seq != f.Seq || r.MessageID != f.MessageID {
			t.Errorf("retry of m%d: seq %d %s, first was seq %d %s", i, r.Seq, r.MessageID, f.Seq, f.MessageID)
		}
	}
	// The join retried after the kick answers its first result and does
	// not re-add carol; the create retried answers seq 1, not conflict.
	if r := alice.Must(join); r.Seq != joined.Seq || r.MessageID != joined.MessageID {
		t.Errorf("join retried after the kick: %+v, first was %+v", r, joined)
	}
	if r := alice.Must(map[string]any{"op": "create", "conversation_id": "dd", "members": []string{"bob"}, "client_message_id": "k-create"}); r.Seq != 1 {
		t.Errorf("create retried: %+v", r)
	}
	kinds := map[string]int{}
	for _, r := range readLog(t, dev.EP) {
		if r.Conv == "dd" {
			kinds[r.Kind]++
		}
	}
	if kinds["message"] != n+1 || kinds["join"] != 1 || kinds["create"] != 1 || kinds["kick"] != 1 {
		t.Errorf("log of dd holds %v, want %d messages and one create, join and kick: a retry wrote again", kinds, n+1)
	}
}
