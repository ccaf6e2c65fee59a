package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	dto "github.com/prometheus/client_model/go"

	"github.com/chatpipe/chatpipe/internal/promtext"
	"github.com/chatpipe/chatpipe/lease"
)

// proc is one role of the stack running as its own OS process.
type proc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

func startProc(t *testing.T, dir, name string, env []string, args ...string) *proc {
	t.Helper()
	watch(t)
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() { p.stop() })
	return p
}

// startWorker runs `chatpipe worker` joining dev's stack.
// shortLease is the environment of a worker that a fault test kills,
// pauses or cuts off from etcd to have its lease run out (not
// TestStarvedKeepAlive's, whose point is the margin): its lease lives shortTTL
// (--lease-ttl), not the default 10 s, so what the test waits for comes
// sooner. The worker still stops accepting a margin (1 s) before the
// lease's local deadline, and a new owner still fences what the old one
// left open.
var shortLease = fmt.Sprintf("CHATPIPE_LEASE_TTL=%d", int(shortTTL/time.Second))

// shortTTL is the lease of the workers started with shortLease.
const shortTTL = 4 * time.Second

func (d *devProc) startWorker(t *testing.T, id string, env ...string) *proc {
	return startProc(t, d.dir, id, env, "worker", "--endpoints", filepath.Join(d.dir, "endpoints.json"), "--id", id, "--log-level", "warn")
}

func (p *proc) signal(sig syscall.Signal) {
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v to %s: %v", sig, p.name, err)
	}
}

// kill9 kills the process without warning and waits for it.
func (p *proc) kill9() {
	p.cmd.Process.Kill()
	<-p.done
}

// stop ends the process gracefully (SIGCONT first, in case it is paused).
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGCONT)
	if !terminate(p.cmd.Process, p.done, 30*time.Second) {
		p.t.Errorf("%s did not stop within 30 s of SIGTERM; its goroutines at SIGQUIT and log:\n%s", p.name, tailN(p.log, 600))
	}
}

// terminate sends SIGTERM and waits until done closes; false if it did not
// within: the process then gets SIGQUIT, which makes a Go process print
// every goroutine's stack to its log and exit (what its shutdown waits on),
// and SIGKILL 10 s later.
func terminate(proc *os.Process, done <-chan struct{}, within time.Duration) bool {
	proc.Signal(syscall.SIGTERM)
	select {
	case <-done:
		return true
	case <-time.After(within):
	}
	proc.Signal(syscall.SIGQUIT)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		proc.Kill()
		<-done
	}
	return false
}

// etcdClient dials ep's etcd (with the secured stack's client certificate,
// if any) for the rest of t.
func etcdClient(t *testing.T, ep endpoints) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: ep.Etcd, DialTimeout: 5 * time.Second, TLS: ep.etcdTLS})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// etcdView reads the owner rows and live workers.
func etcdView(t *testing.T, ep endpoints) lease.View {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: ep.Etcd, DialTimeout: 5 * time.Second, TLS: ep.etcdTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
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

// ownedBy counts the vshards whose live owner is worker.
func ownedBy(v lease.View, vshards int, worker string) int {
	n := 0
	for s := 0; s < vshards; s++ {
		if row, _, ok := v.Live(s); ok && row.Worker == worker {
			n++
		}
	}
	return n
}

// owners says who owns the first vshards of v, live or not: "wa 40, wb 26
// (live workers: wa gen 1, wb gen 2)", with the vshards whose owner row is
// missing or names a worker that is gone or of another generation.
func owners(v lease.View, vshards int) string {
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

// waitOwned waits until worker is the live owner of n of ep's first
// vshards; a timeout says who owned what.
func waitOwned(t *testing.T, timeout time.Duration, what string, ep endpoints, vshards int, worker string, n int) {
	t.Helper()
	var last lease.View
	waitForOr(t, timeout, what, func() bool {
		last = etcdView(t, ep)
		return ownedBy(last, vshards, worker) == n
	}, func() string {
		return fmt.Sprintf("want %s to own %d of %d vshards; owners: %s", worker, n, vshards, owners(last, vshards))
	})
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	waitForOr(t, timeout, what, cond, nil)
}

// waitForOr is waitFor whose failure also prints detail(), what the test
// knows about why cond does not hold.
func waitForOr(t *testing.T, timeout time.Duration, what string, cond func() bool, detail func() string) {
	t.Helper()
	defer watch(t).Waiting(what)()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			if detail != nil {
				t.Fatalf("timed out after %v waiting for %s: %s", timeout, what, detail())
			}
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// metric sums a Prometheus metric over its label sets; a name may
// carry a selector, `name{k="v",...}`, to sum only the sets that match.
func metric(t *testing.T, url, name string) float64 {
	t.Helper()
	if base, sel, ok := strings.Cut(name, "{"); ok {
		labels := strings.Split(strings.TrimSuffix(sel, "}"), ",")
		return metricLabeled(t, url, base, labels...)
	}
	return metricLabeled(t, url, name)
}

// metricLabeled sums a Prometheus metric (a counter, gauge or untyped
// one) over the label sets that have every one of labels (each
// `name="value"`).
func metricLabeled(t *testing.T, url, name string, labels ...string) float64 {
	t.Helper()
	return promtext.Sum(scrape(t, url), name, labels...)
}

// scrape reads the /metrics page at url: its metric families by name.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("metrics %s: %v", url, err)
	}
	defer resp.Body.Close()
	fams, err := promtext.Parse(resp.Body)
	if err != nil {
		t.Fatalf("metrics %s: %v", url, err)
	}
	return fams
}

func adminURL(t *testing.T, ep endpoints, worker string) string {
	t.Helper()
	return adminURLIn(t, etcdView(t, ep), worker)
}

// adminURLIn is adminURL read from a view already in hand.
func adminURLIn(t *testing.T, view lease.View, worker string) string {
	t.Helper()
	w, ok := view.Workers[worker]
	if !ok || w.Admin == "" {
		t.Fatalf("worker %s has no admin address in etcd", worker)
	}
	return fmt.Sprintf("http://%s/metrics", w.Admin)
}
