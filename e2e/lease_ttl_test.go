package e2e

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/chatpipe/chatpipe/internal/stacktest"
	"github.com/chatpipe/chatpipe/lease"
)

// TestLeaseTTLFlag: --lease-ttl sets the TTL etcd grants each worker's
// lease and the coordinator's election session.
func TestLeaseTTLFlag(t *testing.T) {
	parallel(t)
	dev := startDev(t, t.TempDir(), "--lease-ttl", "3")
	cli := stacktest.EtcdClient(t, dev.EP)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	granted := func(key string, prefix bool) int64 {
		t.Helper()
		opts := []clientv3.OpOption{}
		if prefix {
			opts = append(opts, clientv3.WithPrefix())
		}
		resp, err := cli.Get(ctx, key, opts...)
		if err != nil || len(resp.Kvs) == 0 || resp.Kvs[0].Lease == 0 {
			t.Fatalf("%s: %v %+v: want a key on a lease", key, err, resp)
		}
		ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
		if err != nil {
			t.Fatalf("%s's lease: %v", key, err)
		}
		return ttl.GrantedTTL
	}
	for _, w := range []string{"w1", "w2"} {
		if got := granted(lease.DefaultPrefix+"workers/"+w, false); got != 3 {
			t.Errorf("worker %s's lease was granted %d s, want the 3 of --lease-ttl", w, got)
		}
	}
	if got := granted(lease.DefaultPrefix+"coordinator", true); got != 3 {
		t.Errorf("the coordinator's session was granted %d s, want the 3 of --lease-ttl", got)
	}
}
