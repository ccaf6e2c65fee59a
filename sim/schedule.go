package sim

import (
	"fmt"
	"slices"

	"github.com/chatpipe/chatpipe/internal/ownership"
)

// category groups the actions a schedule can take at a step.
type category int

const (
	catWriter     category = iota // a writer's next step
	catDeliver                    // deliver a message in flight (any order: delays)
	catIssue                      // a client issues a new op
	catRetry                      // a client retries an op with the same ids
	catPersist                    // one sink transaction on a partition
	catClock                      // the clock advances
	catManage                     // a worker applies the owner rows
	catCoordinate                 // the coordinator plans and moves vshards
	catGateway                    // the gateway's view catches up
	catLifecycle                  // a worker acts on its lost lease, or registers
	catDevice                     // a device syncs from the read model and the sink
	catIsolate                    // the operator isolates a conversation or releases it
	catLoad                       // a worker's loader makes a round trip for the loads queued
	catProject                    // one projection transaction on one or more partitions
	catProjLag                    // a partition's projection stops polling for a few ticks
	catRestart                    // a crashed worker starts again
	catPause                      // fault: freeze a worker longer than its lease
	catCrash                      // fault: kill a worker
	catDrop                       // fault: lose a message
	catLostCommit                 // fault: a commit succeeds but its reply is lost
	catOutage                     // fault: Postgres or etcd stops answering for a while
	numCategories
)

var categoryNames = [numCategories]string{"writer", "deliver", "issue", "retry", "persist", "clock", "manage",
	"coordinate", "gateway", "lifecycle", "device", "isolate", "load", "project", "project-lag", "restart", "pause", "crash", "drop", "lost-commit", "outage"}

// weights of the categories in a random schedule.
var weights = [numCategories]int{10, 8, 4, 3, 3, 3, 3, 2, 2, 2, 2, 1, 3, 3, 2, 2, 1, 1, 1, 1, 1}

func (c category) fault() bool { return c >= catPause }

// action is one thing the world can do now. Its name is formatted only
// when it runs (or a script looks for it).
type action struct {
	format string
	args   []any
	do     func()
}

func (a action) name() string { return fmt.Sprintf(a.format, a.args...) }

// actions lists what category c can do now, in a fixed order.
func (w *World) actions(c category) []action {
	var out []action
	add := func(do func(), format string, args ...any) { out = append(out, action{format, args, do}) }
	switch c {
	case catWriter, catLostCommit:
		for _, wk := range w.workers {
			if !wk.running(w.now) {
				continue
			}
			for _, wr := range wk.active() {
				for _, s := range wr.steps(w) {
					wr, s := wr, s
					if c == catWriter {
						add(func() { wr.do(w, s, false) }, "%s %s (phase %s)", wr, wr.stepName(s), wr.phase())
					} else if wr.committing(s) {
						add(func() { wr.do(w, s, true) }, "%s %s, reply LOST", wr, wr.stepName(s))
					}
				}
			}
		}
	case catDeliver, catDrop:
		for _, m := range w.net.inflight {
			m := m
			if c == catDrop {
				add(func() { w.net.remove(m); w.stats.DroppedMessages++ }, "DROP %s", m)
				continue
			}
			if m.to != "" && w.worker(m.to).paused(w.now) {
				continue // sits in the frozen process's socket buffer
			}
			add(func() { w.deliver(m) }, "deliver %s", m)
		}
	case catIssue:
		if len(w.ops) < w.cfg.MaxOps {
			add(w.issueRandom, "issue")
		}
	case catRetry:
		for _, o := range w.ops {
			if w.needsRetry(o) {
				o := o
				add(func() { w.retry(o) }, "retry op%d", o.id)
			}
		}
	case catPersist:
		for p := 0; p < w.log.Partitions(); p++ {
			if part := int32(p); w.sink.Pending(w.log, part) && !w.pgDown() {
				add(func() { w.sink.Poll(w.log, part, w.cfg.PersistBatch, w.step) }, "persist p%d", p)
			}
		}
	case catClock:
		add(func() { w.advance(int64(1 + w.ch.Choose(3, "ticks"))) }, "clock")
	case catManage:
		for _, wk := range w.workers {
			if wk.running(w.now) && wk.registered && !wk.leaseLost {
				if stop, start := w.manageChanges(wk); len(stop)+len(start) > 0 || wk.routesRev != w.routesRev {
					wk := wk
					add(func() { w.manage(wk) }, "manage %s stop %v start %v", wk.id, stop, start)
				}
			}
		}
	case catCoordinate:
		if w.planWouldMove() {
			add(w.coordinate, "coordinate")
		}
	case catGateway:
		if w.gwRev != w.owners.Rev() || w.gwRoutesRev != w.routesRev {
			add(w.refreshGateway, "gateway refresh")
		}
	case catLifecycle:
		for _, wk := range w.workers {
			wk := wk
			switch {
			case !wk.running(w.now):
			case wk.registered && wk.leaseLost:
				add(func() { w.noticeLost(wk) }, "%s lease lost: stop writers", wk.id)
			case wk.canRegister():
				add(func() { w.register(wk) }, "%s register", wk.id)
			}
		}
	case catDevice:
		for _, d := range w.devices {
			if d.behind(w.proj, w.convs) {
				d := d
				add(func() { d.sync(w.proj, w.sink, w.convs) }, "device %s/%d sync", d.user, d.n)
			}
		}
	case catLoad:
		for _, wk := range w.workers {
			if wk.running(w.now) && len(wk.loader.queue) > 0 {
				wk := wk
				add(func() { w.loadTrip(wk) }, "%s load (%d loads)", wk.id, len(wk.loader.queue))
			}
		}
	case catProject:
		if w.pgDown() {
			break
		}
		var pending []int32
		for p := 0; p < w.log.Partitions(); p++ {
			if part := int32(p); w.proj.Pending(w.sink, part) && !w.proj.lagging(part, w.now) {
				pending = append(pending, part)
				add(func() { w.project([]int32{part}) }, "project p%d", p)
			}
		}
		if len(pending) > 1 {
			// A consumer that owns several partitions: one batch holds
			// their records one partition after the other, the newest
			// partition's first or last.
			rev := slices.Clone(pending)
			slices.Reverse(rev)
			add(func() { w.project(pending) }, "project %v", pending)
			add(func() { w.project(rev) }, "project %v", rev)
		}
	case catIsolate:
		w.operatorActions(add)
	case catProjLag:
		for p := 0; p < w.log.Partitions(); p++ {
			if part := int32(p); !w.proj.lagging(part, w.now) {
				add(func() { w.proj.lagUntil[part] = w.now + 1 + int64(w.ch.Choose(10, "lag ticks")) }, "projection p%d lags", p)
			}
		}
	case catRestart:
		for _, wk := range w.workers {
			if !wk.alive {
				wk := wk
				add(func() { w.restart(wk) }, "%s restart", wk.id)
			}
		}
	case catPause:
		for _, wk := range w.workers {
			if wk.running(w.now) {
				wk := wk
				add(func() { w.pause(wk, int64(w.ch.Choose(int(w.cfg.LeaseTTL), "pause extra"))) }, "PAUSE %s", wk.id)
			}
		}
	case catOutage:
		add(func() { w.outage(&w.pgDownUntil) }, "OUTAGE postgres")
		add(func() { w.outage(&w.etcdDownUntil) }, "OUTAGE etcd")
	case catCrash:
		for _, wk := range w.workers {
			if wk.alive {
				wk := wk
				add(func() { w.crash(wk) }, "CRASH %s", wk.id)
			}
		}
	}
	return out
}

// planWouldMove reports whether the coordinator would move a vshard now.
// ownership.Plan reads only the owner store's view, which changes only
// with its revision: the answer is kept for the revision it was made at.
func (w *World) planWouldMove() bool {
	if rev := w.owners.Rev(); !w.planKnown || w.planRev != rev {
		w.planKnown, w.planRev = true, rev
		w.planMoves = len(ownership.Plan(w.owners.View(), w.layout().AllVShards())) > 0
	}
	return w.planMoves
}

// available reports whether category c has an action now: whether
// actions(c) is not empty, found without building the list for the
// categories that are asked most and have the longest lists.
func (w *World) available(c category) bool {
	switch c {
	case catWriter, catLostCommit:
		for _, wk := range w.workers {
			if !wk.running(w.now) {
				continue
			}
			for _, wr := range wk.writers {
				if wr.available(w, c) {
					return true
				}
			}
			for _, wr := range wk.retired {
				if wr.available(w, c) {
					return true
				}
			}
		}
		return false
	case catDeliver:
		for _, m := range w.net.inflight {
			if m.to == "" || !w.worker(m.to).paused(w.now) {
				return true
			}
		}
		return false
	case catDrop:
		return len(w.net.inflight) > 0
	case catRetry:
		for _, o := range w.ops {
			if w.needsRetry(o) {
				return true
			}
		}
		return false
	case catDevice:
		for _, d := range w.devices {
			if d.behind(w.proj, w.convs) {
				return true
			}
		}
		return false
	case catIsolate:
		// every conversation can be isolated into a dedicated vshard it
		// is not routed to, or released from the one it is
		return w.cfg.Dedicated > 0 && len(w.convs) > 0
	}
	return len(w.actions(c)) > 0
}

// randomStep lets the chooser pick a category (by weight, among those with
// something to do) and then one of its actions.
func (w *World) randomStep() {
	var avail [numCategories]bool
	total := 0
	for c := category(0); c < numCategories; c++ {
		if c.fault() && w.faults >= w.cfg.MaxFaults {
			continue
		}
		if avail[c] = w.available(c); avail[c] {
			total += weights[c]
		}
	}
	r := w.ch.Choose(total, "category")
	for c := category(0); c < numCategories; c++ {
		if !avail[c] {
			continue
		}
		if r >= weights[c] {
			r -= weights[c]
			continue
		}
		list := w.actions(c)
		a := list[w.ch.Choose(len(list), categoryNames[c])]
		if c.fault() {
			w.faults++
		}
		w.run(a)
		return
	}
}

// run executes an action as the next step.
func (w *World) run(a action) {
	w.step++
	if !w.cfg.Untraced {
		w.tracef("%4d t=%-3d %s", w.step, w.now, a.name())
	}
	a.do()
}
