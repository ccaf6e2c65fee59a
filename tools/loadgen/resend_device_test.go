package loadgen

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"
)

func testRunner(t *testing.T, p ResendPolicy) *runner {
	t.Helper()
	dir := t.TempDir()
	r := &runner{cfg: Config{Timeout: 10 * time.Second}, dir: dir, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		accLat: newLatency(), delLat: newLatency(), rejects: map[string]int64{}, retries: map[string]int64{}, refused: map[string]int64{},
		rs: newResender(p, func(n int64) int64 { return n - 1 }), dctx: context.Background()}
	for _, s := range []struct {
		p    **stream
		name string
	}{{&r.acc, AcceptedFile}, {&r.del, DeliveredFile}, {&r.rej, RejectedFile}, {&r.gup, GaveUpFile}} {
		var err error
		if *s.p, err = openStream(filepath.Join(dir, s.name)); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, s := range []*stream{r.acc, r.del, r.rej, r.gup} {
			s.close()
		}
	})
	return r
}

// pendingSend puts a send on d as if its first attempt r1 was written at t0.
func pendingSend(r *runner, d *device, t0 time.Time) *op {
	o := &op{kind: "send", conv: "c1", cmid: "m1", due: t0, sent: t0, sentAttempt: t0, attempts: 1, reqID: "r1"}
	r.track(1)
	r.rs.first()
	d.pending["r1"] = o
	return o
}

func TestALateAnswerCancelsTheWaitingResend(t *testing.T) {
	r := testRunner(t, ResendPolicy{Base: time.Hour, Cap: time.Hour})
	d := newDevice(r, "u", 0)
	t0 := time.Now()
	o := pendingSend(r, d, t0)
	d.sweep(context.Background(), t0.Add(5*time.Second))
	if o.waiting || r.retries["timeout"] != 0 {
		t.Fatal("swept before the timeout")
	}
	d.sweep(context.Background(), t0.Add(11*time.Second))
	if !o.waiting || r.retries["timeout"] != 1 {
		t.Fatalf("not re-sent after the timeout: waiting %v retries %v", o.waiting, r.retries)
	}
	d.sweep(context.Background(), t0.Add(30*time.Second))
	if r.retries["timeout"] != 1 {
		t.Fatal("a waiting command was scheduled twice")
	}
	// A rate_limited answer to the late attempt: its re-send is already scheduled.
	d.pending["r1"] = o
	d.dispatch([]byte(`{"op":"rejected","id":"r1","code":"rate_limited","retry_after_ms":5}`), time.Now())
	if o.finished || r.inflight.Load() != 1 || r.retries["rate_limited"] != 0 {
		t.Fatalf("rate_limited late answer: finished %v inflight %d retries %v", o.finished, r.inflight.Load(), r.retries)
	}
	// The late final answer counts and the scheduled re-send is skipped.
	d.pending["r1"] = o
	d.dispatch([]byte(`{"op":"accepted","id":"r1","conversation_id":"c1","seq":5,"message_id":"M","client_message_id":"m1"}`), time.Now())
	if !o.finished || r.inflight.Load() != 0 || r.accepted.Load() != 1 {
		t.Fatalf("late accepted: finished %v inflight %d accepted %d", o.finished, r.inflight.Load(), r.accepted.Load())
	}
	if err := d.write(context.Background(), nil, o); err != nil || o.attempts != 1 {
		t.Fatalf("the skipped re-send wrote: %v, %d attempts", err, o.attempts)
	}
}

func TestARefusedResendWaitsForALateAnswerThenGivesUp(t *testing.T) {
	r := testRunner(t, ResendPolicy{Budget: -1})
	d := newDevice(r, "u", 0)
	t0 := time.Now()
	o := pendingSend(r, d, t0)
	d.sweep(context.Background(), t0.Add(11*time.Second))
	if !o.gaveUp || o.finished || r.refused[GaveUpBudget] != 1 || r.givenUp.Load() != 0 || d.pending["r1"] != o {
		t.Fatalf("refused: gaveUp %v finished %v refused %v given up %d", o.gaveUp, o.finished, r.refused, r.givenUp.Load())
	}
	// The server sheds it: no re-send is allowed, so it is given up.
	d.dispatch([]byte(`{"op":"rejected","id":"r1","code":"unavailable","retry_after_ms":100}`), time.Now())
	if !o.finished || r.givenUp.Load() != 1 || r.inflight.Load() != 0 {
		t.Fatalf("after unavailable: finished %v given up %d inflight %d", o.finished, r.givenUp.Load(), r.inflight.Load())
	}
	// Another one is still pending when the run ends.
	o2 := pendingSend(r, d, t0)
	o2.reqID = "r2"
	delete(d.pending, "r1")
	d.pending["r2"] = o2
	d.sweep(context.Background(), t0.Add(11*time.Second))
	r.devices = map[string][]*device{"u": {d}}
	r.abandonPending()
	if r.givenUp.Load() != 2 || r.inflight.Load() != 0 || len(d.pending) != 0 {
		t.Fatalf("at the end: given up %d inflight %d pending %d", r.givenUp.Load(), r.inflight.Load(), len(d.pending))
	}
	r.gup.close()
	gs, err := readLines[GaveUp](filepath.Join(r.dir, GaveUpFile))
	if err != nil || len(gs) != 2 || gs[0].Why != GaveUpBudget || gs[0].ClientMessageID != "m1" {
		t.Fatalf("gaveup.jsonl: %+v %v", gs, err)
	}
}
