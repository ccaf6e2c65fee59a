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
// conversation keeps one, naming its hashed vshard, until that vshard's
// writer finds the conversation here and deletes it (release, as
// shardworker's shard.release and lease.ReleaseOverride do). The gateway
// reads the overrides when its view refreshes, each worker when it
// manages (feedRoutes), each with a delay of its own; the writer that
// holds the conversation commits its moved record, the one it moves to
// waits for that record to be stored.
//
// The ReleaseFromSink bug is the release as `admin unisolate` once made
// it: the operator deletes the override as soon as the sink (Postgres,
// which lags the log) shows the conversation at its hashed vshard.

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
		} else if _, ok := w.routes[c]; ok && w.cfg.Bugs.ReleaseFromSink && w.sinkLocatedAt(c) == home {
			add(func() { w.deleteOverride(c) }, "UNISOLATE %s: the sink has it home", c)
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
	w.routeRevs[conv] = w.routesRev
	w.stats.Isolations++
}

// deleteOverride removes conv's override: its commands go to its hashed
// vshard.
func (w *World) deleteOverride(conv string) {
	delete(w.routes, conv)
	delete(w.routeRevs, conv)
	w.routesRev++
}

// release is the driver of writer wr acting on Notice.Released for conv:
// the override is deleted if it is still the one wr was told of, naming
// wr's vshard, and wr's owner row is unchanged (a compare-and-swap on
// both, lease.ReleaseOverride); an etcd outage fails it (the writer
// reports it again at its next look).
func (w *World) release(wr *writer, conv string) {
	t, ok := wr.told[conv]
	row, owned := w.owners.rows[wr.v]
	if w.cfg.Bugs.ReleaseFromSink || !ok || t.to != wr.v || w.etcdDown() || w.routeRevs[conv] != t.rev ||
		!owned || row.Worker != wr.wk.id || row.Gen != wr.wk.gen || row.Epoch != wr.epoch {
		return
	}
	if _, ok := w.routes[conv]; !ok {
		return
	}
	w.deleteOverride(conv)
	w.stats.Releases++
	w.tracef("%s releases %s: override deleted", wr, conv)
}

// sinkLocatedAt is where the sink says conv is written: the target of
// its last stored moved record, else its hashed vshard.
func (w *World) sinkLocatedAt(conv string) int {
	at := logrecord.VShard(conv, w.cfg.VShards)
	var top int64
	for _, e := range w.sink.Events(conv) {
		if e.Kind == logrecord.KindMoved && e.Seq > top && e.ToVShard != nil {
			top, at = e.Seq, *e.ToVShard
		}
	}
	return at
}

// feedRoutes is a worker reading the overrides now (shardworker's route
// watch): every writer hears of the ones that changed since the worker
// last read them, a writer started since of all of them (started).
func (w *World) feedRoutes(wk *worker, started map[int]bool) {
	old := wk.routeRevs
	wk.routes, wk.routesRev, wk.routeRevs = maps.Clone(w.routes), w.routesRev, maps.Clone(w.routeRevs)
	for _, v := range sortedKeys(wk.writers) {
		for _, c := range sortedKeys(wk.routes) {
			if prev, ok := old[c]; started[v] || !ok || prev != wk.routeRevs[c] {
				w.tell(wk.writers[v], c, wk.routes[c], wk.routeRevs[c])
			}
		}
		for _, c := range sortedKeys(old) {
			if _, ok := wk.routes[c]; !ok && !started[v] {
				w.untell(wk.writers[v], c)
			}
		}
	}
}

// tell is shardworker's route feed: writer wr hears that conv is routed to
// vshard to (the override's revision rev), if conv may be at wr's vshard
// (its hashed one, or any dedicated one).
func (w *World) tell(wr *writer, conv string, to int, rev int64) {
	if w.layout().MayHold(wr.v, conv) {
		wr.told[conv] = toldRoute{to, rev}
		wr.m.Route(w.clock(), conv, to)
		wr.collect(w)
	}
}

// untell is the route feed telling writer wr that conv's override is gone.
func (w *World) untell(wr *writer, conv string) {
	if w.layout().MayHold(wr.v, conv) {
		delete(wr.told, conv)
		wr.m.Unroute(conv)
		wr.collect(w)
	}
}
