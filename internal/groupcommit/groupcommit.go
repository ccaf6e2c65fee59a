// Package groupcommit decides how long a batcher lingers for its batch to
// fill before it commits: the transactions-per-second side of group
// commit, for a vshard's writer (Kafka transactions) and for the log's
// consumers (Postgres transactions). It is pure: batches and durations
// in, a duration out.
//
// Every transaction costs a fixed amount of work whatever it carries (in
// Kafka: AddPartitionsToTxn, the produce, EndTxn and its markers; in
// Postgres: the statements, the offsets row, the commit). A batcher whose
// items arrive at λ/s and whose commit takes c collects, when it waits L
// before each commit, batches of about 1 + λ(L + c) items, so it commits
// λ / (1 + λ(L + c)) transactions a second. For that to stay under its
// transaction budget T,
//
//	L ≥ 1/T − 1/λ − c
//
// which is zero while λ ≤ T (light load: commit at once) and grows with λ
// towards 1/T − c. L never exceeds the latency budget Max: past it the
// budget wins and the transaction rate rises instead. A batch also ends
// when it holds as many items as the batcher takes.
package groupcommit

import "time"

// Pacer estimates a batcher's arrival rate and commit time from the
// batches it observes and says how long to linger. The zero value never
// lingers.
type Pacer struct {
	Max    time.Duration // latency budget: the longest linger (0: never linger)
	rate   float64       // arrivals/s, smoothed over windows of at least gcWindow
	commit float64       // seconds per batch (decide + commit), smoothed
	winN   int
	winT   float64
}

const (
	gcWindow = 0.05 // seconds of arrivals per rate sample
	gcAlpha  = 0.3  // weight of a new sample
)

// Observe records a batch of n items that began cycle after the previous
// batch began and took took to decide and commit.
func (g *Pacer) Observe(n int, cycle, took time.Duration) {
	if took > 0 {
		if g.commit == 0 {
			g.commit = took.Seconds()
		} else {
			g.commit += gcAlpha * (took.Seconds() - g.commit)
		}
	}
	if cycle <= 0 {
		return
	}
	g.winN += n
	g.winT += cycle.Seconds()
	if g.winT < gcWindow {
		return
	}
	sample := float64(g.winN) / g.winT
	g.winN, g.winT = 0, 0
	if g.rate == 0 {
		g.rate = sample
	} else {
		g.rate += gcAlpha * (sample - g.rate)
	}
}

// Linger returns how long to wait for the next batch to fill, given the
// batcher's transaction budget (transactions/s; for a vshard, its share of
// the worker's).
func (g *Pacer) Linger(share float64) time.Duration {
	if g.Max <= 0 || share <= 0 || g.rate <= share {
		return 0
	}
	l := 1/share - 1/g.rate - g.commit
	if l <= 0 {
		return 0
	}
	return min(time.Duration(l*float64(time.Second)), g.Max)
}
