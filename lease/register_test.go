package lease_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/lease"
)

// TestRegistrationDeadline checks the lease's local deadline against a real
// etcd: it is never later than a renewal's send time plus the TTL, it moves
// on with every renewal, it stops moving while renewals fail (and Lost
// stays open: etcd has not said the lease is gone), and Lost closes once
// etcd says the lease is gone.
func TestRegistrationDeadline(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	e, cli := testEtcd(t)
	ctx := context.Background()

	// Lost closes when the lease is revoked behind the worker's back.
	revoked, err := lease.Register(ctx, cli, lease.DefaultPrefix, "w-revoked", lease.WorkerInfo{}, 2, nil, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, revoked.LeaseID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-revoked.Lost():
	case <-time.After(5 * time.Second):
		t.Error("Lost not closed 5 s after the lease was revoked")
	}
	revoked.Close(ctx)

	var renewals atomic.Int64
	before := time.Now()
	reg, err := lease.Register(ctx, cli, lease.DefaultPrefix, "w", lease.WorkerInfo{}, 2, &renewals, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { // etcd is down by then: the revoke fails, in a second
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		reg.Close(cctx)
		cancel()
	}()
	d0, ttl := reg.Deadline()
	if ttl != 2*time.Second {
		t.Fatalf("granted TTL %v, want 2 s", ttl)
	}
	if d0.Before(before.Add(ttl)) || d0.After(time.Now().Add(ttl)) {
		t.Errorf("deadline after the grant is %v, want between %v and %v", d0, before.Add(ttl), time.Now().Add(ttl))
	}
	for start := time.Now(); renewals.Load() < 2; {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("%d renewals in 5 s with a TTL of 2 s", renewals.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	d1, _ := reg.Deadline()
	if !d1.After(d0) || d1.After(time.Now().Add(ttl)) {
		t.Errorf("deadline after %d renewals is %v: want after %v and no later than now + TTL", renewals.Load(), d1, d0)
	}

	// etcd gone: renewals fail, the deadline stays put and passes, and the
	// lease is not declared lost.
	e.Close()
	stopped := time.Now()
	time.Sleep(ttl + 500*time.Millisecond)
	d2, _ := reg.Deadline()
	if d2.After(stopped.Add(ttl)) {
		t.Errorf("deadline %v moved past etcd's stop + TTL (%v) while etcd was down", d2, stopped.Add(ttl))
	}
	if !d2.Before(time.Now()) {
		t.Errorf("deadline %v not passed %v after etcd stopped", d2, time.Since(stopped))
	}
	select {
	case <-reg.Lost():
		t.Error("Lost closed while etcd was unreachable: only etcd can say the lease is gone")
	default:
	}
}

// testEtcd starts an embedded etcd and a client of it, both closed when
// the test ends (closing etcd earlier is fine).
func testEtcd(t *testing.T) (*devstack.Etcd, *clientv3.Client) {
	t.Helper()
	e, err := devstack.StartEtcd(context.Background(), filepath.Join(t.TempDir(), "etcd"), 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return e, cli
}
