package sim

import (
	"fmt"
	"strings"

	"github.com/chatpipe/chatpipe/shardcore"
)

// drainOrder is the fixed policy of the drain: the first category with
// something to do acts; the clock advances only when nothing else can.
var drainOrder = []category{catDeliver, catWriter, catLifecycle, catManage, catCoordinate, catGateway, catRetry, catPersist, catDevice}

// drain ends a schedule: every paused worker resumes (and may try to commit
// what it held), every crashed one restarts, no more faults happen, and the
// world runs until every op has its answer, the sink has every committed
// record and every device is synced. Not getting there is a liveness
// violation.
func (w *World) drain() {
	w.tracef("---- drain: heal every fault, run to quiescence")
	w.pgDownUntil, w.etcdDownUntil = min(w.pgDownUntil, w.now), min(w.etcdDownUntil, w.now)
	for _, wk := range w.workers {
		wk.pausedUntil = min(wk.pausedUntil, w.now)
		if !wk.alive {
			w.restart(wk)
		}
	}
	for i := 0; i < w.cfg.DrainSteps; i++ {
		if a, ok := w.firstAction(); ok {
			w.run(a)
			continue
		}
		if w.quiescent() {
			return
		}
		w.run(action{format: "clock +1", do: func() { w.advance(1) }})
	}
	w.violate(PropLiveness, "not quiescent after %d drain steps: %s", w.cfg.DrainSteps, w.pending())
}

func (w *World) firstAction() (action, bool) {
	for _, c := range drainOrder {
		if as := w.actions(c); len(as) > 0 {
			return as[0], true
		}
	}
	return action{}, false
}

func (w *World) quiescent() bool {
	return w.pending() == ""
}

// pending describes what keeps the world from being quiescent ("" when
// nothing does).
func (w *World) pending() string {
	var b strings.Builder
	for _, o := range w.ops {
		if !o.done {
			fmt.Fprintf(&b, "op%d (%s %s by %s) unanswered after %d attempts; ", o.id, o.cmd.Op, o.cmd.ConversationID, o.cmd.Sender, len(o.attempts))
		}
	}
	if n := len(w.net.inflight); n > 0 {
		fmt.Fprintf(&b, "%d messages in flight; ", n)
	}
	for p := 0; p < w.log.Partitions(); p++ {
		part := int32(p)
		if lso, end := w.log.StableOffset(part), w.log.End(part); lso < end {
			fmt.Fprintf(&b, "p%d has an open transaction at %d; ", p, lso)
		}
		if w.sink.Pending(w.log, part) {
			fmt.Fprintf(&b, "p%d not persisted; ", p)
		}
	}
	for _, c := range sortedKeys(w.routes) {
		if at := w.locatedAt(c); at != w.routes[c] {
			fmt.Fprintf(&b, "%s is at v%d, routed to v%d; ", c, at, w.routes[c])
		}
	}
	for _, d := range w.devices {
		if d.behind(w.sink, w.convs) {
			fmt.Fprintf(&b, "device %s/%d behind; ", d.user, d.n)
		}
	}
	for _, wk := range w.workers {
		for _, wr := range wk.active() {
			if wr.phase() != shardcore.PhaseAccepting || wr.m.Queued() > 0 {
				fmt.Fprintf(&b, "writer %s in %s with %d queued; ", wr, wr.phase(), wr.m.Queued())
			}
		}
	}
	return b.String()
}
