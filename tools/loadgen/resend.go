package loadgen

import (
	"sync"
	"time"

	"github.com/chatpipe/chatpipe/internal/jitter"
)

// ResendPolicy decides whether and when a command without a final answer
// is sent again (same ids): exponential backoff with full jitter, never
// sooner than the server's retry_after_ms, within a budget so that
// re-sends cannot multiply the overload a run measures.
type ResendPolicy struct {
	// Budget is the re-sends allowed per first attempt of any command
	// (default 0.1: at most a tenth more than the offered load); negative:
	// no re-sends at all.
	Budget float64
	// Reserve is the re-sends allowed beyond Budget (default 100), so a
	// short or slow run can still retry its first few commands.
	Reserve int64
	// MaxAttempts bounds the attempts of one command, the first included
	// (default 6).
	MaxAttempts int
	// Base is the backoff ceiling before the first re-send; it doubles
	// with every attempt up to Cap (defaults 250 ms, 30 s).
	Base, Cap time.Duration
}

func (p *ResendPolicy) defaults() {
	if p.Budget == 0 {
		p.Budget = 0.1
	}
	if p.Reserve <= 0 {
		p.Reserve = 100
	}
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 6
	}
	if p.Base <= 0 {
		p.Base = 250 * time.Millisecond
	}
	if p.Cap <= 0 {
		p.Cap = 30 * time.Second
	}
	p.Cap = max(p.Cap, p.Base)
}

// Give-up causes.
const (
	GaveUpAttempts = "attempts"
	GaveUpBudget   = "budget"
)

// resender applies a ResendPolicy to a run's commands. It is pure apart
// from randN (uniform in [0, n)), which tests inject.
type resender struct {
	p     ResendPolicy
	mu    sync.Mutex
	randN func(n int64) int64

	firsts, resends int64
}

func newResender(p ResendPolicy, randN func(int64) int64) *resender {
	p.defaults()
	return &resender{p: p, randN: randN}
}

// first records a command's first attempt: it adds Budget to the budget.
func (s *resender) first() {
	s.mu.Lock()
	s.firsts++
	s.mu.Unlock()
}

// backoff is the full-jitter delay before attempt attempts+1:
// uniform in [0, min(Cap, Base × 2^(attempts-1))].
func (s *resender) backoff(attempts int) time.Duration {
	return jitter.Full(jitter.Ceiling(attempts-1, s.p.Base, s.p.Cap), s.randN)
}

// next decides about a command that made attempts attempts and has no
// final answer: it returns the delay before the next attempt (retryAfter,
// the server's floor, plus the jittered backoff), or why it is given up
// (GaveUpAttempts, GaveUpBudget). A re-send it allows is spent from the
// budget.
func (s *resender) next(attempts int, retryAfter time.Duration) (time.Duration, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if attempts >= s.p.MaxAttempts {
		return 0, GaveUpAttempts
	}
	if s.p.Budget < 0 || float64(s.resends) >= s.p.Budget*float64(s.firsts)+float64(s.p.Reserve) {
		return 0, GaveUpBudget
	}
	s.resends++
	return max(retryAfter, 0) + s.backoff(attempts), ""
}

// nextSync is next for a sync: a read, which adds no writes to the load
// a run measures, and the only way a device that missed events gets them;
// it is neither spent from the budget nor bounded in attempts (the run's
// drain bounds it).
func (s *resender) nextSync(attempts int, retryAfter time.Duration) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(retryAfter, 0) + s.backoff(min(attempts, 40))
}
