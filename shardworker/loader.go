package shardworker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/chatpipe/chatpipe/internal/shardcore"
)

// loader merges the state loads of a worker's writers — conversations they
// lack, client_message_ids they must look up — into shared Postgres round
// trips. A load makes its round trip itself while fewer than maxTrips are in
// flight (at light load: no hand-off, no extra goroutine); past that it
// queues, and the next round trip to end takes the whole queue in one more.
// At light load each vshard commits about one message per batch, so every
// message costs a lookup; merged under load, one round trip answers the
// loads of many vshards. Each load gets exactly the conversations and keys
// it asked for, as fetchState would have answered them alone: the merged
// statements read one snapshot, and every load gets states of its own.
type loader struct {
	db       *pgxpool.Pool
	timeout  time.Duration
	maxTrips int
	done     chan struct{} // closed by stop: waiting loads give up

	mu       sync.Mutex
	inflight int
	queue    []*loadReq
	stopped  bool

	trips, loads adder
}

// adder is a counter (*atomic.Int64).
type adder interface{ Add(int64) int64 }

// loadReq is one writer's load.
type loadReq struct {
	convs []string
	keys  []shardcore.DedupeKey
	res   chan loadRes // buffered: whoever answers never waits for the writer
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
	l := &loader{db: db, timeout: timeout, maxTrips: loaderTrips, done: make(chan struct{}), trips: trips, loads: loads}
	if faultLoaderSlow > 0 {
		l.maxTrips = 0
		go l.faultPump()
	}
	return l
}

// stop makes waiting and later loads return errLoaderStopped; round trips
// in flight finish.
func (l *loader) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.stopped {
		l.stopped = true
		close(l.done)
	}
}

// load asks for convs and keys and waits for the answer, ctx or the
// loader's stop.
func (l *loader) load(ctx context.Context, convs []string, keys []shardcore.DedupeKey) (map[string]*shardcore.Conv, map[shardcore.DedupeKey]shardcore.First, error) {
	r := &loadReq{convs: convs, keys: keys, res: make(chan loadRes, 1)}
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return nil, nil, errLoaderStopped
	}
	if l.inflight >= l.maxTrips {
		l.queue = append(l.queue, r)
		l.mu.Unlock()
		select {
		case res := <-r.res:
			return res.convs, res.found, res.err
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-l.done:
			return nil, nil, errLoaderStopped
		}
	}
	l.inflight++
	batch := append([]*loadReq{r}, l.takeLocked()...)
	l.mu.Unlock()
	l.answer(batch)
	l.finish()
	res := <-r.res
	return res.convs, res.found, res.err
}

// finish ends a round trip: its slot goes back, unless loads queued
// meanwhile, which a goroutine then answers in the slot's further round
// trips (only under load, when the slots are all taken).
func (l *loader) finish() {
	l.mu.Lock()
	if len(l.queue) == 0 {
		l.inflight--
		l.mu.Unlock()
		return
	}
	batch := l.takeLocked()
	l.mu.Unlock()
	go func() {
		for len(batch) > 0 {
			l.answer(batch)
			l.mu.Lock()
			batch = l.takeLocked()
			if len(batch) == 0 {
				l.inflight--
			}
			l.mu.Unlock()
		}
	}()
}

// takeLocked takes up to loaderMaxLoads-1 queued loads.
func (l *loader) takeLocked() []*loadReq {
	n := min(len(l.queue), loaderMaxLoads-1)
	if n == 0 {
		return nil
	}
	batch := append([]*loadReq(nil), l.queue[:n]...)
	clear(l.queue[:n])
	l.queue = l.queue[n:]
	return batch
}

// answer makes one round trip for batch and gives each load its part. A
// conversation two loads ask for (an overridden one, which its hashed
// vshard's writer and a dedicated one's may both load) is read once, and
// each load gets a state of its own.
func (l *loader) answer(batch []*loadReq) {
	noteMergedLoads(batch)
	var convs []string
	var keys []shardcore.DedupeKey
	seenConv, seenKey := map[string]bool{}, map[shardcore.DedupeKey]bool{}
	for _, r := range batch {
		for _, c := range r.convs {
			if !seenConv[c] {
				seenConv[c] = true
				convs = append(convs, c)
			}
		}
		for _, k := range r.keys {
			if !seenKey[k] {
				seenKey[k] = true
				keys = append(keys, k)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	st, err := queryState(ctx, l.db, convs, keys)
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
			res.convs[c] = st.conv(c)
		}
		for _, k := range r.keys {
			if f, ok := st.found[k]; ok {
				res.found[k] = f
			}
		}
		r.res <- res
	}
}
