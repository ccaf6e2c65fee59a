package loadgen

import (
	"context"
	"time"
)

// What the runner does with an answer: retries, re-sends, refusals,
// give-ups, deliveries.

// retryAfter queues o on d after delay (a retry keeps o's ids). It never
// blocks: code running on a device's reader queues through it.
func (r *runner) retryAfter(ctx context.Context, d *device, o *op, delay time.Duration) {
	r.timers.Add(1)
	time.AfterFunc(delay, func() {
		defer r.timers.Done()
		d.enqueue(ctx, o)
	})
}

// resend sends o again (same ids) after the policy's backoff, or gives it
// up when its attempts or the run's re-send budget are spent (a sync is
// always sent again: see nextSync). It never blocks.
func (r *runner) resend(ctx context.Context, d *device, o *op, cause string, retryAfter time.Duration) {
	d.mu.Lock()
	attempts := o.attempts
	d.mu.Unlock()
	if o.kind == "sync" {
		r.bump(r.retries, cause)
		r.retryAfter(ctx, d, o, r.rs.nextSync(attempts, retryAfter))
		return
	}
	delay, why := r.rs.next(attempts, retryAfter)
	if why != "" {
		r.refuse(d, o, why)
		return
	}
	r.bump(r.retries, cause)
	r.retryAfter(ctx, d, o, delay)
}

// refuse notes a re-send the policy refused. The command is sent no more:
// if its latest attempt is still pending (a timeout), its answer may yet
// come and counts; otherwise it is given up now.
func (r *runner) refuse(d *device, o *op, why string) {
	r.bump(r.refused, why)
	d.mu.Lock()
	if o.finished {
		d.mu.Unlock()
		return
	}
	o.gaveUp, o.waiting = true, true
	late := o.reqID != "" && d.pending[o.reqID] == o
	if !late {
		o.finished = true
	}
	d.mu.Unlock()
	if !late {
		r.abandon(d, o)
	}
}

// abandon ends o without a final answer (the caller set o.finished): its
// outcome is unknown, which gaveup.jsonl records.
func (r *runner) abandon(d *device, o *op) {
	d.mu.Lock()
	if o.reqID != "" && d.pending[o.reqID] == o {
		delete(d.pending, o.reqID)
	}
	attempts, sent := o.attempts, int64(0)
	if !o.sent.IsZero() {
		sent = o.sent.UnixNano()
	}
	d.mu.Unlock()
	why := GaveUpBudget
	if attempts >= r.rs.p.MaxAttempts {
		why = GaveUpAttempts
	}
	r.givenUp.Add(1)
	r.gup.write(GaveUp{Op: o.kind, Conv: o.conv, ClientMessageID: o.cmid, Sender: d.user, Attempts: attempts, Why: why, Probe: o.probe, Dup: o.dup, Sent: sent})
	if o.done != nil {
		o.done(&frame{Op: "given_up"})
	}
	r.track(-1)
}

// abandonPending gives up, once the devices stopped, every command whose
// re-send was refused and whose late answer never came.
func (r *runner) abandonPending() {
	for _, ds := range r.devices {
		for _, d := range ds {
			var left []*op
			d.mu.Lock()
			for _, o := range d.pending {
				if o.gaveUp && !o.finished {
					o.finished = true
					left = append(left, o)
				}
			}
			d.mu.Unlock()
			for _, o := range left {
				r.abandon(d, o)
			}
		}
	}
}

// answer handles the answer to o's latest attempt.
func (r *runner) answer(d *device, o *op, f *frame, now time.Time) {
	switch {
	case f.Op == "synced":
		o.done(f)
		return
	case f.Op == "accepted":
		a := Accepted{Op: o.kind, Conv: f.ConversationID, Seq: f.Seq, MessageID: f.MessageID, ClientMessageID: f.ClientMessageID,
			Sender: d.user, UserID: o.target, Device: d.name, Sent: o.sent.UnixNano(), At: now.UnixNano(), Attempts: o.attempts, Dup: o.dup, Probe: o.probe}
		if o.kind == "send" {
			a.Due = o.due.UnixNano()
			switch {
			case o.dup:
				r.dups.Add(1)
			case !o.probe:
				r.accepted.Add(1)
				r.accLat.record(now.Sub(o.due))
			}
		}
		r.acc.writeAccepted(&a)
	case retryable(f):
		r.resend(r.dctx, d, o, f.Code, time.Duration(f.RetryAfterMS)*time.Millisecond)
		return
	case o.kind == "sync" && f.Code == "bad_request":
		r.delivery.CompareAndSwap(0, 2)
	case o.kind == "create" && f.Code == "conflict" && o.attempts > 1:
		// an earlier attempt of this create did create it
	default:
		r.bump(r.rejects, f.Code)
		r.rej.write(Rejected{Op: o.kind, Conv: o.conv, ClientMessageID: o.cmid, Sender: d.user, Code: f.Code, Message: f.Message, Probe: o.probe})
	}
	if o.done != nil {
		o.done(f)
	}
	r.track(-1)
}

// syncDone handles a sync's answer: `synced` with more syncs again from
// the returned cursors; a bad_request means the stack does not serve
// delivery yet.
func (r *runner) syncDone(ctx context.Context, d *device) func(f *frame) {
	var done func(f *frame)
	done = func(f *frame) {
		if f.Op == "synced" {
			r.delivery.CompareAndSwap(0, 1)
			if f.More {
				r.retryAfter(ctx, d, &op{kind: "sync", cursors: f.Cursors, done: done}, 0)
				return // still in flight
			}
		}
		if f.Op == "synced" {
			r.track(-1)
		}
	}
	return done
}

// delivered records an event a device got.
func (r *runner) delivered(d *device, f *frame, now time.Time) {
	r.deliveries.Add(1)
	r.del.writeDelivered(&Delivered{Device: d.name, Conv: f.ConversationID, Seq: f.Seq, Kind: f.Kind, MessageID: f.MessageID, Sender: f.Sender, At: now.UnixNano()})
	if f.Kind == "message" {
		if due, ok := bodyDue(f.Body); ok {
			r.delLat.record(now.Sub(due))
		}
	}
}
