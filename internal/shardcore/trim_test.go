package shardcore

import (
	"fmt"
	"math/rand"
	"runtime"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/logrecord"
)

func msg(seq int64, cmid string, at time.Time) *logrecord.Event {
	return &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: "c", Seq: seq, MessageID: "m" + cmid, Sender: "a", ClientMessageID: cmid, CreatedAt: at}
}

func TestTrimDedupeBounds(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := NewConv()
	for i := int64(1); i <= 100; i++ {
		Apply(c, msg(i, fmt.Sprint("k", i), t0.Add(time.Duration(i)*time.Second)))
	}
	// Nothing is stored yet: nothing may go, however old or many.
	if n := TrimDedupe(c, 0, 10, t0.Add(time.Hour)); n != 0 || len(c.Dedupe) != 100 {
		t.Fatalf("trimmed %d entries above the stored seq; %d left", n, len(c.Dedupe))
	}
	// Stored up to 50: the size bound drops the oldest stored ones only.
	if n := TrimDedupe(c, 50, 10, t0); n != 50 || len(c.Dedupe) != 50 {
		t.Fatalf("keep 10 with 50 stored: dropped %d, %d left", n, len(c.Dedupe))
	}
	if _, ok := c.Dedupe["k51"]; !ok {
		t.Fatal("an entry above the stored seq was dropped")
	}
	// All stored, within the size bound: the age bound drops those older
	// than the cutoff (created at t0+80s and before).
	if n := TrimDedupe(c, 100, 1000, t0.Add(81*time.Second)); n != 30 || len(c.Dedupe) != 20 {
		t.Fatalf("age bound: dropped %d, %d left", n, len(c.Dedupe))
	}
	if _, ok := c.Dedupe["k81"]; !ok {
		t.Fatal("an entry newer than the cutoff was dropped")
	}
	// The queue is compacted: its length follows the map's.
	if live := len(c.order) - c.head; live != len(c.Dedupe) {
		t.Fatalf("order holds %d live keys, Dedupe %d", live, len(c.Dedupe))
	}
}

// TestTrimDedupeKeepsAnswers: with the durable state holding every event up
// to a growing stored seq, trimming at random points never changes what a
// retry is answered: the driver's lookup (NeedsDedupeLookup, then Remember
// from durable state) finds every dropped entry again. With a filter of
// known keys (loaded empty, as for a new conversation) the same holds, and
// most first sends are answered without a lookup.
func TestTrimDedupeKeepsAnswers(t *testing.T) {
	for _, known := range []bool{false, true} {
		t.Run(fmt.Sprint("known=", known), func(t *testing.T) {
			lookups, firsts := trimAndRetry(t, known)
			t.Logf("%d lookups of keys never used, for %d first sends", lookups, firsts)
			if known && lookups > firsts/10 {
				t.Errorf("with a filter of known keys: %d lookups of keys never used, for %d first sends; want at most a tenth", lookups, firsts)
			}
		})
	}
}

// trimAndRetry is TestTrimDedupeKeepsAnswers's run: it returns how many
// lookups it made of keys never used before and how many sends were first
// of their key.
func trimAndRetry(t *testing.T, known bool) (lookups, firsts int) {
	rng := rand.New(rand.NewSource(7))
	c := NewConv()
	if known {
		KnowKeys(c, nil)
	}
	step(t, c, Command{Op: "create", ConversationID: "c", Sender: "a", Members: []string{"b"}})
	durable := map[string]First{} // what Postgres holds
	var log []*logrecord.Event
	first := map[string]int64{} // cmid → seq of its first accepted send
	stored := int64(0)
	now := time.Unix(0, 0)
	for i := 0; i < 20000; i++ {
		now = now.Add(time.Duration(rng.Intn(50)) * time.Millisecond)
		cmid := fmt.Sprint("m", rng.Intn(3000))
		sender := []string{"a", "b"}[rng.Intn(2)]
		cmd := Command{Op: "send", ConversationID: "c", Sender: sender, ClientMessageID: cmid, Body: "x"}
		if NeedsDedupeLookup(c, &cmd) {
			if _, used := first[cmid]; !used {
				lookups++
			}
			if f, ok := durable[cmid]; ok {
				Remember(c, cmid, f)
			}
		}
		d := Decide(c, &cmd, Stamp{Now: now, MessageID: fmt.Sprint("id", i)}, Limits{MaxMembers: 3})
		switch {
		case d.Event != nil:
			if _, seen := first[cmid]; seen {
				t.Fatalf("step %d: %s accepted twice", i, cmid)
			}
			firsts++
			first[cmid] = d.Event.Seq
			Apply(c, d.Event)
			log = append(log, d.Event)
		case d.Reject == nil:
			if d.Seq != first[cmid] {
				t.Fatalf("step %d: retry of %s answered seq %d, first was %d", i, cmid, d.Seq, first[cmid])
			}
		}
		// persist catches up a little, at random
		for rng.Intn(3) == 0 && int(stored) < len(log) {
			e := log[stored]
			durable[e.ClientMessageID] = First{Seq: e.Seq, MessageID: e.MessageID, Sender: e.Sender, At: e.CreatedAt}
			stored++
		}
		storedSeq := int64(1) // the create
		if stored > 0 {
			storedSeq = log[stored-1].Seq
		}
		TrimDedupe(c, storedSeq, rng.Intn(20), now.Add(-time.Duration(rng.Intn(2000))*time.Millisecond))
		for k, f := range c.Dedupe {
			if _, ok := durable[k]; !ok && f.Seq <= storedSeq {
				t.Fatalf("entry %s at seq %d is below the stored seq but not durable", k, f.Seq)
			}
		}
	}
	return lookups, firsts
}

// BenchmarkDedupeMemory reports the heap one dedupe result costs (typical
// ids: a 20-byte client_message_id, a ULID, a short user id), the figure
// docs/operations.md sizes the dedupe bounds with.
func BenchmarkDedupeMemory(b *testing.B) {
	const n = 100000
	now := time.Unix(0, 0)
	var before, after runtime.MemStats
	for i := 0; i < b.N; i++ {
		runtime.GC()
		runtime.ReadMemStats(&before)
		c := NewConv()
		for j := 0; j < n; j++ {
			cmid := fmt.Sprintf("m-%018d", j)
			Apply(c, &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: "c", Seq: int64(j + 1),
				MessageID: fmt.Sprintf("01K%023d", j), Sender: fmt.Sprintf("user-%d", j%100), ClientMessageID: cmid, CreatedAt: now})
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/entry")
		runtime.KeepAlive(c)
	}
}
