package ownership

import "sort"

// Move is one ownership change: vshard VShard goes to worker To (gen Gen)
// with epoch Epoch, replacing the row at ModRevision (0: no row yet).
type Move struct {
	VShard      int
	From        string
	To          string
	Gen         int64
	Epoch       int64
	ModRevision int64
}

// Plan decides which vshards change owner: every vshard without a live owner
// goes to the least-loaded live worker, then shards move one at a time from
// the most- to the least-loaded worker until loads differ by at most one.
// It is pure and deterministic.
func Plan(v View, vshards int) []Move {
	if len(v.Workers) == 0 {
		return nil
	}
	ids := make([]string, 0, len(v.Workers))
	for id := range v.Workers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	owned := map[string][]int{}
	var orphans []int
	for s := 0; s < vshards; s++ {
		if row, _, ok := v.Live(s); ok {
			owned[row.Worker] = append(owned[row.Worker], s)
		} else {
			orphans = append(orphans, s)
		}
	}
	least := func() string {
		best := ids[0]
		for _, id := range ids[1:] {
			if len(owned[id]) < len(owned[best]) {
				best = id
			}
		}
		return best
	}
	most := func() string {
		best := ids[0]
		for _, id := range ids[1:] {
			if len(owned[id]) > len(owned[best]) {
				best = id
			}
		}
		return best
	}
	var moves []Move
	move := func(s int, to string) {
		row := v.Shards[s]
		moves = append(moves, Move{VShard: s, From: row.Worker, To: to, Gen: v.Workers[to].Gen, Epoch: row.Epoch + 1, ModRevision: row.ModRevision})
		owned[to] = append(owned[to], s)
	}
	for _, s := range orphans {
		move(s, least())
	}
	for {
		hi, lo := most(), least()
		if len(owned[hi])-len(owned[lo]) <= 1 {
			break
		}
		// move the highest vshard that was not just handed off by hand
		i := len(owned[hi]) - 1
		for i >= 0 && v.Pinned[owned[hi][i]] {
			i--
		}
		if i < 0 {
			break
		}
		s := owned[hi][i]
		owned[hi] = append(owned[hi][:i:i], owned[hi][i+1:]...)
		move(s, lo)
	}
	return moves
}
