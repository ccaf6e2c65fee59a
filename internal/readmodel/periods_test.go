package readmodel

import (
	"math"
	"reflect"
	"testing"
)

func ptr(v int64) *int64 { return &v }

func TestPeriodCoversRemovalSeq(t *testing.T) {
	p := NewPeriod("c", "u", 3, ptr(9))
	for seq, want := range map[int64]bool{2: false, 3: true, 9: true, 10: false} {
		if got := p.Covers(seq); got != want {
			t.Errorf("Covers(%d) = %v", seq, got)
		}
	}
	if open := NewPeriod("c", "u", 3, nil); open.To != math.MaxInt64 || !open.Covers(1<<40) {
		t.Errorf("an open period: %+v", open)
	}
}

func TestVisible(t *testing.T) {
	cases := []struct {
		p            Period
		cursor, last int64
		want         Range
		ok           bool
	}{
		{NewPeriod("c", "u", 1, nil), 0, 10, Range{"c", 1, 10}, true},
		{NewPeriod("c", "u", 5, nil), 2, 10, Range{"c", 5, 10}, true},   // nothing from before the join
		{NewPeriod("c", "u", 5, nil), 7, 10, Range{"c", 8, 10}, true},   // after the cursor
		{NewPeriod("c", "u", 5, ptr(8)), 0, 10, Range{"c", 5, 8}, true}, // up to the removal, inclusive
		{NewPeriod("c", "u", 5, ptr(8)), 8, 10, Range{}, false},         // seen it all
		{NewPeriod("c", "u", 5, nil), 0, 4, Range{}, false},             // not projected yet
	}
	for _, c := range cases {
		got, ok := Visible(c.p, c.cursor, c.last)
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("Visible(%+v, %d, %d) = %+v %v, want %+v %v", c.p, c.cursor, c.last, got, ok, c.want, c.ok)
		}
	}
}

func TestCovering(t *testing.T) {
	periods := []Period{
		NewPeriod("c", "alice", 1, nil),
		NewPeriod("c", "bob", 1, ptr(3)), // kicked at 3
		NewPeriod("c", "bob", 6, nil),    // added back at 6
		NewPeriod("c", "carol", 4, nil),
	}
	for seq, want := range map[int64][]string{
		1: {"alice", "bob"},
		3: {"alice", "bob"}, // the kick itself is still bob's
		4: {"alice", "carol"},
		6: {"alice", "bob", "carol"},
	} {
		if got := Covering(periods, seq); !reflect.DeepEqual(got, want) {
			t.Errorf("Covering(%d) = %v, want %v", seq, got, want)
		}
	}
}
