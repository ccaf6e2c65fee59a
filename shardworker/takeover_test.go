package shardworker

import (
	"log/slog"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/protocol"
)

// TestShardWaitsForItsTurnToTakeOver: a vshard whose worker has no
// takeover turn free makes no round trip (its writer does not exist yet)
// and holds the commands that arrive; stopped while it waits, it ends at
// once, answers them with a retry, and leaves the turns as they were.
func TestShardWaitsForItsTurnToTakeOver(t *testing.T) {
	w := &Worker{cfg: Config{QueueLen: 4, VShards: 8, Partitions: 2}, log: slog.New(slog.DiscardHandler), takeovers: make(chan struct{}, 1)}
	w.takeovers <- struct{}{} // another vshard's turn
	s := newShard(w, 3, lease.Row{Owner: lease.Owner{Epoch: 1}})
	var got *protocol.Reply
	var retry bool
	if !s.submit(&shardcore.Call{ReqID: "r1", Tag: replyFunc(func(r *protocol.Reply, rt bool) { got, retry = r, rt })}) {
		t.Fatal("submit refused while waiting for a turn")
	}
	go s.run()
	select {
	case <-s.done:
		t.Fatal("the shard ended without a turn and without being stopped")
	case <-time.After(200 * time.Millisecond):
	}
	if s.cl != nil || got != nil {
		t.Fatalf("the shard acted before its turn: producer %v, reply %+v", s.cl, got)
	}
	s.stop()
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the shard did not end within 5 s of stop while waiting for a turn")
	}
	if got == nil || got.Code != protocol.CodeUnavailable || !retry {
		t.Errorf("queued command answered %+v (retry %v), want unavailable with retry", got, retry)
	}
	if len(w.takeovers) != 1 {
		t.Errorf("%d turns held after the stop, want 1 (the other vshard's)", len(w.takeovers))
	}
}
