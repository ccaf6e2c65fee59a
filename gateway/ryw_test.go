package gateway

import (
	"fmt"
	"testing"
	"time"
)

func TestPendingWrites(t *testing.T) {
	var p pendingWrites
	now := time.Now()
	p.note("a", 3, now)
	p.note("a", 2, now) // lower: kept at 3
	p.note("b", 1, now)
	if w := p.wanted("a"); w["a"] != 3 || len(w) != 1 {
		t.Fatalf("wanted(a) = %v", w)
	}
	if w := p.wanted(""); len(w) != 2 {
		t.Fatalf("wanted() = %v", w)
	}
	p.covered(map[string]int64{"a": 2, "b": 5})
	if w := p.wanted(""); len(w) != 1 || w["a"] != 3 {
		t.Fatalf("after covered(a:2, b:5): %v", w)
	}
	p.covered(map[string]int64{"a": 3})
	if w := p.wanted(""); len(w) != 0 {
		t.Fatalf("after covered(a:3): %v", w)
	}
	full := false
	for i := range maxPendingWrites + 10 {
		full = p.note(fmt.Sprintf("c%d", i), 1, now.Add(time.Duration(i)))
	}
	if !full {
		t.Fatal("note past the bound did not say full")
	}
	p.trim()
	w := p.wanted("")
	if len(w) != maxPendingWrites {
		t.Fatalf("after trim: %d pending, want %d", len(w), maxPendingWrites)
	}
	if _, ok := w["c0"]; ok {
		t.Fatal("trim kept the oldest write")
	}
}
