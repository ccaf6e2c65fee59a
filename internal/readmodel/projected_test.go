package readmodel

import (
	"fmt"
	"testing"
)

// gapped is gapSQL's test for one conversation: with last_seq lo stored,
// the batch's seqs above lo leave a hole below their highest.
func gapped(lo int64, seqs []int64) bool {
	var hi int64
	above := map[int64]bool{}
	for _, s := range seqs {
		hi = max(hi, s)
		if s > lo {
			above[s] = true
		}
	}
	return hi > lo && int64(len(above)) < hi-lo
}

// TestProjectedLeavesOutOnlyWhatCannotGap: for every floor, every last_seq
// at or above it and every batch of seqs 1–5 (each absent, once or twice),
// a conversation Unsure leaves out is one gapSQL finds no hole in.
func TestProjectedLeavesOutOnlyWhatCannotGap(t *testing.T) {
	for floor := int64(0); floor <= 4; floor++ {
		for code := 1; code < 243; code++ { // base 3: how often each of seqs 1..5 appears
			var seqs []int64
			for s, c := int64(1), code; s <= 5; s, c = s+1, c/3 {
				for range c % 3 {
					seqs = append(seqs, s)
				}
			}
			var p Projected
			p.Commit([]string{"c", "other"}, []int64{floor, 3})
			// c's seqs in reverse, between those of a conversation with
			// no hole (other: 4, 5), as a batch of two partitions may be.
			convs, batch := []string{"other"}, []int64{4}
			for i := len(seqs) - 1; i >= 0; i-- {
				convs, batch = append(convs, "c"), append(batch, seqs[i])
			}
			convs, batch = append(convs, "other"), append(batch, 5)
			uc, us := p.Unsure(convs, batch)
			for _, c := range uc {
				if c != "c" {
					t.Fatalf("floor %d, seqs %v: %s is unsure, want only c", floor, seqs, c)
				}
			}
			if len(uc) != 0 && len(us) != len(seqs) {
				t.Fatalf("floor %d, seqs %v: unsure rows %v, want none or all of c's", floor, seqs, us)
			}
			if len(uc) != 0 {
				continue
			}
			for lo := floor; lo <= 6; lo++ {
				if gapped(lo, seqs) {
					t.Errorf("floor %d, seqs %v left out of the check, but last_seq %d leaves a hole", floor, seqs, lo)
				}
			}
		}
	}
}

func TestProjectedInSteadyState(t *testing.T) {
	var p Projected
	// New conversations from seq 1 need no check; one whose first seq
	// this process sees is 3 does.
	uc, us := p.Unsure([]string{"a", "b", "a", "b"}, []int64{1, 3, 2, 4})
	if fmt.Sprint(uc, us) != "[b b] [3 4]" {
		t.Fatalf("first batch: unsure %v %v, want [b b] [3 4]", uc, us)
	}
	p.Commit([]string{"a", "b", "a", "b"}, []int64{1, 3, 2, 4})
	// The next seqs of both follow their floors: nothing to check.
	if uc, _ := p.Unsure([]string{"b", "a", "a"}, []int64{5, 3, 4}); len(uc) != 0 {
		t.Fatalf("contiguous batch: unsure %v, want none", uc)
	}
	// A seq missing after the floor (a record dead-lettered whole): check.
	if uc, us := p.Unsure([]string{"a"}, []int64{4}); fmt.Sprint(uc, us) != "[a] [4]" {
		t.Fatalf("after a missing seq: unsure %v %v, want [a] [4]", uc, us)
	}
	// A replay at or below the floor, then the next seq: nothing.
	if uc, _ := p.Unsure([]string{"a", "a", "a"}, []int64{1, 2, 3}); len(uc) != 0 {
		t.Fatalf("replay: unsure %v, want none", uc)
	}
}

func TestProjectedForgetsPastItsBound(t *testing.T) {
	var p Projected
	convs, seqs := make([]string, MaxProjected), make([]int64, MaxProjected)
	for i := range convs {
		convs[i], seqs[i] = fmt.Sprint("c", i), 5
	}
	p.Commit(convs, seqs)
	p.Commit([]string{"new"}, []int64{5})
	if n := len(p.last); n != 1 {
		t.Fatalf("remembers %d conversations after passing %d, want 1", n, MaxProjected)
	}
	// c0 is forgotten: its floor is 0 again, and seq 6 may follow a hole.
	if uc, _ := p.Unsure([]string{"c0"}, []int64{6}); len(uc) != 1 {
		t.Fatalf("forgotten conversation left out of the check")
	}
}
