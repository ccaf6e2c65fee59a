package shardworker

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/chatpipe/chatpipe/internal/link"
	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/lease"
)

// The lease gate (docs/architecture.md, rule 7). A worker whose renewals
// fail cannot tell whether etcd is down for everyone (nobody can be made
// owner) or only unreachable from here (the lease will expire and the
// coordinator will hand its vshards to others). So it counts on its lease
// only up to the lease's local deadline — when the last renewal etcd
// answered was sent, plus the TTL — and stops taking commands a safety
// margin before it: every request is answered unavailable with a retry,
// nothing written, until a renewal succeeds again or etcd says the lease
// is gone. A command taken before that moment carries the moment as its
// deadline, so the writer does not decide it later (rule 17). A batch
// decided in time may still be committing when the margin runs out; the
// margin is there for it, and should it outlast the lease the new owner's
// marker fences it (rule 1).

// leaseMargin is how long before its lease's local deadline a worker stops
// taking commands: a quarter of the TTL, at least 1 s, at most half the TTL.
func leaseMargin(ttl time.Duration) time.Duration {
	return min(max(ttl/4, time.Second), ttl/2)
}

// leaseAdmits decides whether a command arriving at now may be taken, and
// the last moment it may be decided (until). deadline and ttl are the
// lease's (lease.Registration.Deadline); lost means etcd said the lease is
// gone. With no lease at all (zero deadline) nothing is taken.
func leaseAdmits(now, deadline time.Time, ttl time.Duration, lost bool) (until time.Time, ok bool) {
	if lost || deadline.IsZero() {
		return time.Time{}, false
	}
	until = deadline.Add(-leaseMargin(ttl))
	return until, now.Before(until)
}

// leaseGate holds the worker's current registration for the gate.
type leaseGate struct {
	reg     atomic.Pointer[lease.Registration]
	refused atomic.Int64 // requests answered unavailable by the gate
	closed  atomic.Bool  // the last request found the gate closed (for the log)
}

// set makes reg the lease the gate follows.
func (g *leaseGate) set(reg *lease.Registration) { g.reg.Store(reg) }

// admits applies leaseAdmits to the current lease at now; why says what
// closed the gate.
func (g *leaseGate) admits(now time.Time) (until time.Time, ok bool, why string) {
	reg := g.reg.Load()
	if reg == nil {
		return time.Time{}, false, "not registered in etcd yet"
	}
	lost := false
	select {
	case <-reg.Lost():
		lost = true
	default:
	}
	deadline, ttl := reg.Deadline()
	until, ok = leaseAdmits(now, deadline, ttl, lost)
	switch {
	case lost:
		why = "its lease is gone"
	case !ok:
		why = fmt.Sprintf("its lease was last renewed %v ago (TTL %v) and may expire soon", now.Sub(deadline.Add(-ttl)).Round(time.Millisecond), ttl)
	}
	return until, ok, why
}

// leaseGated wraps the worker's request handler with the gate.
func (w *Worker) leaseGated(next link.Handler) link.Handler {
	return func(req *link.Request, reply func(*link.Response)) {
		until, ok, why := w.gate.admits(time.Now())
		if !ok {
			w.gate.refused.Add(1)
			if !w.gate.closed.Swap(true) {
				w.log.Warn("not accepting: lease renewal overdue or lease gone", "why", why)
			}
			reply(&link.Response{RID: req.RID, Retry: true,
				Reply: shardcore.Unavailable(req.Req.ID, "worker %s is not accepting: %s", w.cfg.ID, why)})
			return
		}
		if w.gate.closed.Swap(false) {
			w.log.Info("accepting again: lease renewed, or registered anew")
		}
		if req.Deadline.IsZero() || req.Deadline.After(until) {
			req.Deadline = until
		}
		next(req, reply)
	}
}

// leaseGateErr is the gate's part of Healthy.
func (w *Worker) leaseGateErr() error {
	if _, ok, why := w.gate.admits(time.Now()); !ok {
		return fmt.Errorf("not accepting: %s", why)
	}
	return nil
}

// leaseCollectors are the gate's metrics.
func (w *Worker) leaseCollectors() []prometheus.Collector {
	l := prometheus.Labels{"worker": w.cfg.ID}
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "chatpipe_worker_lease_refused_total", ConstLabels: l,
			Help: "Requests answered unavailable (nothing written) because the worker's lease renewal was overdue or its lease gone."},
			func() float64 { return float64(w.gate.refused.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "chatpipe_worker_lease_seconds_left", ConstLabels: l,
			Help: "Seconds until the worker stops accepting unless its lease is renewed (negative: not accepting)."},
			func() float64 {
				until, _, _ := w.gate.admits(time.Now())
				if until.IsZero() {
					return -1
				}
				return time.Until(until).Seconds()
			}),
	}
}
