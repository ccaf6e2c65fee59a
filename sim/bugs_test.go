package sim

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
)

// bugCases are the bug switches, each with the property that must catch
// it and the shape of its schedules (DefaultConfig changed by shape).
var bugCases = []struct {
	name  string
	bugs  Bugs
	want  string
	shape shape
}{
	{"AcceptBeforeMarker", Bugs{AcceptBeforeMarker: true}, PropCollision, shape{}},
	{"AcceptedBeforeCommit", Bugs{AcceptedBeforeCommit: true}, PropLost, shape{}},
	{"MembershipOutsideMailbox", Bugs{MembershipOutsideMailbox: true}, PropRemoved, shape{}},
	{"ReplayBeforeMarker", Bugs{ReplayBeforeMarker: true}, PropCollision, shape{}},
	// The new writer of a moved conversation starts before the old one's
	// moved record is committed (and stored).
	{"AcceptBeforeMoved", Bugs{AcceptBeforeMoved: true}, PropCollision, shape{dedicated: 1}},
	// Two writers of one worker, the conversation's hashed vshard's and
	// the dedicated one's, share a loaded state: one decides from what
	// the other applied.
	{"SharedLoadState", Bugs{SharedLoadState: true}, PropArrival, shape{dedicated: 1}},
	// Fewer faults, fewer conversations: more of the schedule is moves
	// and membership changes the projection lags behind.
	{"ProjectionRecordOrder", Bugs{ProjectionRecordOrder: true}, PropProjection, shape{dedicated: 1, conversations: 2, faults: 2}},
	// Fewer faults (fewer takeovers: the writer that answered the join
	// is the one the retry reaches), every user a member at first.
	{"ForgetNoopJoin", Bugs{ForgetNoopJoin: true}, PropOneEffect, shape{users: 3, faults: 2}},
	{"VerdictsPinConvs", Bugs{VerdictsPinConvs: true}, PropCacheBound, shape{}},
	// A trimmed result's key is missing from the filter of known keys: a
	// retry after the trim is written as a new command.
	{"KnownForgetsTrimmed", Bugs{KnownForgetsTrimmed: true}, PropDuplicate, shape{}},
	// The operator deletes a released conversation's override once the
	// sink shows it home: a move decided before, still in the log but not
	// stored, strands it where nothing routes to any more.
	{"ReleaseFromSink", Bugs{ReleaseFromSink: true}, PropLiveness, shape{dedicated: 1, conversations: 2}},
	// Moved records carry no verdicts: a send refused before the move is
	// accepted by the vshard it moved to once its sender is a member.
	{"DropCarriedVerdicts", Bugs{DropCarriedVerdicts: true}, PropOneEffect, shape{dedicated: 1}},
}

// shape is how a bug's schedules differ from DefaultConfig (zero: not).
type shape struct {
	dedicated, conversations, users, faults int
}

// config is DefaultConfig in shape s.
func (s shape) config() Config {
	cfg := DefaultConfig()
	cfg.Dedicated = s.dedicated
	if s.conversations > 0 {
		cfg.Conversations = s.conversations
	}
	if s.users > 0 {
		cfg.Users = s.users
	}
	if s.faults > 0 {
		cfg.MaxFaults = s.faults
	}
	return cfg
}

// bugSeeds is how many seeded schedules each bug runs in CI (a soak runs
// 25 times as many).
const bugSeeds = 300

// TestBugsAreCaught runs each bug switch over the same seeded schedules CI
// uses for the correct writer (DefaultConfig, seeds 1..bugSeeds) and
// asserts that the properties find it, and that the property meant for it
// is among those that do. It logs, per property, in how many schedules it
// fired and the first seed; replay one with TestReplay.
func TestBugsAreCaught(t *testing.T) {
	t.Parallel()
	seeds := bugSeeds
	if soak(t) > 0 {
		seeds *= 25
	}
	for _, bc := range bugCases {
		t.Run(bc.name, func(t *testing.T) {
			t.Parallel()
			cfg := bugConfig(t, bc.name)
			cfg.Untraced = true // only the properties are counted
			caught := 0
			count, first := map[string]int{}, map[string]int{}
			for seed := 1; seed <= seeds; seed++ {
				r := Run(cfg, NewSeededChooser(uint64(seed)))
				if !r.Failed() {
					continue
				}
				caught++
				for _, p := range r.Properties() {
					if count[p]++; first[p] == 0 {
						first[p] = seed
					}
				}
			}
			var lines []string
			for p, n := range count {
				lines = append(lines, fmt.Sprintf("%-34s in %3d schedules, first seed %d", p, n, first[p]))
			}
			sort.Strings(lines)
			t.Logf("caught in %d of %d schedules:\n  %s\nreplay: CHATPIPE_SIM_BUG=%s CHATPIPE_SIM_SEED=%d go test ./sim/ -run TestReplay -v",
				caught, seeds, strings.Join(lines, "\n  "), bc.name, first[bc.want])
			if caught == 0 {
				t.Fatalf("%s was not caught by any property in %d schedules", bc.name, seeds)
			}
			if count[bc.want] == 0 {
				t.Errorf("%s was caught, but never by %s", bc.name, bc.want)
			}
		})
	}
}

// TestCorrectWriterOnBugSeeds runs the correct writer on the seeds and
// shapes the bug tests use: every violation they find must come from the
// bug.
func TestCorrectWriterOnBugSeeds(t *testing.T) {
	t.Parallel()
	var shapes []shape
	for _, bc := range bugCases {
		if !slices.Contains(shapes, bc.shape) {
			shapes = append(shapes, bc.shape)
		}
	}
	for _, sh := range shapes {
		cfg := sh.config()
		for seed := 1; seed <= bugSeeds; seed++ {
			if r := RunSeed(cfg, uint64(seed)); r.Failed() {
				t.Fatalf("seed %d in shape %+v: %v\n%s\nreplay: CHATPIPE_SIM_SEED=%d go test ./sim/ -run TestReplay -v", seed, sh, r.Properties(), r.Report(150), seed)
			}
		}
	}
}

// bugConfig returns the config of the bug switch named name in its
// shape ("" is the correct writer in DefaultConfig).
func bugConfig(t *testing.T, name string) Config {
	if name == "" {
		return DefaultConfig()
	}
	var names []string
	for _, bc := range bugCases {
		if bc.name == name {
			cfg := bc.shape.config()
			cfg.Bugs = bc.bugs
			return cfg
		}
		names = append(names, bc.name)
	}
	t.Fatalf("CHATPIPE_SIM_BUG=%q: want one of %v", name, names)
	return Config{}
}

// TestMarkerConfirmKeepsEpochsInOrder: without the owner-row read between
// a session's marker produce and its commit (WhatIf.NoMarkerConfirm), a
// writer whose re-check passed just before its row moved initialises the
// transactional.id after the new owner and commits a marker of the older
// epoch after the newer owner's records; with it, never (the same
// schedules pass TestSchedules).
func TestMarkerConfirmKeepsEpochsInOrder(t *testing.T) {
	t.Parallel()
	caught, first := 0, uint64(0)
	for seed := uint64(1); seed <= 1000; seed++ {
		cfg := ScheduleConfig(seed)
		cfg.WhatIf.NoMarkerConfirm = true
		cfg.Untraced = true // only the properties are counted
		r := Run(cfg, NewSeededChooser(seed))
		for _, p := range r.Properties() {
			if p == PropOwnerEpochs {
				if caught++; first == 0 {
					first = seed
				}
				break
			}
		}
	}
	t.Logf("without the confirm: %s in %d of 1000 schedules, first seed %d", PropOwnerEpochs, caught, first)
	if caught == 0 {
		t.Fatalf("the order without the marker's confirm never committed an older epoch after a newer one in 1000 schedules")
	}
}
