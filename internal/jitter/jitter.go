// Package jitter is the one exponential backoff with full jitter that the
// clients, the load generator's devices and its re-sends share: before
// attempt n, a wait drawn uniformly from [0, Ceiling(n, base, max)]. Sleep
// is the wait itself, cut short when its context ends.
package jitter

import (
	"context"
	"math/rand/v2"
	"time"
)

// Ceiling is base × 2^n, at most max (0 for a base or max of 0 or less);
// it does not overflow for any n.
func Ceiling(n int, base, max time.Duration) time.Duration {
	if base <= 0 || max <= 0 {
		return 0
	}
	c := base
	for i := 0; i < n && c < max; i++ {
		if c > max/2 {
			return max
		}
		c *= 2
	}
	return min(c, max)
}

// Full is a wait drawn from [0, ceiling] with randN (uniform in [0, n);
// nil: math/rand/v2's Int64N).
func Full(ceiling time.Duration, randN func(n int64) int64) time.Duration {
	if ceiling <= 0 {
		return 0
	}
	if randN == nil {
		randN = rand.Int64N
	}
	return time.Duration(randN(int64(ceiling) + 1))
}

// Backoff is Full(Ceiling(n, base, max), nil): the wait before attempt n.
func Backoff(n int, base, max time.Duration) time.Duration {
	return Full(Ceiling(n, base, max), nil)
}

// Sleep waits for d or until ctx is done, whichever comes first, and
// reports whether it waited the whole of d (false: ctx is done). Its timer
// is stopped on return, so a wait cut short leaves nothing behind.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
