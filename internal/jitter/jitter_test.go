package jitter

import (
	"context"
	"math"
	"testing"
	"time"
)

// Ceiling doubles from base up to max, for any n, and is 0 for a base or
// a max of 0.
func TestCeiling(t *testing.T) {
	for _, tc := range []struct {
		n         int
		base, max time.Duration
		want      time.Duration
	}{
		{0, 100 * time.Millisecond, 5 * time.Second, 100 * time.Millisecond},
		{1, 100 * time.Millisecond, 5 * time.Second, 200 * time.Millisecond},
		{5, 100 * time.Millisecond, 5 * time.Second, 3200 * time.Millisecond},
		{6, 100 * time.Millisecond, 5 * time.Second, 5 * time.Second},
		{math.MaxInt, time.Nanosecond, time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)},
		{-3, time.Second, time.Minute, time.Second},
		{4, 0, time.Second, 0},
		{4, time.Second, 0, 0},
	} {
		if got := Ceiling(tc.n, tc.base, tc.max); got != tc.want {
			t.Errorf("Ceiling(%d, %v, %v) = %v, want %v", tc.n, tc.base, tc.max, got, tc.want)
		}
	}
}

// Full draws from [0, ceiling], both ends included.
func TestFull(t *testing.T) {
	var asked int64
	low := func(n int64) int64 { asked = n; return 0 }
	high := func(n int64) int64 { return n - 1 }
	if d := Full(time.Second, low); d != 0 || asked != int64(time.Second)+1 {
		t.Errorf("lowest draw %v (asked for %d)", d, asked)
	}
	if d := Full(time.Second, high); d != time.Second {
		t.Errorf("highest draw %v", d)
	}
	if d := Full(0, high); d != 0 {
		t.Errorf("ceiling 0: %v", d)
	}
	for range 1000 {
		if d := Backoff(3, 10*time.Millisecond, time.Second); d < 0 || d > 80*time.Millisecond {
			t.Fatalf("Backoff(3, 10ms, 1s) = %v", d)
		}
	}
}

// Sleep reports true after a whole wait, and false as soon as its context
// ends: at once when it has ended already, or when it ends during a long
// wait.
func TestSleep(t *testing.T) {
	start := time.Now()
	if !Sleep(context.Background(), 20*time.Millisecond) {
		t.Error("Sleep(background, 20ms) = false, want true")
	}
	if waited := time.Since(start); waited < 20*time.Millisecond {
		t.Errorf("Sleep(background, 20ms) returned after %v", waited)
	}

	done, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(done, time.Hour) {
		t.Error("Sleep(cancelled, 1h) = true, want false")
	}

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	start = time.Now()
	if Sleep(ctx, time.Hour) {
		t.Error("Sleep cancelled during the wait = true, want false")
	}
	if waited := time.Since(start); waited > time.Minute {
		t.Errorf("Sleep cancelled after 20ms returned after %v", waited)
	}
}
