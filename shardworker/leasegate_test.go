package shardworker

import (
	"testing"
	"time"
)

func TestLeaseMargin(t *testing.T) {
	for _, c := range []struct{ ttl, want time.Duration }{
		{10 * time.Second, 2500 * time.Millisecond},
		{60 * time.Second, 15 * time.Second},
		{3 * time.Second, time.Second},
		{time.Second, 500 * time.Millisecond},
	} {
		if got := leaseMargin(c.ttl); got != c.want {
			t.Errorf("leaseMargin(%v) = %v, want %v", c.ttl, got, c.want)
		}
	}
}

func TestLeaseAdmits(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	ttl := 10 * time.Second
	deadline := t0.Add(ttl) // renewal sent at t0
	for _, c := range []struct {
		name      string
		now       time.Time
		deadline  time.Time
		lost      bool
		ok        bool
		wantUntil time.Time
	}{
		{"just renewed", t0.Add(10 * time.Millisecond), deadline, false, true, t0.Add(7500 * time.Millisecond)},
		{"renewals failing, margin not reached", t0.Add(7499 * time.Millisecond), deadline, false, true, t0.Add(7500 * time.Millisecond)},
		{"at the margin", t0.Add(7500 * time.Millisecond), deadline, false, false, t0.Add(7500 * time.Millisecond)},
		{"past the deadline", t0.Add(11 * time.Second), deadline, false, false, t0.Add(7500 * time.Millisecond)},
		{"lease gone though the deadline is ahead", t0.Add(time.Second), deadline, true, false, time.Time{}},
		{"no lease", t0, time.Time{}, false, false, time.Time{}},
	} {
		until, ok := leaseAdmits(c.now, c.deadline, ttl, c.lost)
		if ok != c.ok || !until.Equal(c.wantUntil) {
			t.Errorf("%s: leaseAdmits = %v, %v; want %v, %v", c.name, until, ok, c.wantUntil, c.ok)
		}
		if ok && !until.Before(c.deadline) {
			t.Errorf("%s: a command may be decided until %v, not before the lease's deadline %v", c.name, until, c.deadline)
		}
	}
}
