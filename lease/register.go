package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultTTL is the worker lease's time to live, in seconds. The worker
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
	renewed  atomic.Pointer[renewal]
	cancel   context.CancelFunc
	done     chan struct{}
	once     sync.Once
}

// renewal is the last grant or keep-alive etcd answered: sent is when its
// request left this process (etcd restarted the lease's TTL no earlier),
// ttl what etcd granted.
type renewal struct {
	sent time.Time
	ttl  time.Duration
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
	sent := time.Now()
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
	r.renewed.Store(&renewal{sent: sent, ttl: time.Duration(grant.TTL) * time.Second})
	go r.keepAlive(kctx)
	return r, nil
}

// Lost is closed when etcd has answered that the lease is gone. A renewal
// that merely fails (etcd unreachable) does not close it; Deadline says
// how long the lease is certain to last.
func (r *Registration) Lost() <-chan struct{} { return r.lost }

// Deadline is the earliest moment etcd may expire the lease as far as this
// process knows: the time the last renewal etcd answered was sent, plus
// the TTL it granted (etcd restarts the TTL when it receives the request,
// which is no earlier). ttl is that TTL. A worker must not count on the
// lease past the deadline: from then on a new owner of its shards may be
// made.
func (r *Registration) Deadline() (deadline time.Time, ttl time.Duration) {
	rn := r.renewed.Load()
	return rn.sent.Add(rn.ttl), rn.ttl
}

// Renewal timing: a keep-alive every TTL/3; an attempt that gets no answer
// within TTL/6 is given up and retried after renewRetry, so a request stuck
// on an unresponsive etcd member does not hold up the next one (which the
// client sends to another member).
const renewRetry = 250 * time.Millisecond

func (r *Registration) keepAlive(ctx context.Context) {
	defer close(r.done)
	_, ttl := r.Deadline()
	every, attempt := ttl/3, max(ttl/6, 200*time.Millisecond)
	wait, failures := every, 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		sent := time.Now()
		actx, cancel := context.WithTimeout(ctx, attempt)
		resp, err := r.cli.KeepAliveOnce(actx, r.LeaseID)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			r.renewed.Store(&renewal{sent: sent, ttl: time.Duration(resp.TTL) * time.Second})
			r.renewals.Add(1)
			if failures > 0 {
				r.log.Info("lease renewed again", "worker", r.WorkerID, "gen", r.Gen, "failures", failures)
			}
			wait, failures = every, 0
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			r.log.Warn("worker lease is gone", "worker", r.WorkerID, "gen", r.Gen)
			close(r.lost)
			return
		default:
			failures++
			deadline, _ := r.Deadline()
			r.log.Warn("lease renewal failing; etcd has not said the lease is gone", "worker", r.WorkerID, "gen", r.Gen,
				"err", err, "lease_left", time.Until(deadline).Round(time.Millisecond))
			wait = renewRetry
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
