package sim

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ciSchedules is how many seeded schedules TestSchedules runs by default;
// CHATPIPE_SIM_SCHEDULES sets another count, and a soak runs 1,000,000.
// Under the race detector it runs raceSchedules: the simulation is one
// goroutine, so the detector has nothing to find in it and only makes it
// several times slower (192 s for 1,000 schedules against 39 s for
// 10,000 without it, on a CI run), beside the e2e suite in the same `go test -race
// ./...`. .ci/run runs the package again without -race, all ciSchedules.
const (
	ciSchedules   = 10_000
	raceSchedules = 1_000
)

// corpusFile holds the seeds of schedules that once failed (or that reach
// a path worth keeping): TestScheduleCorpus runs every one of them, and
// TestSchedules adds the seed of each schedule it finds failing.
const corpusFile = "testdata/schedules.txt"

// ScheduleConfig is the deployment shape of seeded schedule seed: one to
// four vshards over one or two partitions, two or three workers, drawn
// from the seed, so a seed alone replays its schedule exactly.
func ScheduleConfig(seed uint64) Config {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	cfg := DefaultConfig()
	cfg.VShards = 1 + r.IntN(4)
	cfg.Partitions = 1 + r.IntN(min(2, cfg.VShards))
	cfg.Workers = 2 + r.IntN(2)
	cfg.WriterMaxConvs = 1 + r.IntN(3)
	cfg.Dedicated = r.IntN(3)
	return cfg
}

// runSchedule runs seeded schedule seed of the correct writer.
func runSchedule(seed uint64) *Result {
	return RunSeed(ScheduleConfig(seed), seed)
}

func replayHint(seed uint64) string {
	return fmt.Sprintf("replay: CHATPIPE_SIM_SCHEDULE=%d go test ./sim/ -run 'TestSchedules$' -v", seed)
}

// TestSchedules runs seeded random schedules of the real writer state
// machine (shardcore.Writer) and checks every property after each:
// kick-vs-send races, lost commit replies (unknown outcomes), owner
// changes during replay, pauses and crashes, persist lagging behind the
// writers. A failing seed is printed with the command that replays it with
// its whole trace, and is added to the corpus. CHATPIPE_SIM_SCHEDULE=<seed>
// replays one.
func TestSchedules(t *testing.T) {
	t.Parallel()
	if v := os.Getenv("CHATPIPE_SIM_SCHEDULE"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHATPIPE_SIM_SCHEDULE=%q: %v", v, err)
		}
		r := Run(ScheduleConfig(seed), NewSeededChooser(seed)) // with its trace, failing or not
		t.Logf("seed %d, config %+v:\n%s", seed, ScheduleConfig(seed), r.Report(len(r.Trace)))
		if r.Failed() {
			t.Fail()
		}
		return
	}
	n := ciSchedules
	if raceDetector {
		n = raceSchedules
	}
	if v := os.Getenv("CHATPIPE_SIM_SCHEDULES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("CHATPIPE_SIM_SCHEDULES=%q: want a count", v)
		}
	} else if soak(t) > 0 {
		n = 1_000_000
	}
	// Seeds start past the bug tests' 1..bugSeeds and move with the day,
	// so CI explores new schedules each day and a failure names its seed.
	base := uint64(time.Now().UTC().YearDay())*10_000_000 + 1_000
	if v := os.Getenv("CHATPIPE_SIM_BASE"); v != "" {
		b, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHATPIPE_SIM_BASE=%q: %v", v, err)
		}
		base = b
	}
	start := time.Now()
	var total Stats
	failed := 0
	for i := 0; i < n; i++ {
		seed := base + uint64(i)
		r := runSchedule(seed)
		total.add(r.Stats)
		if !r.Failed() {
			continue
		}
		failed++
		addToCorpus(t, seed, fmt.Sprintf("%v", r.Properties()))
		t.Errorf("seed %d: %v\n%s\n%s", seed, r.Properties(), r.Report(150), replayHint(seed))
		if failed >= 3 {
			t.Fatalf("stopping after %d failing schedules", failed)
		}
	}
	t.Logf("%d schedules from seed %d in %v; totals %+v", n, base, time.Since(start).Round(time.Millisecond), total)
	if n >= 1000 && (total.FencedCommits+total.FencedWrites == 0 || total.LostCommitReplies == 0 || total.Takeovers == 0) {
		t.Errorf("the schedules reached no fence, lost commit reply or takeover: the faults do not reach the writer")
	}
}

// TestScheduleCorpus runs every seed of the corpus.
func TestScheduleCorpus(t *testing.T) {
	t.Parallel()
	seeds := readCorpus(t)
	if len(seeds) == 0 {
		t.Fatalf("%s holds no seed", corpusFile)
	}
	for _, seed := range seeds {
		if r := runSchedule(seed); r.Failed() {
			t.Errorf("corpus seed %d: %v\n%s\n%s", seed, r.Properties(), r.Report(150), replayHint(seed))
		}
	}
}

// readCorpus reads the corpus: one seed a line, "#" starts a comment.
func readCorpus(t *testing.T) []uint64 {
	f, err := os.Open(corpusFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var seeds []uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		seed, err := strconv.ParseUint(line, 10, 64)
		if err != nil {
			t.Fatalf("%s: %q is not a seed", corpusFile, line)
		}
		seeds = append(seeds, seed)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return seeds
}

// addToCorpus appends a failing seed to the corpus, so it is run by every
// later test run once the change is committed.
func addToCorpus(t *testing.T, seed uint64, why string) {
	f, err := os.OpenFile(corpusFile, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Logf("cannot add seed %d to %s: %v", seed, corpusFile, err)
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%d # %s, found %s\n", seed, why, time.Now().UTC().Format("2006-01-02"))
}

// TestMovesUnderFaults runs seeded schedules with dedicated vshards, where
// the operator isolates and releases conversations at random points, and
// asserts that the hard cases happened — a takeover of the vshard a
// conversation was moving from or to, the new writer asked while persist
// had not stored the moved record yet, one round trip of a worker's
// loader answering the loads of two writers that both asked for the
// moving conversation, and the projection applying a conversation's newer
// partition before its older one's tail (a hole its gap fill closed), a
// released conversation's override deleted by its hashed vshard's writer
// — and that every property held through them.
func TestMovesUnderFaults(t *testing.T) {
	t.Parallel()
	var sum Stats
	for seed := uint64(1); seed <= 500; seed++ {
		cfg := ScheduleConfig(seed)
		cfg.Dedicated = 1 + int(seed%2)
		r := RunSeed(cfg, seed)
		if r.Failed() {
			t.Fatalf("seed %d (%+v): %v\n%s", seed, cfg, r.Properties(), r.Report(200))
		}
		sum.add(r.Stats)
	}
	t.Logf("500 schedules: %d overrides changed, %d moved records, %d takeovers mid-move, %d commands that arrived before persist stored their moved record, "+
		"%d loader round trips that answered two writers' loads of one conversation, %d projection batches that filled a hole of a moved conversation, %d overrides released",
		sum.Isolations, sum.ConvMoves, sum.MovesAcrossTakeover, sum.ArrivalsBeforePersist, sum.SharedConvLoads, sum.GapFills, sum.Releases)
	if sum.ConvMoves == 0 || sum.MovesAcrossTakeover == 0 || sum.ArrivalsBeforePersist == 0 || sum.SharedConvLoads == 0 || sum.GapFills == 0 || sum.Releases == 0 {
		t.Errorf("the schedules missed a hard case: %+v", sum)
	}
}
