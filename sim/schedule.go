package sim

import (
	"fmt"

	"github.com/chatpipe/chatpipe/lease"
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
	catDevice                     // a device syncs from the sink
	catRestart                    // a crashed worker starts again
	catPause                      // fault: freeze a worker longer than its lease
	catCrash                      // fault: kill a worker
	catDrop                       // fault: lose a message
	catLostCommit                 // fault: a commit succeeds but its reply is lost
	numCategories
)

var categoryNames = [numCategories]string{"writer", "deliver", "issue", "retry", "persist", "clock", "manage",
	"coordinate", "gateway", "lifecycle", "device", "restart", "pause", "crash", "drop", "lost-commit"}

// weights of the categories in a random schedule.
var weights = [numCategories]int{10, 8, 4, 3, 3, 3, 3, 2, 2, 2, 2, 2, 1, 1, 1, 1}

func (c category) fault() bool { return c >= catPause }

// action is one thing the world can do now.
type action struct {
	name string
	do   func()
}

// actions lists what category c can do now, in a fixed order.
func (w *World) actions(c category) []action {
	var out []action
	add := func(name string, do func()) { out = append(out, action{name, do}) }
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
						add(fmt.Sprintf("%s %s (phase %s)", wr, s, wr.phase), func() { wr.do(w, s, false) })
					} else if s == stCommit || s == stMarker {
						add(fmt.Sprintf("%s %s, reply LOST", wr, s), func() { wr.do(w, s, true) })
					}
				}
			}
		}
	case catDeliver, catDrop:
		for _, m := range w.net.inflight {
			m := m
			if c == catDrop {
				add("DROP "+m.String(), func() { w.net.remove(m); w.stats.DroppedMessages++ })
				continue
			}
			if m.to != "" && w.worker(m.to).paused(w.now) {
				continue // sits in the frozen process's socket buffer
			}
			add("deliver "+m.String(), func() { w.deliver(m) })
		}
	case catIssue:
		if len(w.ops) < w.cfg.MaxOps {
			add("issue", w.issueRandom)
		}
	case catRetry:
		for _, o := range w.ops {
			if w.needsRetry(o) {
				o := o
				add(fmt.Sprintf("retry op%d", o.id), func() { w.retry(o) })
			}
		}
	case catPersist:
		for p := 0; p < w.log.Partitions(); p++ {
			if part := int32(p); w.sink.Pending(w.log, part) {
				add(fmt.Sprintf("persist p%d", p), func() { w.sink.Poll(w.log, part, w.cfg.PersistBatch) })
			}
		}
	case catClock:
		add("clock", func() { w.advance(int64(1 + w.ch.Choose(3, "ticks"))) })
	case catManage:
		for _, wk := range w.workers {
			if wk.running(w.now) && wk.registered && !wk.leaseLost {
				if stop, start := w.manageChanges(wk); len(stop)+len(start) > 0 {
					wk := wk
					add(fmt.Sprintf("manage %s stop %v start %v", wk.id, stop, start), func() { w.manage(wk) })
				}
			}
		}
	case catCoordinate:
		if w.planWouldMove() {
			add("coordinate", w.coordinate)
		}
	case catGateway:
		if w.gwRev != w.owners.Rev() {
			add("gateway refresh", w.refreshGateway)
		}
	case catLifecycle:
		for _, wk := range w.workers {
			wk := wk
			switch {
			case !wk.running(w.now):
			case wk.registered && wk.leaseLost:
				add(fmt.Sprintf("%s lease lost: stop writers", wk.id), func() { w.noticeLost(wk) })
			case wk.canRegister():
				add(fmt.Sprintf("%s register", wk.id), func() { w.register(wk) })
			}
		}
	case catDevice:
		for _, d := range w.devices {
			if d.behind(w.sink, w.convs) {
				d := d
				add(fmt.Sprintf("device %s/%d sync", d.user, d.n), func() { d.sync(w.sink, w.convs) })
			}
		}
	case catRestart:
		for _, wk := range w.workers {
			if !wk.alive {
				wk := wk
				add(fmt.Sprintf("%s restart", wk.id), func() { w.restart(wk) })
			}
		}
	case catPause:
		for _, wk := range w.workers {
			if wk.running(w.now) {
				wk := wk
				add(fmt.Sprintf("PAUSE %s", wk.id), func() { w.pause(wk, int64(w.ch.Choose(int(w.cfg.LeaseTTL), "pause extra"))) })
			}
		}
	case catCrash:
		for _, wk := range w.workers {
			if wk.alive {
				wk := wk
				add(fmt.Sprintf("CRASH %s", wk.id), func() { w.crash(wk) })
			}
		}
	}
	return out
}

func (w *World) planWouldMove() bool {
	return len(lease.Plan(w.owners.View(), w.cfg.VShards)) > 0
}

// randomStep lets the chooser pick a category (by weight, among those with
// something to do) and then one of its actions.
func (w *World) randomStep() {
	var lists [numCategories][]action
	total := 0
	for c := category(0); c < numCategories; c++ {
		if c.fault() && w.faults >= w.cfg.MaxFaults {
			continue
		}
		lists[c] = w.actions(c)
		if len(lists[c]) > 0 {
			total += weights[c]
		}
	}
	r := w.ch.Choose(total, "category")
	for c := category(0); c < numCategories; c++ {
		if len(lists[c]) == 0 {
			continue
		}
		if r >= weights[c] {
			r -= weights[c]
			continue
		}
		a := lists[c][w.ch.Choose(len(lists[c]), categoryNames[c])]
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
	w.tracef("%4d t=%-3d %s", w.step, w.now, a.name)
	a.do()
}
