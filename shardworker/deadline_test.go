package shardworker

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/protocol"
	"github.com/chatpipe/chatpipe/shardcore"
	"github.com/chatpipe/chatpipe/wire"
)

// A command that waited in the queue past its deadline (the gateway has
// told its client the outcome is unknown, and may have sent it again) is
// not decided: collect answers it unavailable with a retry (nothing
// written) and hands the writer only the commands still in time.
func TestExpiredQueuedCommandIsNotDecided(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	w := &Worker{cfg: Config{VShards: 1, MaxBatch: 100, Protocol: protocol.DefaultLimits()}, log: log, shards: map[int]*shard{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := &shard{w: w, v: 0, log: log, in: make(chan *call, 10), ctx: ctx, cancel: cancel, done: make(chan struct{})}
	w.shards[0] = s

	var mu sync.Mutex
	answers := map[string]*wire.Response{}
	send := func(id string, budget time.Duration) {
		req := &wire.Request{RID: 1, User: "u1", Req: &protocol.Request{Op: protocol.OpSend, ID: id,
			ConversationID: "c1", ClientMessageID: "m-" + id, Body: "hi"}}
		if budget > 0 {
			req.Budget, req.Deadline = budget, time.Now().Add(budget)
		}
		w.handle(req, func(r *wire.Response) {
			mu.Lock()
			answers[id] = r
			mu.Unlock()
		})
	}
	send("late1", 20*time.Millisecond) // expires while queued
	send("ontime", time.Minute)
	send("late2", 20*time.Millisecond)
	send("nolimit", 0) // an older gateway sends no budget
	time.Sleep(50 * time.Millisecond)

	batch, _, ok := s.collect()
	if !ok {
		t.Fatal("collect stopped")
	}
	var got []string
	for _, c := range batch {
		got = append(got, c.reqID)
	}
	if len(got) != 2 || got[0] != "ontime" || got[1] != "nolimit" {
		t.Fatalf("batch %v, want [ontime nolimit]", got)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range []string{"late1", "late2"} {
		r := answers[id]
		if r == nil || !r.Retry || r.Reply.Code != protocol.CodeUnavailable {
			t.Fatalf("%s: answer %+v, want unavailable with retry", id, r)
		}
	}
	if len(answers) != 2 {
		t.Fatalf("answers %v: only the expired commands are answered by collect", answers)
	}
}

// A batch of expired commands only: collect keeps waiting for one in time.
func TestCollectWaitsPastExpiredCommands(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	w := &Worker{cfg: Config{VShards: 1, MaxBatch: 100}, log: log}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := &shard{w: w, log: log, in: make(chan *call, 10), ctx: ctx, cancel: cancel}
	answered := make(chan bool, 1)
	s.in <- &call{reqID: "late", deadline: time.Now().Add(-time.Millisecond),
		done: func(r *protocol.Reply, retry bool) { answered <- retry }}
	go func() {
		time.Sleep(50 * time.Millisecond)
		s.in <- &call{reqID: "ontime", done: func(*protocol.Reply, bool) {}}
	}()
	batch, _, ok := s.collect()
	if !ok || len(batch) != 1 || batch[0].reqID != "ontime" {
		t.Fatalf("collect: ok=%v batch of %d, want only ontime", ok, len(batch))
	}
	if retry := <-answered; !retry {
		t.Fatal("the expired command was not answered with a retry")
	}
}

// A command collected in time whose deadline passes while the batch's
// state is loaded (a slow Postgres) is not decided either: process answers
// it unavailable and, with nothing else decided, commits nothing.
func TestCommandExpiredBeforeDecideIsNotDecided(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	w := &Worker{cfg: Config{VShards: 1, MaxBatch: 100, MaxConvs: 10}, log: log}
	s := &shard{w: w, log: log, convs: map[string]*shardcore.Conv{"c1": {Exists: true, Owner: "u1",
		Members: map[string]int64{"u1": 1, "u2": 1}, Dedupe: map[string]shardcore.First{}}}}
	var got *protocol.Reply
	c := &call{reqID: "k1", deadline: time.Now().Add(-time.Millisecond),
		cmd:  shardcore.Command{Op: protocol.OpKick, ConversationID: "c1", Sender: "u1", UserID: "u2"},
		done: func(r *protocol.Reply, retry bool) { got = r }}
	// No Kafka client: deciding the kick would need a commit.
	if err := s.process(nil, []*call{c}); err != nil {
		t.Fatal(err)
	}
	if got == nil || got.Code != protocol.CodeUnavailable {
		t.Fatalf("answer %+v, want unavailable", got)
	}
	if _, still := s.convs["c1"].Members["u2"]; !still {
		t.Fatal("the expired kick was applied")
	}
}
