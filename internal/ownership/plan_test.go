package ownership_test

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"sort"
	"testing"

	"github.com/chatpipe/chatpipe/internal/ownership"
)

// row builds an owner row.
func row(worker string, gen, epoch, modRev int64) ownership.Row {
	return ownership.Row{Owner: ownership.Owner{Worker: worker, Gen: gen, Epoch: epoch}, ModRevision: modRev}
}

func workers(gens map[string]int64) map[string]ownership.WorkerInfo {
	w := make(map[string]ownership.WorkerInfo, len(gens))
	for id, g := range gens {
		w[id] = ownership.WorkerInfo{Addr: id + ":7000", Gen: g}
	}
	return w
}

func cloneView(v ownership.View) ownership.View {
	c := ownership.View{}
	if v.Shards != nil {
		c.Shards = make(map[int]ownership.Row, len(v.Shards))
		for k, r := range v.Shards {
			c.Shards[k] = r
		}
	}
	if v.Workers != nil {
		c.Workers = make(map[string]ownership.WorkerInfo, len(v.Workers))
		for k, w := range v.Workers {
			c.Workers[k] = w
		}
	}
	return c
}

// loads counts the vshards in [0, vshards) with a live owner, per live
// worker (workers owning nothing included).
func loads(v ownership.View, vshards int) map[string]int {
	l := make(map[string]int, len(v.Workers))
	for id := range v.Workers {
		l[id] = 0
	}
	for s := 0; s < vshards; s++ {
		if r, _, ok := v.Live(s); ok {
			l[r.Worker]++
		}
	}
	return l
}

func spread(l map[string]int) (lo, hi int) {
	first := true
	for _, n := range l {
		if first || n < lo {
			lo = n
		}
		if first || n > hi {
			hi = n
		}
		first = false
	}
	return lo, hi
}

// applyMoves applies moves the way the coordinator does, one
// compare-and-swap at a time on the row's ModRevision, checking each move
// against the row it replaces. It returns the resulting view; v is not
// modified.
func applyMoves(t *testing.T, v ownership.View, vshards int, moves []ownership.Move) ownership.View {
	t.Helper()
	out := cloneView(v)
	if out.Shards == nil {
		out.Shards = map[int]ownership.Row{}
	}
	var rev int64 = 1 << 40 // revisions written by this apply; above any in the input
	for i, m := range moves {
		if m.VShard < 0 || m.VShard >= vshards {
			t.Fatalf("move %d: vshard %d out of range [0,%d)", i, m.VShard, vshards)
		}
		w, ok := v.Workers[m.To]
		if !ok {
			t.Fatalf("move %d: %+v goes to %q, not a live worker", i, m, m.To)
		}
		if m.Gen != w.Gen {
			t.Fatalf("move %d: %+v has gen %d, worker %s has gen %d", i, m, m.Gen, m.To, w.Gen)
		}
		cur, exists := out.Shards[m.VShard]
		if m.Epoch != cur.Epoch+1 {
			t.Fatalf("move %d: %+v has epoch %d, the row it replaces has epoch %d (want %d)", i, m, m.Epoch, cur.Epoch, cur.Epoch+1)
		}
		if m.ModRevision != cur.ModRevision {
			t.Fatalf("move %d: %+v would fail its compare-and-swap: row is at revision %d (exists=%v)", i, m, cur.ModRevision, exists)
		}
		if m.From != cur.Worker {
			t.Fatalf("move %d: %+v says From %q, row owner is %q", i, m, m.From, cur.Worker)
		}
		rev++
		out.Shards[m.VShard] = row(m.To, m.Gen, m.Epoch, rev)
	}
	return out
}

// checkPlan runs Plan on v, checks its invariants, and returns the moves and
// the view after applying them.
func checkPlan(t *testing.T, v ownership.View, vshards int) ([]ownership.Move, ownership.View) {
	t.Helper()
	before := cloneView(v)
	moves := ownership.Plan(v, vshards)
	if !reflect.DeepEqual(v, before) {
		t.Fatal("Plan modified its input view")
	}
	if len(v.Workers) == 0 {
		if len(moves) != 0 {
			t.Fatalf("no workers: Plan returned %d moves", len(moves))
		}
		return moves, v
	}
	after := applyMoves(t, v, vshards, moves)
	for s := 0; s < vshards; s++ {
		if _, _, ok := after.Live(s); !ok {
			t.Fatalf("vshard %d has no live owner after the plan (row %+v)", s, after.Shards[s])
		}
	}
	l := loads(after, vshards)
	if lo, hi := spread(l); hi-lo > 1 {
		t.Fatalf("loads after the plan differ by %d: %v", hi-lo, l)
	}
	// A row outside [0, vshards) is never touched.
	for s, r := range v.Shards {
		if (s < 0 || s >= vshards) && after.Shards[s] != r {
			t.Fatalf("row of vshard %d outside [0,%d) changed", s, vshards)
		}
	}
	// No churn: a worker never both gives and receives, and a live owner
	// gives shards only when it holds more than its fair share.
	live := loads(v, vshards)
	floor := vshards / len(v.Workers)
	gives, gets := map[string]bool{}, map[string]bool{}
	for _, m := range moves {
		gets[m.To] = true
		if _, _, ok := v.Live(m.VShard); ok {
			gives[m.From] = true
			if live[m.From] <= floor {
				t.Fatalf("%+v takes a shard from %s which held only %d (fair share %d)", m, m.From, live[m.From], floor)
			}
		}
	}
	for id := range gives {
		if gets[id] {
			t.Fatalf("worker %s both gives and receives shards: %+v", id, moves)
		}
	}
	return moves, after
}

func TestPlanNoWorkers(t *testing.T) {
	for _, v := range []ownership.View{
		{},
		{Shards: map[int]ownership.Row{}, Workers: map[string]ownership.WorkerInfo{}},
		{Shards: map[int]ownership.Row{0: row("w1", 1, 3, 10), 1: row("w2", 1, 1, 11)}},
	} {
		if moves := ownership.Plan(v, 64); len(moves) != 0 {
			t.Errorf("Plan(%+v) = %+v, want no moves", v, moves)
		}
	}
}

func TestPlanNoVShards(t *testing.T) {
	v := ownership.View{Workers: workers(map[string]int64{"w1": 1})}
	if moves := ownership.Plan(v, 0); len(moves) != 0 {
		t.Errorf("Plan with 0 vshards = %+v, want no moves", moves)
	}
}

func TestPlanEmptyRows(t *testing.T) {
	v := ownership.View{Shards: map[int]ownership.Row{}, Workers: workers(map[string]int64{"w1": 5, "w2": 9})}
	moves, after := checkPlan(t, v, 64)
	if len(moves) != 64 {
		t.Fatalf("got %d moves, want 64", len(moves))
	}
	seen := map[int]bool{}
	for _, m := range moves {
		if seen[m.VShard] {
			t.Errorf("vshard %d moved twice", m.VShard)
		}
		seen[m.VShard] = true
		if m.Epoch != 1 || m.ModRevision != 0 || m.From != "" {
			t.Errorf("move %+v: want epoch 1, ModRevision 0, From \"\"", m)
		}
		if m.Gen != v.Workers[m.To].Gen {
			t.Errorf("move %+v: gen %d, want %d", m, m.Gen, v.Workers[m.To].Gen)
		}
	}
	if l := loads(after, 64); l["w1"] != 32 || l["w2"] != 32 {
		t.Errorf("loads = %v, want 32/32", l)
	}

	// nil Shards behaves like an empty map.
	v.Shards = nil
	if moves2, _ := checkPlan(t, v, 64); !reflect.DeepEqual(moves, moves2) {
		t.Error("nil Shards planned differently from empty Shards")
	}
}

// threeWay returns 64 rows spread w1: 0..21, w2: 22..42, w3: 43..63, all gen
// 1, with distinct epochs and revisions.
func threeWay() map[int]ownership.Row {
	rows := map[int]ownership.Row{}
	for s := 0; s < 64; s++ {
		w := "w1"
		switch {
		case s >= 43:
			w = "w3"
		case s >= 22:
			w = "w2"
		}
		rows[s] = row(w, 1, int64(s%5+1), int64(100+s))
	}
	return rows
}

func TestPlanDeadWorker(t *testing.T) {
	tests := []struct {
		name    string
		workers map[string]int64
		newGen  int64 // gen the reassigned shards must get, when all go to one worker
		to      string
	}{
		// w3's lease expired: its key is gone.
		{name: "missing worker", workers: map[string]int64{"w1": 1, "w2": 1}},
		// w3 restarted: it is back with a new gen, so its old rows are dead
		// and it receives them again under its new gen.
		{name: "stale gen", workers: map[string]int64{"w1": 1, "w2": 1, "w3": 2}, newGen: 2, to: "w3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := ownership.View{Shards: threeWay(), Workers: workers(tc.workers)}
			moves, after := checkPlan(t, v, 64)
			if len(moves) != 21 {
				t.Fatalf("got %d moves, want the 21 shards of w3: %+v", len(moves), moves)
			}
			for _, m := range moves {
				old := v.Shards[m.VShard]
				if old.Worker != "w3" || m.From != "w3" {
					t.Errorf("move %+v: only w3's shards should move (row %+v)", m, old)
				}
				if m.Epoch != old.Epoch+1 {
					t.Errorf("move %+v: epoch %d, want %d", m, m.Epoch, old.Epoch+1)
				}
				if m.ModRevision != old.ModRevision {
					t.Errorf("move %+v: ModRevision %d, want %d", m, m.ModRevision, old.ModRevision)
				}
				if tc.to != "" && (m.To != tc.to || m.Gen != tc.newGen) {
					t.Errorf("move %+v: want to %s gen %d", m, tc.to, tc.newGen)
				}
			}
			if tc.to == "" {
				if l := loads(after, 64); l["w1"] != 32 || l["w2"] != 32 {
					t.Errorf("loads = %v, want 32/32", l)
				}
			}
		})
	}
}

func TestPlanMixedDeadAndMissingRows(t *testing.T) {
	rows := map[int]ownership.Row{}
	for s := 0; s < 40; s++ {
		switch s % 4 {
		case 0:
			rows[s] = row("w1", 3, 2, int64(10+s))
		case 1:
			rows[s] = row("gone", 1, 7, int64(10+s)) // not a worker
		case 2:
			rows[s] = row("w2", 1, 4, int64(10+s)) // w2 is now gen 2
		}
		// s%4 == 3: no row (nor for vshards 40..47)
	}
	rows[70] = row("gone", 1, 1, 5) // outside [0, vshards): ignored
	v := ownership.View{Shards: rows, Workers: workers(map[string]int64{"w1": 3, "w2": 2, "w3": 1})}
	moves, _ := checkPlan(t, v, 48)
	for _, m := range moves {
		old, ok := v.Shards[m.VShard]
		if !ok && (m.Epoch != 1 || m.ModRevision != 0 || m.From != "") {
			t.Errorf("move %+v of a vshard without a row: want epoch 1, revision 0, no From", m)
		}
		if ok && (m.Epoch != old.Epoch+1 || m.ModRevision != old.ModRevision || m.From != old.Worker) {
			t.Errorf("move %+v does not replace row %+v", m, old)
		}
	}
}

func TestPlanJoiningWorker(t *testing.T) {
	t.Run("second worker", func(t *testing.T) {
		rows := map[int]ownership.Row{}
		for s := 0; s < 64; s++ {
			rows[s] = row("w1", 4, int64(s+1), int64(1000+s))
		}
		v := ownership.View{Shards: rows, Workers: workers(map[string]int64{"w1": 4, "w2": 8})}
		moves, after := checkPlan(t, v, 64)
		if len(moves) != 32 {
			t.Fatalf("got %d moves, want 32", len(moves))
		}
		for _, m := range moves {
			old := rows[m.VShard]
			if m.From != "w1" || m.To != "w2" || m.Gen != 8 || m.Epoch != old.Epoch+1 || m.ModRevision != old.ModRevision {
				t.Errorf("move %+v: want w1 -> w2 gen 8, epoch %d, revision %d", m, old.Epoch+1, old.ModRevision)
			}
		}
		if l := loads(after, 64); l["w1"] != 32 || l["w2"] != 32 {
			t.Errorf("loads = %v, want 32/32", l)
		}
	})
	t.Run("third worker", func(t *testing.T) {
		rows := map[int]ownership.Row{}
		for s := 0; s < 64; s++ {
			rows[s] = row(fmt.Sprintf("w%d", s%2+1), 1, 2, int64(50+s))
		}
		v := ownership.View{Shards: rows, Workers: workers(map[string]int64{"w1": 1, "w2": 1, "w3": 6})}
		moves, after := checkPlan(t, v, 64)
		// 32/32/0 -> 22/21/21 or 21/22/21: 21 moves, all to w3.
		if len(moves) != 21 {
			t.Fatalf("got %d moves, want 21", len(moves))
		}
		for _, m := range moves {
			if m.To != "w3" || m.Gen != 6 || m.Epoch != 3 {
				t.Errorf("move %+v: want to w3 gen 6 epoch 3", m)
			}
		}
		if l := loads(after, 64); l["w3"] != 21 {
			t.Errorf("loads = %v, want w3 at 21", l)
		}
	})
	t.Run("uneven", func(t *testing.T) {
		// 5 shards, w1 has all, two workers join: 5/0/0 -> 2/2/1 in 3 moves.
		rows := map[int]ownership.Row{}
		for s := 0; s < 5; s++ {
			rows[s] = row("w1", 1, 1, int64(s+1))
		}
		v := ownership.View{Shards: rows, Workers: workers(map[string]int64{"w1": 1, "w2": 1, "w3": 1})}
		moves, _ := checkPlan(t, v, 5)
		if len(moves) != 3 {
			t.Fatalf("got %d moves, want 3: %+v", len(moves), moves)
		}
	})
}

func TestPlanBalanced(t *testing.T) {
	tests := []struct {
		name    string
		rows    map[int]ownership.Row
		workers map[string]int64
		vshards int
	}{
		{name: "three way 22/21/21", rows: threeWay(), workers: map[string]int64{"w1": 1, "w2": 1, "w3": 1}, vshards: 64},
		{name: "off by one", rows: map[int]ownership.Row{0: row("a", 1, 1, 1), 1: row("a", 1, 1, 2), 2: row("b", 1, 1, 3)}, workers: map[string]int64{"a": 1, "b": 1}, vshards: 3},
		{name: "more workers than shards", rows: map[int]ownership.Row{0: row("a", 1, 1, 1), 1: row("c", 1, 1, 2)}, workers: map[string]int64{"a": 1, "b": 1, "c": 1}, vshards: 2},
		{name: "single worker", rows: map[int]ownership.Row{0: row("a", 2, 9, 1), 1: row("a", 2, 1, 2)}, workers: map[string]int64{"a": 2}, vshards: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := ownership.View{Shards: tc.rows, Workers: workers(tc.workers)}
			if moves := ownership.Plan(v, tc.vshards); len(moves) != 0 {
				t.Errorf("balanced view: Plan = %+v, want no moves", moves)
			}
		})
	}
}

func TestPlanDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for i := 0; i < 50; i++ {
		v, vshards := randomView(rng)
		first := ownership.Plan(v, vshards)
		for j := 0; j < 5; j++ {
			// A copy has maps built in another order; map iteration order
			// varies between runs too.
			if again := ownership.Plan(cloneView(v), vshards); !reflect.DeepEqual(first, again) {
				t.Fatalf("view %d: Plan is not deterministic:\n%+v\n%+v", i, first, again)
			}
		}
	}
}

// randomView builds a view with some live workers, rows owned by live
// workers, by workers that are gone, by earlier gens of live workers, rows
// outside the vshard range, and vshards without a row.
func randomView(rng *rand.Rand) (ownership.View, int) {
	vshards := rng.IntN(130)
	nw := rng.IntN(8)
	w := map[string]ownership.WorkerInfo{}
	var ids []string
	for i := 0; i < nw; i++ {
		id := fmt.Sprintf("w%02d", rng.IntN(20))
		w[id] = ownership.WorkerInfo{Addr: id + ":1", Gen: rng.Int64N(4) + 1}
		ids = append(ids, id)
	}
	sort.Strings(ids)
	owners := append(append([]string{}, ids...), "dead1", "dead2")
	rows := map[int]ownership.Row{}
	var rev int64
	for s := -2; s < vshards+3; s++ {
		if rng.IntN(5) == 0 {
			continue // no row
		}
		o := owners[rng.IntN(len(owners))]
		gen := w[o].Gen
		switch {
		case gen == 0:
			gen = rng.Int64N(3) + 1 // a dead worker's gen
		case rng.IntN(6) == 0:
			gen-- // an earlier gen of a live worker
		}
		// Skew: give the first live worker extra shards now and then.
		if len(ids) > 0 && rng.IntN(3) == 0 {
			o, gen = ids[0], w[ids[0]].Gen
		}
		rev += rng.Int64N(5) + 1
		rows[s] = row(o, gen, rng.Int64N(50), rev)
	}
	return ownership.View{Shards: rows, Workers: w}, vshards
}

func TestPlanRandomViews(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed*0x9e3779b97f4a7c15))
		for i := 0; i < 200; i++ {
			v, vshards := randomView(rng)
			name := fmt.Sprintf("seed%d/%d", seed, i)
			ok := t.Run(name, func(t *testing.T) {
				_, after := checkPlan(t, v, vshards)
				if len(v.Workers) == 0 {
					return
				}
				// Planning again on the result moves nothing.
				if again := ownership.Plan(after, vshards); len(again) != 0 {
					t.Fatalf("second plan on the applied view moves %d shards: %+v", len(again), again)
				}
			})
			if !ok {
				t.Logf("%s failed on view %+v (vshards %d)", name, v, vshards)
				return
			}
		}
	}
}
