package sim

import "math/rand/v2"

// Chooser makes every choice of a schedule: which action runs next and its
// parameters. A property-based test passes one backed by rapid (so failures
// shrink and print a seed); SeededChooser replays a schedule from a seed.
// Choose returns a value in [0, n); n is at least 1.
type Chooser interface {
	Choose(n int, label string) int
}

// SeededChooser draws from a deterministic PRNG: the same seed gives the
// same schedule.
type SeededChooser struct {
	r *rand.Rand
}

// NewSeededChooser returns a chooser for seed.
func NewSeededChooser(seed uint64) *SeededChooser {
	return &SeededChooser{r: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))}
}

// Choose implements Chooser.
func (c *SeededChooser) Choose(n int, _ string) int {
	return c.r.IntN(n)
}
