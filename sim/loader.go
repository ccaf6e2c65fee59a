package sim

import (
	"github.com/chatpipe/chatpipe/internal/shardcore"
)

// loader is the model of a worker's state loader (shardworker/loader.go):
// the batch loads of every writer of the worker — conversations a batch
// lacks, client_message_ids it must look up — queue, and one round trip
// answers every load queued when it runs, from one snapshot of the sink.
// The hashed vshard's writer and a dedicated one's may both ask for an
// overridden conversation in the same round trip; each load gets a state
// of its own (Bugs.SharedLoadState hands them one). A writer's load is
// queued as soon as the writer asks for it, and the writer waits for the
// round trip, which is a step of its own: loads merge whenever another
// writer asks before it runs. Replay loads, which a stopped writer
// abandons, go to the sink directly, as shardworker's do.
type loader struct {
	queue []*loadReq
}

// loadReq is one writer's load waiting for the loader's round trip.
type loadReq struct {
	wr *writer
	e  *shardcore.Effect
}

// viaLoader reports whether the worker's loader makes the round trip of
// e: a batch's load (shard.loadState).
func viaLoader(e *shardcore.Effect) bool {
	return e.Kind == shardcore.EffectLoadState && !e.Abandon && !e.AllOfVShard
}

// queueLoad queues wr's load e.
func (wk *worker) queueLoad(wr *writer, e *shardcore.Effect) {
	r := &loadReq{wr: wr, e: e}
	wr.loading = r
	wk.loader.queue = append(wk.loader.queue, r)
}

// loadTrip is one round trip of wk's loader: it reads every queued load's
// conversations and keys from one snapshot of the sink and gives each
// load its part, in queue order.
func (w *World) loadTrip(wk *worker) {
	batch := wk.loader.queue
	wk.loader.queue = nil
	w.stats.LoadTrips++
	if len(batch) > 1 {
		w.stats.MergedLoads++
	}
	now := w.clock()
	if w.pgDown() {
		for _, r := range batch {
			if r.wr.loading == r {
				r.wr.loading, r.wr.pending = nil, nil
				r.wr.m.StateLoaded(now, nil, nil, errPgDown)
				r.wr.collect(w)
			}
		}
		return
	}
	// Who asked for each conversation: a conversation two writers ask
	// for in one round trip is read once.
	askers := map[string]int{}
	for _, r := range batch {
		for _, c := range r.e.Convs {
			askers[c]++
		}
	}
	shared := map[string]*shardcore.Conv{}
	counted := false
	answers := make([]map[string]*shardcore.Conv, len(batch))
	founds := make([]map[shardcore.DedupeKey]shardcore.First, len(batch))
	for i, r := range batch {
		convs := map[string]*shardcore.Conv{}
		for _, c := range r.e.Convs {
			if askers[c] > 1 && !counted {
				counted = true
				w.stats.SharedConvLoads++
			}
			if w.cfg.Bugs.SharedLoadState && askers[c] > 1 {
				if shared[c] == nil {
					shared[c] = w.sink.LoadConv(c)
				}
				convs[c] = shared[c]
				continue
			}
			convs[c] = w.sink.LoadConv(c)
		}
		found := map[shardcore.DedupeKey]shardcore.First{}
		for _, k := range r.e.Keys {
			if f, ok := w.sink.Lookup(k.Conv, k.CMID); ok {
				found[k] = f
			}
		}
		answers[i], founds[i] = convs, found
	}
	for i, r := range batch {
		if r.wr.loading != r {
			continue // the writer is gone (its process crashed)
		}
		r.wr.loading, r.wr.pending = nil, nil
		r.wr.m.StateLoaded(now, answers[i], founds[i], nil)
		r.wr.collect(w)
	}
}
