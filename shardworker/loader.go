package shardworker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/chatpipe/chatpipe/shardcore"
)

// loader merges the state loads of a worker's writers — conversations they
// lack, client_message_ids they must look up — into shared Postgres round
// trips: a few run at once, and the loads that queue while they do go
// together in the next one. At light load each vshard commits about one
// message per batch, so without it every message cost a round trip (and
// Postgres a statement) of its own; merged, one round trip answers the
// loads of many vshards. Each load gets exactly the conversations and keys
// it asked for, as fetchState would have answered them alone: the merged
// statements read one snapshot, and a conversation belongs to one vshard,
// whose writer has at most one load in flight.
type loader struct {
	db      *pgxpool.Pool
	timeout time.Duration
	reqs    chan *loadReq
	done    chan struct{} // closed when the loader stops

	trips, loads adder
}

// adder is a counter (*atomic.Int64).
type adder interface{ Add(int64) int64 }

// loadReq is one writer's load.
type loadReq struct {
	convs []string
	keys  []shardcore.DedupeKey
	res   chan loadRes // buffered: the loader never waits for a writer
}

type loadRes struct {
	convs map[string]*shardcore.Conv
	found map[shardcore.DedupeKey]shardcore.First
	err   error
}

// Bounds of the loader: round trips in flight, and loads merged into one.
const (
	loaderTrips    = 4
	loaderMaxLoads = 256
)

var errLoaderStopped = errors.New("shardworker: the worker is stopping")

func newLoader(db *pgxpool.Pool, timeout time.Duration, trips, loads adder) *loader {
	return &loader{db: db, timeout: timeout, reqs: make(chan *loadReq, 4096), done: make(chan struct{}), trips: trips, loads: loads}
}

// run serves loads until ctx ends.
func (l *loader) run(ctx context.Context) {
	defer close(l.done)
	var wg sync.WaitGroup
	for range loaderTrips {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.serve(ctx)
		}()
	}
	wg.Wait()
}

// serve takes a load, every other load queued behind it (up to the bound),
// and answers them all from one round trip.
func (l *loader) serve(ctx context.Context) {
	for {
		var batch []*loadReq
		select {
		case r := <-l.reqs:
			batch = append(batch, r)
		case <-ctx.Done():
			return
		}
	more:
		for len(batch) < loaderMaxLoads {
			select {
			case r := <-l.reqs:
				batch = append(batch, r)
			default:
				break more
			}
		}
		l.answer(ctx, batch)
	}
}

func (l *loader) answer(ctx context.Context, batch []*loadReq) {
	var convs []string
	var keys []shardcore.DedupeKey
	for _, r := range batch {
		convs = append(convs, r.convs...)
		keys = append(keys, r.keys...)
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	loaded, found, err := fetchState(ctx, l.db, convs, keys)
	cancel()
	l.trips.Add(1)
	l.loads.Add(int64(len(batch)))
	for _, r := range batch {
		if err != nil {
			r.res <- loadRes{err: err}
			continue
		}
		res := loadRes{convs: make(map[string]*shardcore.Conv, len(r.convs)), found: map[shardcore.DedupeKey]shardcore.First{}}
		for _, c := range r.convs {
			res.convs[c] = loaded[c]
		}
		for _, k := range r.keys {
			if f, ok := found[k]; ok {
				res.found[k] = f
			}
		}
		r.res <- res
	}
}

// load asks for convs and keys and waits for the answer, ctx or the
// loader's end.
func (l *loader) load(ctx context.Context, convs []string, keys []shardcore.DedupeKey) (map[string]*shardcore.Conv, map[shardcore.DedupeKey]shardcore.First, error) {
	r := &loadReq{convs: convs, keys: keys, res: make(chan loadRes, 1)}
	select {
	case l.reqs <- r:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	case <-l.done:
		return nil, nil, errLoaderStopped
	}
	select {
	case res := <-r.res:
		return res.convs, res.found, res.err
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	case <-l.done:
		return nil, nil, errLoaderStopped
	}
}
