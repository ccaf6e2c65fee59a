package loadgen

import (
	"testing"
	"time"
)

// topRand returns the top of the range: the largest full-jitter delay.
func topRand(n int64) int64 { return n - 1 }

func TestResendBackoffIsExponentialWithFullJitter(t *testing.T) {
	s := newResender(ResendPolicy{Base: 100 * time.Millisecond, Cap: time.Second, MaxAttempts: 100, Reserve: 1000}, topRand)
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		d, why := s.next(i+1, 0)
		if why != "" || d != w*time.Millisecond {
			t.Errorf("after attempt %d: %v %q, want %v", i+1, d, why, w*time.Millisecond)
		}
	}
	// Full jitter: the bottom of the range is no wait at all.
	zero := newResender(ResendPolicy{}, func(int64) int64 { return 0 })
	if d, _ := zero.next(3, 0); d != 0 {
		t.Errorf("jitter 0: %v", d)
	}
	// The draws span the range.
	var got []int64
	spy := newResender(ResendPolicy{Base: time.Second}, func(n int64) int64 { got = append(got, n); return n / 2 })
	if d, _ := spy.next(1, 0); d != 500*time.Millisecond || got[0] != int64(time.Second)+1 {
		t.Errorf("draw over %v gave %v", got, d)
	}
}

func TestResendHonoursRetryAfter(t *testing.T) {
	s := newResender(ResendPolicy{Base: 100 * time.Millisecond}, topRand)
	if d, _ := s.next(1, 2*time.Second); d != 2100*time.Millisecond {
		t.Errorf("retry_after 2 s: %v", d)
	}
	s = newResender(ResendPolicy{Base: 100 * time.Millisecond}, func(int64) int64 { return 0 })
	if d, _ := s.next(1, 2*time.Second); d != 2*time.Second {
		t.Errorf("retry_after 2 s, no jitter: %v", d)
	}
}

func TestResendBudgetAndAttempts(t *testing.T) {
	s := newResender(ResendPolicy{Budget: 0.1, Reserve: 5, MaxAttempts: 3}, topRand)
	for i := 0; i < 100; i++ {
		s.first()
	}
	// 100 first attempts × 0.1 + 5 = 15 re-sends, then the budget is spent.
	n := 0
	for ; n < 1000; n++ {
		if _, why := s.next(1, 0); why != "" {
			if why != GaveUpBudget {
				t.Fatalf("gave up for %q", why)
			}
			break
		}
	}
	if n != 15 {
		t.Fatalf("%d re-sends allowed, want 15", n)
	}
	// More first attempts refill it.
	for i := 0; i < 10; i++ {
		s.first()
	}
	if _, why := s.next(1, 0); why != "" {
		t.Errorf("after 10 more first attempts: %q", why)
	}
	if _, why := s.next(3, 0); why != GaveUpAttempts {
		t.Errorf("third attempt answered: %q, want %q", why, GaveUpAttempts)
	}
	if _, why := newResender(ResendPolicy{Budget: -1}, topRand).next(1, 0); why != GaveUpBudget {
		t.Errorf("budget -1 allowed a re-send")
	}
}
