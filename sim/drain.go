package sim

import (
	"fmt"
	"strings"

	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/logrecord"
)

// drainOrder is the fixed policy of the drain: the first category with
// something to do acts. When none has, the read model's side acts
// (lateOrder: a projection batch or a device sync, either chosen by the
// chooser) or the clock advances — the chooser picks which while the rest
// of the world still waits for the clock, so the projection's partitions
// lag one another and the writers in the drain as they do before it.
var (
	drainOrder = []category{catDeliver, catWriter, catLoad, catLifecycle, catManage, catCoordinate, catGateway, catRetry, catPersist}
	lateOrder  = []category{catProject, catDevice}
)

// drain ends a schedule: every paused worker resumes (and may try to commit
// what it held), every crashed one restarts, no more faults happen, and the
// world runs until every op has its answer, the sink and the read model
// have every committed record and every device is synced. Not getting
// there is a liveness violation.
func (w *World) drain() {
	w.tracef("---- drain: heal every fault, run to quiescence")
	w.pgDownUntil, w.etcdDownUntil = min(w.pgDownUntil, w.now), min(w.etcdDownUntil, w.now)
	clear(w.proj.lagUntil)
	for _, wk := range w.workers {
		wk.pausedUntil = min(wk.pausedUntil, w.now)
		if !wk.alive {
			w.restart(wk)
		}
	}
	for i := 0; i < w.cfg.DrainSteps; i++ {
		if a, ok := w.firstAction(drainOrder); ok {
			w.run(a)
			continue
		}
		var late []action
		for _, c := range lateOrder {
			late = append(late, w.actions(c)...)
		}
		if len(late) > 0 && (w.writesPending() == "" || w.ch.Choose(2, "drain: read model or clock") == 0) {
			w.run(late[w.ch.Choose(len(late), "drain: read model")])
			continue
		}
		if w.quiescent() {
			return
		}
		w.run(action{format: "clock +1", do: func() { w.advance(1) }})
	}
	w.violate(PropLiveness, "not quiescent after %d drain steps: %s", w.cfg.DrainSteps, w.pending())
}

// firstAction is the first action of the first category in order that
// has one.
func (w *World) firstAction(order []category) (action, bool) {
	for _, c := range order {
		if w.available(c) {
			return w.actions(c)[0], true
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
	b.WriteString(w.writesPending())
	for p := 0; p < w.log.Partitions(); p++ {
		if part := int32(p); w.proj.Pending(w.sink, part) {
			fmt.Fprintf(&b, "p%d not projected; ", p)
		}
	}
	for _, d := range w.devices {
		if d.behind(w.proj, w.convs) {
			fmt.Fprintf(&b, "device %s/%d behind; ", d.user, d.n)
		}
	}
	return b.String()
}

// writesPending is pending without the read model's side (the projection
// and the devices).
func (w *World) writesPending() string {
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
	for _, c := range w.convs {
		if at, to := w.locatedAt(c), w.routeOf(w.routes, c); at != to {
			fmt.Fprintf(&b, "%s is at v%d, routed to v%d; ", c, at, to)
		} else if _, ok := w.routes[c]; ok && to == logrecord.VShard(c, w.cfg.VShards) && !w.cfg.Bugs.ReleaseFromSink {
			fmt.Fprintf(&b, "%s is home at v%d, its override not released; ", c, at)
		}
	}
	for _, wk := range w.workers {
		if n := len(wk.loader.queue); n > 0 {
			fmt.Fprintf(&b, "%s has %d loads queued; ", wk.id, n)
		}
		for _, wr := range wk.active() {
			if wr.phase() != shardcore.PhaseAccepting || wr.m.Queued() > 0 {
				fmt.Fprintf(&b, "writer %s in %s with %d queued; ", wr, wr.phase(), wr.m.Queued())
			}
		}
	}
	return b.String()
}
