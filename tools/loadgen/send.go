package loadgen

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/schollz/progressbar/v3"
)

// send runs the send phase: the open-loop schedule, membership churn and
// the per-second count of first sends (and the progress line).
func (r *runner) send(ctx, devCtx context.Context) {
	sched := Schedule{Rate: r.cfg.shardRate()}
	total := int64(sched.Rate * r.cfg.Duration.Seconds())
	sctx, cancel := context.WithTimeout(ctx, r.cfg.Duration)
	defer cancel()

	churnDone := make(chan struct{})
	go func() { defer close(churnDone); r.churn(sctx, devCtx) }()
	dropDone := make(chan struct{})
	go func() { defer close(dropDone); r.reconnectChurn(sctx) }()
	start := time.Now()
	r.sendStart.Store(start.UnixNano())
	tlDone := make(chan struct{})
	go func() { defer close(tlDone); r.timeline(sctx, total) }()

	var k int64
	for k < total {
		due := sched.DueBy(time.Since(start).Seconds())
		r.offered.Store(min(due, total))
		for ; k < due && k < total; k++ {
			r.sendOne(devCtx, k, start.Add(time.Duration(sched.Due(k)*float64(time.Second))))
		}
		if k >= total {
			break
		}
		next := start.Add(time.Duration(sched.Due(k) * float64(time.Second)))
		t := time.NewTimer(time.Until(next))
		select {
		case <-sctx.Done():
			t.Stop()
			k = total
		case <-t.C:
		}
	}
	<-sctx.Done()
	<-churnDone
	<-dropDone
	<-tlDone
}

// sendOne sends message k of the schedule (and, sometimes, a duplicate of
// it from another device of the sender).
func (r *runner) sendOne(ctx context.Context, k int64, due time.Time) {
	conv := r.plan.Conversations[r.rng.IntN(len(r.plan.Conversations))].ID
	r.cmu.Lock()
	ms := r.members[conv]
	sender := ms[r.rng.IntN(len(ms))]
	r.cmu.Unlock()
	cmid := "m" + strconv.FormatInt(k, 10)
	o := &op{kind: "send", conv: conv, cmid: cmid, body: messageBody(cmid, due, r.cfg.BodyBytes), due: due}
	ds := r.devices[sender]
	di := r.rng.IntN(len(ds))
	var dup *op
	if r.cfg.DupShare > 0 && r.rng.Float64() < r.cfg.DupShare {
		c := *o // copied before o is handed to a device
		c.dup = true
		dup = &c
	}
	r.track(1)
	ds[di].enqueue(ctx, o)
	if dup != nil {
		r.track(1)
		ds[(di+1)%len(ds)].enqueue(ctx, dup)
	}
}

// churn makes membership changes at cfg.Churn per second: a member of a
// group (never its owner) leaves or is kicked, then sends once more (a
// probe: forbidden is the right answer), and a second later the owner adds
// them back.
func (r *runner) churn(ctx, devCtx context.Context) {
	if r.cfg.Churn <= 0 {
		return
	}
	var groups []Conversation
	for _, c := range r.plan.Conversations {
		if len(c.Members) >= 3 {
			groups = append(groups, c)
		}
	}
	if len(groups) == 0 {
		return
	}
	rng := newRand(r.cfg.Seed + 7 + uint64(max(r.cfg.Shard.K, 0))<<32)
	tick := time.NewTicker(time.Duration(float64(time.Second) / r.cfg.Churn))
	defer tick.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c := groups[rng.IntN(len(groups))]
		r.cmu.Lock()
		ms := r.members[c.ID]
		if r.churning[c.ID] || len(ms) < 3 {
			r.cmu.Unlock()
			continue
		}
		victim := ms[1+rng.IntN(len(ms)-1)]
		if victim == c.Owner {
			r.cmu.Unlock()
			continue
		}
		r.churning[c.ID] = true
		r.cmu.Unlock()
		n++
		probe := fmt.Sprintf("p%d", n)
		removed := func(f *frame) {
			if f.Op != "accepted" {
				r.cmu.Lock()
				r.churning[c.ID] = false
				r.cmu.Unlock()
				return
			}
			r.membership.Add(1)
			r.cmu.Lock()
			r.members[c.ID] = without(r.members[c.ID], victim)
			r.cmu.Unlock()
			// Answers arrive on a device's reader: queue through a timer
			// goroutine so a full queue never blocks a reader.
			r.track(1)
			r.retryAfter(devCtx, r.dev(victim), &op{kind: "send", conv: c.ID, cmid: probe, body: messageBody(probe, time.Now(), 20), due: time.Now(), probe: true}, 0)
			r.track(1)
			r.retryAfter(devCtx, r.dev(c.Owner), &op{kind: "join", conv: c.ID, target: victim, cmid: r.key("j"), done: func(f *frame) {
				r.cmu.Lock()
				defer r.cmu.Unlock()
				if f.Op == "accepted" {
					r.membership.Add(1)
					r.members[c.ID] = append(without(r.members[c.ID], victim), victim)
				}
				r.churning[c.ID] = false
			}}, time.Second)
		}
		r.track(1)
		if rng.IntN(2) == 0 {
			r.dev(victim).enqueue(devCtx, &op{kind: "leave", conv: c.ID, cmid: r.key("l"), done: removed})
		} else {
			r.dev(c.Owner).enqueue(devCtx, &op{kind: "kick", conv: c.ID, target: victim, cmid: r.key("k"), done: removed})
		}
	}
}

// reconnectChurn makes a random device drop its connection and dial again
// at cfg.Reconnects per second: commands in flight on it are resent with
// the same ids and the device syncs from its cursors, as after a real
// network drop.
func (r *runner) reconnectChurn(ctx context.Context) {
	if r.cfg.Reconnects <= 0 {
		return
	}
	var all []*device
	for _, u := range r.plan.Users {
		all = append(all, r.devices[u]...)
	}
	if len(all) == 0 {
		return
	}
	rng := newRand(r.cfg.Seed + 11)
	tick := time.NewTicker(time.Duration(float64(time.Second) / r.cfg.Reconnects))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		select {
		case all[rng.IntN(len(all))].drop <- struct{}{}:
		default: // that device has a drop pending already
		}
	}
}

func without(ms []string, u string) []string {
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		if m != u {
			out = append(out, m)
		}
	}
	return out
}

// timeline samples the send phase once a second — first sends per second
// for counters.json — and drives the progress line: sent, accepted/s, p99
// of the last second, rejections, errors.
func (r *runner) timeline(ctx context.Context, total int64) {
	var bar *progressbar.ProgressBar
	if r.cfg.Progress != nil {
		bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(r.cfg.Progress),
			progressbar.OptionSetDescription("sending"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(20),
			progressbar.OptionThrottle(200*time.Millisecond),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(r.cfg.Progress) }),
		)
		defer bar.Finish()
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var lastSent, lastAcc int64
	for t := 1; ; t++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		sent, acc := r.sent.Load(), r.accepted.Load()
		p99, _ := r.accLat.takeInterval()
		s := Second{T: t, Sent: sent - lastSent, Accepted: acc - lastAcc, P99MS: float64(p99.Microseconds()) / 1000}
		lastSent, lastAcc = sent, acc
		r.cmu.Lock()
		r.perSec = append(r.perSec, s.Sent)
		r.cmu.Unlock()
		if bar != nil {
			r.cmu.Lock()
			var rejects int64
			for _, n := range r.rejects {
				rejects += n
			}
			r.cmu.Unlock()
			bar.Describe(fmt.Sprintf("sent %d · accepted %d/s · p99 %.1f ms · rejects %d · errors %d",
				sent, s.Accepted, s.P99MS, rejects, r.errors.Load()))
			_ = bar.Set64(sent)
		}
	}
}

// key returns a fresh idempotency key for a membership command: its
// re-sends (after a timeout or unavailable) then take effect once.
func (r *runner) key(prefix string) string {
	return prefix + strconv.FormatInt(r.keys.Add(1), 10)
}
