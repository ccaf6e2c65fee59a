package sim

import (
	"os"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// rapidChooser makes a schedule's choices with rapid: a failing schedule is
// shrunk and reported with the seed that reproduces it.
type rapidChooser struct {
	t    *rapid.T
	gens map[int]*rapid.Generator[int]
}

func newRapidChooser(t *rapid.T) *rapidChooser {
	return &rapidChooser{t: t, gens: map[int]*rapid.Generator[int]{}}
}

// Choose implements Chooser.
func (c *rapidChooser) Choose(n int, label string) int {
	g, ok := c.gens[n]
	if !ok {
		g = rapid.IntRange(0, n-1)
		c.gens[n] = g
	}
	return g.Draw(c.t, label)
}

// soak returns how long CHATPIPE_SIM_SOAK asks the property tests to keep
// going ("1": 10 minutes; or a Go duration such as "2h"), 0 when unset.
func soak(t *testing.T) time.Duration {
	v := os.Getenv("CHATPIPE_SIM_SOAK")
	switch v {
	case "", "0", "false":
		return 0
	case "1", "true":
		return 10 * time.Minute
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("CHATPIPE_SIM_SOAK=%q: want 1 or a duration: %v", v, err)
	}
	return d
}

// drawConfig draws the deployment's shape: one to four vshards over one or
// two partitions (vshards share a partition, so one writer's open
// transaction holds back another's replay and persist), two or three
// workers. A soak runs longer schedules with more faults.
func drawConfig(t *rapid.T, long bool) Config {
	cfg := DefaultConfig()
	cfg.VShards = rapid.IntRange(1, 4).Draw(t, "vshards")
	cfg.Partitions = rapid.IntRange(1, min(2, cfg.VShards)).Draw(t, "partitions")
	cfg.Workers = rapid.IntRange(2, 3).Draw(t, "workers")
	if long {
		cfg.Steps, cfg.MaxOps, cfg.MaxFaults = 1000, 150, 30
	}
	return cfg
}

// ciRounds is how many rapid.Check rounds (of -rapid.checks schedules
// each, 100 by default) TestProperties runs outside a soak.
const ciRounds = 8

// TestProperties runs random schedules of the correct writer and checks
// every property after each. A failure prints the violations, the end of
// the schedule's trace and the rapid seed; rerun it with
//
//	go test ./sim/ -run 'TestProperties$' -rapid.seed=<seed>
//
// It also checks, over the whole run set, that schedules with a paused
// worker really had writes fenced.
func TestProperties(t *testing.T) {
	t.Parallel()
	long := soak(t)
	var total Stats
	runs, paused, fencedWhenPaused := 0, 0, 0
	prop := func(rt *rapid.T) {
		r := Run(drawConfig(rt, long > 0), newRapidChooser(rt))
		runs++
		total.add(r.Stats)
		if r.Stats.Pauses > 0 {
			paused++
			fencedWhenPaused += r.Stats.FencedWrites
		}
		if r.Failed() {
			rt.Fatalf("properties broken:\n%s", r.Report(200))
		}
	}
	start := time.Now()
	for round := 0; round < ciRounds || time.Since(start) < long; round++ {
		rapid.Check(t, prop)
		if t.Failed() {
			return
		}
	}
	t.Logf("%d schedules in %v; totals %+v", runs, time.Since(start).Round(time.Millisecond), total)
	if runs >= 50 && fencedWhenPaused == 0 {
		t.Errorf("%d schedules had a paused worker, none had a write fenced: the pause faults do not reach the fence", paused)
	}
}
