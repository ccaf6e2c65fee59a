package loadgen

import (
	"fmt"
	"testing"
	"time"
)

func pushed(d *device, conv string, seq int64, kind, userID string) {
	d.dispatch([]byte(fmt.Sprintf(`{"op":"event","conversation_id":%q,"seq":%d,"kind":%q,"user_id":%q,"message_id":"M%d","sender":"s"}`, conv, seq, kind, userID, seq)), time.Now())
}

// The overload run's device-not-converged: a device missed events 72–97
// of a conversation (its connection closed and the sync after the
// reconnect was given up), then was pushed 98–168 live. Its sync must
// start from 71, not from the highest seq pushed, or the gap is never
// filled.
func TestASyncStartsBeforeTheFirstGap(t *testing.T) {
	r := testRunner(t, ResendPolicy{})
	d := newDevice(r, "u", 0)
	pushed(d, "c", 1, "create", "")
	for s := int64(2); s <= 168; s++ {
		if s < 72 || s > 97 {
			pushed(d, "c", s, "message", "")
		}
	}
	if got := d.cursorCopy()["c"]; got != 71 {
		t.Fatalf("cursor %d, want 71 (the gap 72–97 unfilled)", got)
	}
	// The sync's events fill it, then its reply covers the rest.
	for s := int64(72); s <= 90; s++ {
		pushed(d, "c", s, "message", "")
	}
	if got := d.cursorCopy()["c"]; got != 90 {
		t.Fatalf("cursor %d with 91–97 still missing, want 90", got)
	}
	d.dispatch([]byte(`{"op":"synced","id":"x","cursors":{"c":170}}`), time.Now())
	if got := d.cursorCopy()["c"]; got != 170 {
		t.Fatalf("after synced: cursor %d, want 170", got)
	}
	// Out of order pushes close a gap when the missing one arrives.
	pushed(d, "c", 172, "message", "")
	pushed(d, "c", 171, "message", "")
	if got := d.cursorCopy()["c"]; got != 172 {
		t.Fatalf("cursor %d, want 172", got)
	}
}

// A removed user sees nothing of the conversation until they are added
// back: that gap is not one to sync, and neither is the start of a
// conversation they joined late.
func TestMembershipGapsAreNotSyncGaps(t *testing.T) {
	r := testRunner(t, ResendPolicy{})
	d := newDevice(r, "u", 0)
	for s := int64(1); s <= 159; s++ {
		kind, who := "message", ""
		switch s {
		case 1:
			kind = "create"
		case 159:
			kind, who = "leave", "u"
		}
		pushed(d, "c", s, kind, who)
	}
	pushed(d, "c", 250, "message", "") // pushed before the join that made it the user's
	pushed(d, "c", 249, "join", "u")
	if got := d.cursorCopy()["c"]; got != 250 {
		t.Fatalf("cursor %d, want 250", got)
	}
	pushed(d, "late", 40, "join", "u")
	pushed(d, "late", 41, "message", "")
	pushed(d, "late", 43, "message", "")
	if got := d.cursorCopy()["late"]; got != 41 {
		t.Fatalf("late joiner: cursor %d, want 41", got)
	}
	// Someone else's join does not end a removed user's gap.
	pushed(d, "k", 1, "create", "")
	pushed(d, "k", 2, "kick", "u")
	pushed(d, "k", 9, "join", "v")
	if got := d.cursorCopy()["k"]; got != 2 {
		t.Fatalf("kicked: cursor %d, want 2", got)
	}
}

// A sync is sent again even when the re-send budget is spent: given up,
// it would leave its device short of the events it missed.
func TestASyncIsNotGivenUpForTheBudget(t *testing.T) {
	r := testRunner(t, ResendPolicy{Budget: -1, Base: time.Hour, Cap: time.Hour})
	d := newDevice(r, "u", 0)
	t0 := time.Now()
	o := &op{kind: "sync", cursors: map[string]int64{}, sent: t0, sentAttempt: t0, attempts: 1, reqID: "r1", done: r.syncDone(r.dctx, d)}
	r.track(1)
	d.pending["r1"] = o
	d.sweep(r.dctx, t0.Add(11*time.Second))
	d.dispatch([]byte(`{"op":"rejected","id":"r1","code":"unavailable","retry_after_ms":100}`), time.Now())
	if o.gaveUp || r.givenUp.Load() != 0 || r.refused[GaveUpBudget] != 0 || r.retries["timeout"] != 1 || r.inflight.Load() != 1 {
		t.Fatalf("gaveUp %v given up %d refused %v retries %v inflight %d", o.gaveUp, r.givenUp.Load(), r.refused, r.retries, r.inflight.Load())
	}
}
