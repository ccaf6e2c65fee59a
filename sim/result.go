package sim

import (
	"fmt"
	"slices"
	"strings"
)

// Stats count what a run exercised.
type Stats struct {
	Steps             int
	Ops               int
	Retries           int
	Batches           int
	Commits           int
	Takeovers         int // replays finished (a writer started accepting)
	Moves             int // owner rows changed by the coordinator
	FencedWrites      int // produce/commit calls the log rejected for an old producer epoch
	FencedCommits     int // batches whose commit was fenced
	TimedOutTxns      int
	LostCommitReplies int
	Pauses            int
	PausesInFlight    int // pauses of a worker holding a produced, uncommitted batch
	Crashes           int
	CrashesInFlight   int // crashes between produce and commit
	DroppedMessages   int
	Outages           int
	StaleAnswers      int // answers of fenced writers the log contradicts (not violations unless StrictAnswers)
	EpochRegressions  int // events of an older ownership epoch committed after a newer one's
	Isolations        int // overrides the operator changed (isolate or release)
	ConvMoves         int // moved records committed
	Releases          int // overrides deleted by a released conversation's hashed vshard's writer
	// CarriedVerdictsTested: commits of a key at the vshard a moved
	// record carried the key's kept answer to (PropOneEffect looked at).
	CarriedVerdictsTested int
	// MovesAcrossTakeover: takeovers of a vshard a conversation was moving
	// from or to (its override named another vshard than the log).
	MovesAcrossTakeover int
	// ArrivalsBeforePersist: commands the writer a conversation had moved
	// to answered retry because persist had not stored the moved record yet.
	ArrivalsBeforePersist int
	// LoadTrips are the round trips of the workers' loaders; MergedLoads
	// those that answered more than one load, SharedConvLoads those in
	// which two loads asked for the same conversation.
	LoadTrips       int
	MergedLoads     int
	SharedConvLoads int
	// ProjectedBatches are the projection's transactions; GapFills the
	// conversations whose periods a batch first rewrote from the stored
	// events (a hole in its seqs: a newer partition applied first).
	ProjectedBatches int
	GapFills         int
	// NoopJoins: keyed joins of a current member answered accepted
	// without a write; their keys were tried again in NoopJoinRetries
	// later attempts.
	NoopJoins       int
	NoopJoinRetries int
	// Housekeeps: housekeeping passes that knew persist's offset;
	// CacheHigh: the most conversations a writer held after one.
	Housekeeps int
	CacheHigh  int
}

// add sums o into s.
func (s *Stats) add(o Stats) {
	s.Steps += o.Steps
	s.Ops += o.Ops
	s.Retries += o.Retries
	s.Batches += o.Batches
	s.Commits += o.Commits
	s.Takeovers += o.Takeovers
	s.Moves += o.Moves
	s.FencedWrites += o.FencedWrites
	s.FencedCommits += o.FencedCommits
	s.TimedOutTxns += o.TimedOutTxns
	s.LostCommitReplies += o.LostCommitReplies
	s.Pauses += o.Pauses
	s.PausesInFlight += o.PausesInFlight
	s.Crashes += o.Crashes
	s.CrashesInFlight += o.CrashesInFlight
	s.DroppedMessages += o.DroppedMessages
	s.Outages += o.Outages
	s.StaleAnswers += o.StaleAnswers
	s.EpochRegressions += o.EpochRegressions
	s.Isolations += o.Isolations
	s.ConvMoves += o.ConvMoves
	s.Releases += o.Releases
	s.CarriedVerdictsTested += o.CarriedVerdictsTested
	s.MovesAcrossTakeover += o.MovesAcrossTakeover
	s.ArrivalsBeforePersist += o.ArrivalsBeforePersist
	s.LoadTrips += o.LoadTrips
	s.MergedLoads += o.MergedLoads
	s.SharedConvLoads += o.SharedConvLoads
	s.ProjectedBatches += o.ProjectedBatches
	s.GapFills += o.GapFills
	s.NoopJoins += o.NoopJoins
	s.NoopJoinRetries += o.NoopJoinRetries
	s.Housekeeps += o.Housekeeps
	s.CacheHigh = max(s.CacheHigh, o.CacheHigh)
}

// Violation is one broken property.
type Violation struct {
	Property string
	Detail   string
}

// String is the property and the details.
func (v Violation) String() string { return v.Property + ": " + v.Detail }

// Result is what one run found.
type Result struct {
	Violations []Violation
	Stats      Stats
	// Trace is the run's actions, one line each.
	Trace []string
	// Stale describes the first stale answer counted in Stats.StaleAnswers.
	Stale string
}

// Failed reports whether a property was broken.
func (r *Result) Failed() bool { return len(r.Violations) > 0 }

// Properties returns the broken properties, each once, sorted.
func (r *Result) Properties() []string {
	var ps []string
	for _, v := range r.Violations {
		if !slices.Contains(ps, v.Property) {
			ps = append(ps, v.Property)
		}
	}
	slices.Sort(ps)
	return ps
}

// Report is a readable account of the violations and the tail of the trace.
func (r *Result) Report(traceLines int) string {
	var b strings.Builder
	for i, v := range r.Violations {
		if i == 20 {
			fmt.Fprintf(&b, "... %d more\n", len(r.Violations)-i)
			break
		}
		fmt.Fprintf(&b, "VIOLATION %s\n", v)
	}
	fmt.Fprintf(&b, "stats: %+v\n", r.Stats)
	from := max(0, len(r.Trace)-traceLines)
	fmt.Fprintf(&b, "trace (last %d of %d steps):\n", len(r.Trace)-from, len(r.Trace))
	for _, l := range r.Trace[from:] {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}
