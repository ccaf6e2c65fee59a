package lease

import (
	"testing"
	"time"
)

// The coordinator waits interval while something is left to retry, else
// idle, or until just after the first hand-off pin expires if that comes
// sooner.
func TestPlanWait(t *testing.T) {
	now := time.Unix(1000, 0)
	const interval, idle = time.Second, 30 * time.Second
	for _, tc := range []struct {
		name  string
		retry bool
		pins  map[int]time.Time
		want  time.Duration
	}{
		{"idle", false, nil, idle},
		{"retry", true, map[int]time.Time{1: now.Add(time.Minute)}, interval},
		{"a pin expires later than idle", false, map[int]time.Time{1: now.Add(time.Minute)}, idle},
		{"a pin expires sooner", false, map[int]time.Time{1: now.Add(time.Minute), 2: now.Add(5 * time.Second)}, 5*time.Second + 10*time.Millisecond},
		{"a pin expired", false, map[int]time.Time{1: now.Add(-time.Second)}, 10 * time.Millisecond},
	} {
		if got := planWait(tc.retry, tc.pins, now, interval, idle); got != tc.want {
			t.Errorf("%s: planWait = %v, want %v", tc.name, got, tc.want)
		}
	}
}
