package shardcore

import (
	"fmt"
	"testing"
	"time"
)

// TestKeyFilterHasNoFalseNegatives: a filter made for 10 keys that takes
// 200,000 answers "maybe" for every one of them as it grows layer by
// layer, and "maybe" for under 3% of keys it was never given.
func TestKeyFilterHasNoFalseNegatives(t *testing.T) {
	f := NewKeyFilter([]string{"a", "b"})
	const n = 200000
	for i := range n {
		f.Add(fmt.Sprint("k", i))
		if i%997 == 0 && !f.MayHold(fmt.Sprint("k", i/2)) {
			t.Fatalf("after %d keys, k%d is not held", i+1, i/2)
		}
	}
	for _, k := range []string{"a", "b"} {
		if !f.MayHold(k) {
			t.Fatalf("%s, given at the start, is not held", k)
		}
	}
	for i := range n {
		if !f.MayHold(fmt.Sprint("k", i)) {
			t.Fatalf("k%d is not held", i)
		}
	}
	maybe := 0
	for i := range n {
		if f.MayHold(fmt.Sprint("x", i)) {
			maybe++
		}
	}
	t.Logf("%d layers, %d bytes for %d keys; %d of %d new keys maybe held", len(f.layers), f.Bytes(), f.Len(), maybe, n)
	if rate := float64(maybe) / n; rate > 3*keyFilterFP {
		t.Errorf("%.2f%% of new keys maybe held, want under %.0f%%", rate*100, 3*keyFilterFP*100)
	}
}

// TestTrimmedKeyIsLookedUpAgain: a result TrimDedupe drops from a
// conversation that has a filter of known keys is looked up again, and a
// key it never saw is not.
func TestTrimmedKeyIsLookedUpAgain(t *testing.T) {
	c := NewConv()
	KnowKeys(c, []string{"old"})
	Remember(c, "k1", First{Seq: 2})
	send := func(k string) *Command {
		return &Command{Op: "send", ConversationID: "c", Sender: "a", ClientMessageID: k}
	}
	if NeedsDedupeLookup(c, send("k1")) {
		t.Error("k1, in the dedupe map, is looked up")
	}
	if !NeedsDedupeLookup(c, send("old")) {
		t.Error("old, a stored key of the load, is not looked up")
	}
	if NeedsDedupeLookup(c, send("new")) {
		t.Error("new, a key the conversation never had, is looked up")
	}
	if n := TrimDedupe(c, 2, 0, time.Time{}.Add(time.Hour)); n != 1 {
		t.Fatalf("trimmed %d results, want 1", n)
	}
	if !NeedsDedupeLookup(c, send("k1")) {
		t.Error("k1, trimmed, is not looked up: its retry would be written again")
	}
}
