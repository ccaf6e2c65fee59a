package shardworker

import (
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/logrecord"
)

// TestWorkerHot: Worker.Hot merges its writers' counts, busiest first,
// leaving out takeover markers, and bounds the answer by n.
func TestWorkerHot(t *testing.T) {
	w := &Worker{shards: map[int]*shard{}}
	if got := w.Hot(5); got != nil {
		t.Fatalf("no writers: %+v", got)
	}
	now := time.Now()
	batch := func(conv string, n int) []*logrecord.Event {
		evs := []*logrecord.Event{{Kind: logrecord.KindTakeover}}
		for i := 0; i < n; i++ {
			evs = append(evs, &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: conv, Seq: int64(i + 1)})
		}
		return evs
	}
	a, b := &shard{v: 3}, &shard{v: 65}
	w.shards[3], w.shards[65] = a, b
	a.hot.count(now, batch("quiet", 2))
	a.hot.count(now, batch("warm", 20))
	b.hot.count(now, batch("hot", 50))
	got := w.Hot(2)
	if len(got) != 2 || got[0].Conversation != "hot" || got[0].VShard != 65 || got[1].Conversation != "warm" || got[1].VShard != 3 {
		t.Fatalf("Hot(2) = %+v, want hot@65 then warm@3", got)
	}
	if got[0].PerSecond <= got[1].PerSecond || got[1].PerSecond <= 0 {
		t.Errorf("rates out of order: %+v", got)
	}
	all := w.Hot(10)
	if len(all) != 3 {
		t.Errorf("Hot(10) = %+v, want 3 (markers not counted)", all)
	}
	if w.Hot(0) != nil {
		t.Error("Hot(0) returned entries")
	}
}

// TestWorkerHotWhileCommitting: Hot reads while a writer counts (run with
// -race).
func TestWorkerHotWhileCommitting(t *testing.T) {
	s := &shard{v: 1}
	w := &Worker{shards: map[int]*shard{1: s}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		evs := []*logrecord.Event{{Kind: logrecord.KindMessage, ConversationID: "a"}, {Kind: logrecord.KindMessage, ConversationID: "b"}}
		for i := 0; i < 2000; i++ {
			s.hot.count(time.Now(), evs)
		}
	}()
	for {
		select {
		case <-done:
			if got := w.Hot(5); len(got) != 2 {
				t.Fatalf("Hot = %+v, want a and b", got)
			}
			return
		default:
			_ = w.Hot(5)
		}
	}
}
