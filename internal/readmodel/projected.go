package readmodel

import (
	"cmp"
	"slices"
	"sync"
)

// MaxProjected is how many conversations a Projected remembers; past it, it
// forgets them all and starts again (a forgotten conversation's floor is
// 0, which is always true). With more conversations active than that, its
// batches are checked as they were without it.
const MaxProjected = 100_000

// Projected keeps, per conversation, a floor of the last_seq the read model
// holds: the highest seq a committed batch of this read model projected
// for it. The projected last_seq only rises (conversations.last_seq is
// kept with GREATEST) and a batch raises it to at least its highest seq, so
// the floor stays at or below it whatever else writes the read model:
// another persist member, a dead letter's salvage, a rebuild's pass. It
// assumes the database does not go back in time under a running persist
// (a restore or a failover to a standby that lost commits): restart
// persist after one, as its offsets have gone back too.
//
// The floor lets a batch leave out of the gap check (the projection's
// gapSQL) every conversation whose seqs cannot leave a hole, which in
// steady state is all of them.
type Projected struct {
	mu   sync.Mutex
	last map[string]int64
}

// Unsure returns the rows of convs and seqs (a Plan's SeqConvs and Seqs)
// that belong to conversations whose seqs may leave a hole below their
// highest: those whose distinct seqs above the floor f are not exactly
// f+1 … their highest. For any other, whatever last_seq ≥ f Postgres
// holds, the batch's seqs above it run without a hole up to the highest,
// which is what gapSQL checks; they need no check.
func (p *Projected) Unsure(convs []string, seqs []int64) ([]string, []int64) {
	if len(seqs) == 0 {
		return nil, nil
	}
	order := make([]int, len(seqs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		if c := cmp.Compare(convs[a], convs[b]); c != 0 {
			return c
		}
		return cmp.Compare(seqs[a], seqs[b])
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	var uc []string
	var us []int64
	for start := 0; start < len(order); {
		conv := convs[order[start]]
		end := start
		for end < len(order) && convs[order[end]] == conv {
			end++
		}
		floor := p.last[conv]
		want, sure := floor+1, true // the next seq a run without a hole holds
		for _, i := range order[start:end] {
			switch s := seqs[i]; {
			case s < want: // at or below the floor, or seen already
			case s == want:
				want++
			default:
				sure = false
			}
		}
		if !sure {
			for _, i := range order[start:end] {
				uc, us = append(uc, conv), append(us, seqs[i])
			}
		}
		start = end
	}
	return uc, us
}

// Commit raises the floors to the seqs of a committed batch (a Plan's
// SeqConvs and Seqs).
func (p *Projected) Commit(convs []string, seqs []int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last == nil || len(p.last) >= MaxProjected {
		p.last = make(map[string]int64)
	}
	for i, c := range convs {
		if seqs[i] > p.last[c] {
			p.last[c] = seqs[i]
		}
	}
}
