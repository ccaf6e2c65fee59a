package lease

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultTTL is the worker lease's time to live, in seconds. The etcd client
// renews it every TTL/3.
const DefaultTTL = 10

// Registration is a worker's presence in etcd: its lease and workers/<id>.
type Registration struct {
	WorkerID string
	Gen      int64
	LeaseID  clientv3.LeaseID

	cli      *clientv3.Client
	log      *slog.Logger
	lost     chan struct{}
	renewals *atomic.Int64
	cancel   context.CancelFunc
	done     chan struct{}
	once     sync.Once
}

// Register takes a new gen for workerID, grants a lease of ttl seconds and
// writes workers/<id> = info (with the new gen) on it. It starts the single
// keep-alive that renews the lease for all the worker's shards, counting
// each renewal into renewals (may be nil); Close stops it.
func Register(ctx context.Context, cli *clientv3.Client, prefix, workerID string, info WorkerInfo, ttl int64, renewals *atomic.Int64, log *slog.Logger) (*Registration, error) {
	if log == nil {
		log = slog.Default()
	}
	if renewals == nil {
		renewals = new(atomic.Int64)
	}
	gen, err := nextGen(ctx, cli, prefix+"gens/"+workerID)
	if err != nil {
		return nil, err
	}
	grant, err := cli.Grant(ctx, ttl)
	if err != nil {
		return nil, fmt.Errorf("lease: grant: %w", err)
	}
	info.Gen = gen
	val, _ := json.Marshal(info)
	if _, err := cli.Put(ctx, workersPrefix(prefix)+workerID, string(val), clientv3.WithLease(grant.ID)); err != nil {
		return nil, fmt.Errorf("lease: register worker %s: %w", workerID, err)
	}
	kctx, cancel := context.WithCancel(context.Background())
	r := &Registration{WorkerID: workerID, Gen: gen, LeaseID: grant.ID, cli: cli, log: log,
		lost: make(chan struct{}), renewals: renewals, cancel: cancel, done: make(chan struct{})}
	go r.keepAlive(kctx)
	return r, nil
}

// Lost is closed when etcd has answered that the lease is gone. A renewal
// that merely fails (etcd unreachable) does not close it: while etcd is down
// no new owner can be made, so the worker keeps serving.
func (r *Registration) Lost() <-chan struct{} { return r.lost }

func (r *Registration) keepAlive(ctx context.Context) {
	defer close(r.done)
	for ctx.Err() == nil {
		ch, err := r.cli.KeepAlive(ctx, r.LeaseID)
		if err == nil {
			for resp := range ch { // drain: an undrained channel stalls renewals
				if resp != nil {
					r.renewals.Add(1)
				}
			}
		}
		if ctx.Err() != nil {
			return
		}
		// The stream ended: ask etcd whether the lease still exists.
		tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ttl, err := r.cli.TimeToLive(tctx, r.LeaseID)
		cancel()
		switch {
		case err == nil && ttl.TTL <= 0:
			r.log.Warn("worker lease is gone", "worker", r.WorkerID, "gen", r.Gen)
			close(r.lost)
			return
		case err != nil:
			r.log.Warn("lease renewal failing; still serving until etcd says the lease is gone", "worker", r.WorkerID, "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Close stops the keep-alive and revokes the lease, so that the coordinator
// reassigns the worker's shards without waiting for the TTL. Call it only
// after the worker stopped writing. Safe to call twice.
func (r *Registration) Close(ctx context.Context) error {
	var err error
	r.once.Do(func() {
		r.cancel()
		<-r.done
		if _, rerr := r.cli.Revoke(ctx, r.LeaseID); rerr != nil {
			err = fmt.Errorf("lease: revoke: %w", rerr)
		}
	})
	return err
}

// nextGen increments the counter at key by compare-and-swap and returns it.
func nextGen(ctx context.Context, cli *clientv3.Client, key string) (int64, error) {
	for {
		resp, err := cli.Get(ctx, key)
		if err != nil {
			return 0, fmt.Errorf("lease: read gen: %w", err)
		}
		var cur int64
		var rev int64
		if len(resp.Kvs) > 0 {
			cur, _ = strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64)
			rev = resp.Kvs[0].ModRevision
		}
		txn, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, strconv.FormatInt(cur+1, 10))).Commit()
		if err != nil {
			return 0, fmt.Errorf("lease: bump gen: %w", err)
		}
		if txn.Succeeded {
			return cur + 1, nil
		}
	}
}
