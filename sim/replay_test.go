package sim

import (
	"os"
	"reflect"
	"strconv"
	"testing"
)

// TestReplay replays one seeded schedule with its full trace:
//
//	CHATPIPE_SIM_SEED=17 [CHATPIPE_SIM_BUG=AcceptBeforeMarker] go test ./sim/ -run TestReplay -v
//
// It fails when a property is broken, so it reproduces what the seed found.
// A failure of TestProperties is replayed with -rapid.seed instead.
func TestReplay(t *testing.T) {
	v := os.Getenv("CHATPIPE_SIM_SEED")
	if v == "" {
		t.Skip("set CHATPIPE_SIM_SEED (and CHATPIPE_SIM_BUG) to replay a seeded schedule")
	}
	seed, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("CHATPIPE_SIM_SEED=%q: %v", v, err)
	}
	cfg := bugConfig(t, os.Getenv("CHATPIPE_SIM_BUG"))
	r := Run(cfg, NewSeededChooser(seed))
	t.Logf("seed %d, bugs %+v:\n%s", seed, cfg.Bugs, r.Report(len(r.Trace)))
	if r.Failed() {
		t.Fail()
	}
}

// TestDeterministic: a schedule is a pure function of its config and
// choices (nothing in the world or the writer iterates a map in its
// random order where the order matters, e.g. the writer's eviction), and
// keeping its trace changes nothing else (RunSeed replays a failing
// untraced run with its trace).
func TestDeterministic(t *testing.T) {
	for seed := uint64(1); seed <= 100; seed++ {
		a := Run(ScheduleConfig(seed), NewSeededChooser(seed))
		b := Run(ScheduleConfig(seed), NewSeededChooser(seed))
		if !reflect.DeepEqual(a.Trace, b.Trace) || a.Stats != b.Stats || !reflect.DeepEqual(a.Violations, b.Violations) {
			t.Fatalf("seed %d ran differently twice", seed)
		}
		quiet := ScheduleConfig(seed)
		quiet.Untraced = true
		c := Run(quiet, NewSeededChooser(seed))
		if len(c.Trace) != 0 || c.Stats != a.Stats || !reflect.DeepEqual(c.Violations, a.Violations) {
			t.Fatalf("seed %d ran differently without its trace (%d trace lines kept)", seed, len(c.Trace))
		}
	}
}

// TestAvailableMatchesActions: randomStep weighs the categories by
// available, and then draws from actions: the two must agree at every
// step.
func TestAvailableMatchesActions(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		cfg := ScheduleConfig(seed)
		w := newWorld(cfg, NewSeededChooser(seed))
		w.setup()
		for i := 0; i < cfg.Steps; i++ {
			for c := category(0); c < numCategories; c++ {
				if got, want := w.available(c), len(w.actions(c)) > 0; got != want {
					t.Fatalf("seed %d step %d: available(%s) is %v, actions has %d", seed, w.step, categoryNames[c], got, len(w.actions(c)))
				}
			}
			w.randomStep()
		}
	}
}
