package sim

// worker is the model of a shardworker process: one lease, the writers of
// the vshards its owner rows name, and the ways a process goes wrong
// (paused longer than its lease, crashed, restarted with a new gen).
type worker struct {
	id          string
	alive       bool
	registered  bool  // holds a registration (gen) whose loss it has not acted on
	gen         int64 // gen of the current registration
	leaseLost   bool  // the keep-alive learnt the lease is gone
	pausedUntil int64 // the process is frozen while now < pausedUntil

	writers map[int]*writer // w.shards: the writers routed to
	loader  loader          // the writers' batch loads (loader.go)
	retired []*writer       // stopped writers still finishing their batch in hand
	// routes is the owner store's overrides as this worker last read
	// them (routesRev: the revision read; routeRevs: each one's).
	routes    map[string]int
	routesRev int64
	routeRevs map[string]int64
}

func (wk *worker) paused(now int64) bool { return now < wk.pausedUntil }

// running reports whether the process can act now.
func (wk *worker) running(now int64) bool { return wk.alive && !wk.paused(now) }

// active lists the writers that have not ended, routed ones first (by
// vshard), then stopped ones.
func (wk *worker) active() []*writer {
	var out []*writer
	for _, v := range sortedKeys(wk.writers) {
		if wr := wk.writers[v]; !wr.ended() {
			out = append(out, wr)
		}
	}
	for _, wr := range wk.retired {
		if !wr.ended() {
			out = append(out, wr)
		}
	}
	return out
}

// prune forgets stopped writers that ended.
func (wk *worker) prune() {
	kept := wk.retired[:0]
	for _, wr := range wk.retired {
		if !wr.ended() {
			kept = append(kept, wr)
		}
	}
	wk.retired = kept
}

// canRegister: a fresh process, or one whose writers all stopped after its
// lease was lost (stopAll waits for them).
func (wk *worker) canRegister() bool {
	return wk.alive && !wk.registered && len(wk.active()) == 0
}

func (w *World) register(wk *worker) {
	wk.gen = w.owners.Register(wk.id, w.now)
	wk.registered, wk.leaseLost = true, false
	wk.writers = map[int]*writer{}
	wk.retired = nil
}

// noticeLost is manage returning on reg.Lost(): every writer is stopped.
func (w *World) noticeLost(wk *worker) {
	for _, v := range sortedKeys(wk.writers) {
		wr := wk.writers[v]
		wr.stop(w)
		wk.retired = append(wk.retired, wr)
	}
	wk.writers = map[int]*writer{}
	wk.registered = false
}

// manageChanges is what worker.manage would do with the owner rows now.
func (w *World) manageChanges(wk *worker) (stop []int, start []int) {
	for v := 0; v < w.layout().AllVShards(); v++ {
		row, ok := w.owners.rows[v]
		mine := ok && row.Worker == wk.id && row.Gen == wk.gen
		cur := wk.writers[v]
		if cur != nil && (!mine || cur.epoch != row.Epoch) {
			stop = append(stop, v)
			cur = nil
		}
		if mine && cur == nil {
			start = append(start, v)
		}
	}
	return stop, start
}

// manage starts and stops writers as the owner rows say, and reads the
// overrides.
func (w *World) manage(wk *worker) {
	stop, start := w.manageChanges(wk)
	for _, v := range stop {
		wr := wk.writers[v]
		wr.stop(w)
		wk.retired = append(wk.retired, wr)
		delete(wk.writers, v)
	}
	started := map[int]bool{}
	for _, v := range start {
		wk.writers[v] = newWriter(w, wk, v, w.owners.rows[v].Epoch)
		started[v] = true
	}
	w.feedRoutes(wk, started)
	wk.prune()
}

// handle is worker.handle: route a request to the writer of its vshard.
func (wk *worker) handle(w *World, att *attempt) {
	v := w.routeOf(wk.routes, att.op.cmd.ConversationID)
	wr := wk.writers[v]
	if wr == nil || wr.ended() {
		w.reply(att, unavailable(att, "vshard %d is not owned by %s", v, wk.id), false)
		return
	}
	wr.enqueue(w, att)
}

// crash kills the process: its writers vanish mid-step (an open
// transaction stays open in the log until fenced or timed out), its lease
// stays until it expires.
func (w *World) crash(wk *worker) {
	for _, wr := range wk.active() {
		if wr.inFlight() {
			w.stats.CrashesInFlight++
		}
	}
	wk.alive, wk.registered, wk.leaseLost = false, false, false
	wk.writers, wk.retired = map[int]*writer{}, nil
	wk.loader = loader{}
	wk.pausedUntil = 0
	w.stats.Crashes++
}

// restart starts a new process with the same id; it registers with a new gen.
func (w *World) restart(wk *worker) {
	wk.alive = true
}

// pause freezes the process for longer than its lease.
func (w *World) pause(wk *worker, extra int64) {
	wk.pausedUntil = w.now + w.cfg.LeaseTTL + 1 + extra
	for _, wr := range wk.active() {
		if wr.inFlight() {
			w.stats.PausesInFlight++
		}
	}
	w.stats.Pauses++
}
