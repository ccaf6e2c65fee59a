package stacktest

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/chatpipe/chatpipe/lease"
)

// etcdClients holds one etcd client per test and stack (EtcdClient): the
// tests read the view every 100 ms while they wait for owners, and a
// client of its own each time cost a dial, about 15 ms under -race, for a
// read of under 2 ms.
var etcdClients = struct {
	sync.Mutex
	m map[etcdClientKey]*clientv3.Client
}{m: map[etcdClientKey]*clientv3.Client{}}

type etcdClientKey struct {
	t         testing.TB
	endpoints string
	tls       *tls.Config
}

// EtcdClient returns t's client of ep's etcd (with the secured stack's
// client certificate, if any), made on the first call and closed when t
// ends; callers share it and do not close it.
func EtcdClient(t testing.TB, ep Endpoints) *clientv3.Client {
	t.Helper()
	key := etcdClientKey{t, strings.Join(ep.Etcd, ","), ep.EtcdTLS}
	etcdClients.Lock()
	defer etcdClients.Unlock()
	if cli := etcdClients.m[key]; cli != nil {
		return cli
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: ep.Etcd, DialTimeout: 5 * time.Second, TLS: ep.EtcdTLS, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	etcdClients.m[key] = cli
	t.Cleanup(func() {
		etcdClients.Lock()
		delete(etcdClients.m, key)
		etcdClients.Unlock()
		cli.Close()
	})
	return cli
}

// EtcdView reads the owner rows and live workers from ep's etcd (with the
// secured stack's client certificate, if any), through one client per test
// and stack.
func EtcdView(t testing.TB, ep Endpoints) lease.View {
	t.Helper()
	cli := EtcdClient(t, ep)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, lease.DefaultPrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	v := lease.View{Shards: map[int]lease.Row{}, Workers: map[string]lease.WorkerInfo{}}
	for _, kv := range resp.Kvs {
		k := strings.TrimPrefix(string(kv.Key), lease.DefaultPrefix)
		switch {
		case strings.HasPrefix(k, "shards/"):
			n, _ := strconv.Atoi(strings.TrimPrefix(k, "shards/"))
			var o lease.Owner
			json.Unmarshal(kv.Value, &o)
			v.Shards[n] = lease.Row{Owner: o, ModRevision: kv.ModRevision}
		case strings.HasPrefix(k, "workers/"):
			var w lease.WorkerInfo
			json.Unmarshal(kv.Value, &w)
			v.Workers[strings.TrimPrefix(k, "workers/")] = w
		}
	}
	return v
}

// OwnedBy counts the vshards whose live owner is worker.
func OwnedBy(v lease.View, vshards int, worker string) int {
	n := 0
	for s := 0; s < vshards; s++ {
		if row, _, ok := v.Live(s); ok && row.Worker == worker {
			n++
		}
	}
	return n
}

// Owners says who owns the first vshards of v, live or not: "wa 40, wb 26
// (live workers: wa gen 1, wb gen 2)", with the vshards whose owner row is
// missing or names a worker that is gone or of another generation.
func Owners(v lease.View, vshards int) string {
	count := map[string]int{}
	var dead []string
	for s := 0; s < vshards; s++ {
		row, _, ok := v.Live(s)
		switch {
		case ok:
			count[row.Worker]++
		case row.Worker == "":
			dead = append(dead, fmt.Sprintf("%d: no owner", s))
		default:
			dead = append(dead, fmt.Sprintf("%d: %s gen %d, not live", s, row.Worker, row.Gen))
		}
	}
	names := make([]string, 0, len(count))
	for w := range count {
		names = append(names, w)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, w := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", w, count[w])
	}
	if len(dead) > 0 {
		fmt.Fprintf(&b, "; %d without a live owner (%s)", len(dead), strings.Join(dead[:min(len(dead), 8)], ", "))
	}
	live := make([]string, 0, len(v.Workers))
	for id, w := range v.Workers {
		live = append(live, fmt.Sprintf("%s gen %d", id, w.Gen))
	}
	sort.Strings(live)
	fmt.Fprintf(&b, " (live workers: %s)", strings.Join(live, ", "))
	return b.String()
}

// WaitOwned waits until worker is the live owner of n of ep's first
// vshards; a timeout says who owned what.
func WaitOwned(t testing.TB, timeout time.Duration, what string, ep Endpoints, vshards int, worker string, n int) {
	t.Helper()
	var last lease.View
	WaitForOr(t, timeout, what, func() bool {
		last = EtcdView(t, ep)
		return OwnedBy(last, vshards, worker) == n
	}, func() string {
		return fmt.Sprintf("want %s to own %d of %d vshards; owners: %s", worker, n, vshards, Owners(last, vshards))
	})
}

// AdminURL is the /metrics address of worker, from its registration in
// ep's etcd.
func AdminURL(t testing.TB, ep Endpoints, worker string) string {
	t.Helper()
	return AdminURLIn(t, EtcdView(t, ep), worker)
}

// AdminURLIn is AdminURL read from a view already in hand.
func AdminURLIn(t testing.TB, view lease.View, worker string) string {
	t.Helper()
	w, ok := view.Workers[worker]
	if !ok || w.Admin == "" {
		t.Fatalf("worker %s has no admin address in etcd", worker)
	}
	return fmt.Sprintf("http://%s/metrics", w.Admin)
}
