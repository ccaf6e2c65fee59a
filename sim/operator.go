package sim

import (
	"maps"

	"github.com/chatpipe/chatpipe/logrecord"
)

// The operator and the route feed: how a conversation's override gets
// into the owner store, and from there to the gateway and to each writer.
//
// The operator acts at any step (operatorActions): isolate moves a
// conversation into a dedicated vshard, release routes it back to its
// hashed vshard. Both write the override (setOverride): a released
// conversation keeps one, naming its hashed vshard. The gateway reads the
// overrides when its view refreshes, each worker when it manages
// (feedRoutes), each with a delay of its own; the writer that holds the
// conversation commits its moved record, the one it moves to waits for
// that record to be stored.
//
// A release that deletes the override once the conversation is home
// (`admin unisolate`'s last step) is not modelled yet. It would be a
// third action in operatorActions, deleting the entry of w.routes, and
// feedRoutes would tell each writer that may hold the conversation of the
// deletion (shardcore.Writer.Unroute) where it now tells of changes.

// operatorActions lists what the operator can do now: release an
// isolated conversation, or isolate one into a dedicated vshard it is
// not routed to.
func (w *World) operatorActions(add func(do func(), format string, args ...any)) {
	if w.cfg.Dedicated == 0 {
		return
	}
	for _, c := range w.convs {
		c := c
		home := logrecord.VShard(c, w.cfg.VShards)
		if at := w.routeOf(w.routes, c); at != home {
			add(func() { w.setOverride(c, home) }, "RELEASE %s (from v%d)", c, at)
		}
		for d := w.cfg.VShards; d < w.layout().AllVShards(); d++ {
			if d != w.routeOf(w.routes, c) {
				d := d
				add(func() { w.setOverride(c, d) }, "ISOLATE %s → v%d", c, d)
			}
		}
	}
}

// setOverride is the operator routing conv to vshard to (a dedicated
// one, or back to its hashed vshard): the override changes in the owner
// store, and the writers move the conversation.
func (w *World) setOverride(conv string, to int) {
	w.routes[conv] = to
	w.routesRev++
	w.stats.Isolations++
}

// feedRoutes is a worker reading the overrides now (shardworker's route
// watch): every writer hears of the ones that changed since the worker
// last read them, a writer started since of all of them (started).
func (w *World) feedRoutes(wk *worker, started map[int]bool) {
	old := wk.routes
	wk.routes, wk.routesRev = maps.Clone(w.routes), w.routesRev
	for _, v := range sortedKeys(wk.writers) {
		for _, c := range sortedKeys(wk.routes) {
			if prev, ok := old[c]; started[v] || !ok || prev != wk.routes[c] {
				w.tell(wk.writers[v], c, wk.routes[c])
			}
		}
	}
}

// tell is shardworker's route feed: writer wr hears that conv is routed to
// vshard to, if conv may be at wr's vshard (its hashed one, or any
// dedicated one).
func (w *World) tell(wr *writer, conv string, to int) {
	if w.layout().MayHold(wr.v, conv) {
		wr.m.Route(w.clock(), conv, to)
		wr.collect(w)
	}
}
