package shardworker

import (
	"sort"
	"sync"
	"time"

	"github.com/chatpipe/chatpipe/internal/hotconv"
	"github.com/chatpipe/chatpipe/logrecord"
)

// HotConversation is one of the busiest conversations a worker's writers
// committed lately: its estimated committed events per second in VShard.
type HotConversation struct {
	Conversation string  `json:"conversation"`
	VShard       int     `json:"vshard"`
	PerSecond    float64 `json:"per_second"`
}

// hotCounter counts a shard's committed events per conversation in bounded
// memory (hotconv). The shard's loop adds, once per transaction; Worker.Hot
// reads; the mutex is held for one batch's adds or one read. The zero value
// is ready to use.
type hotCounter struct {
	mu sync.Mutex
	c  *hotconv.Counter
}

// count adds the conversation events of a committed transaction (not
// takeover markers).
func (h *hotCounter) count(now time.Time, evs []*logrecord.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.c == nil {
		h.c = hotconv.New(hotconv.DefaultK, hotconv.DefaultWindow)
	}
	for _, ev := range evs {
		if ev.HasSeq() && ev.ConversationID != "" {
			h.c.Add(now, ev.ConversationID)
		}
	}
}

// top is the counter's n busiest conversations at now.
func (h *hotCounter) top(now time.Time, n int) []hotconv.Entry {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.c == nil {
		return nil
	}
	return h.c.Top(now, n)
}

// Hot returns up to n of the busiest conversations the writers running
// here committed over the last 10 to 20 s, busiest first. Each writer
// keeps its own bounded estimate (at most 64 conversations, however many
// it writes), started afresh when it takes its vshard over; a conversation
// moved between vshards lately may appear once for each.
func (w *Worker) Hot(n int) []HotConversation {
	if n <= 0 {
		return nil
	}
	w.mu.Lock()
	shards := make([]*shard, 0, len(w.shards))
	for _, s := range w.shards {
		shards = append(shards, s)
	}
	w.mu.Unlock()
	now := time.Now()
	var out []HotConversation
	for _, s := range shards {
		for _, e := range s.hot.top(now, n) {
			out = append(out, HotConversation{Conversation: e.Key, VShard: s.v, PerSecond: e.PerSecond})
		}
	}
	SortHot(out)
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// SortHot orders hs busiest first (ties by conversation, then vshard).
func SortHot(hs []HotConversation) {
	sort.Slice(hs, func(i, j int) bool {
		a, b := hs[i], hs[j]
		if a.PerSecond != b.PerSecond {
			return a.PerSecond > b.PerSecond
		}
		if a.Conversation != b.Conversation {
			return a.Conversation < b.Conversation
		}
		return a.VShard < b.VShard
	})
}
