package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestNemesis runs a seeded random schedule of faults against a stack
// whose roles are separate processes — three workers, persist, projection
// and the broker beside chatpipe dev (etcd, Postgres, the gateway) — while
// clients send, then heals everything and runs the world check: every
// accepted message in the log and exactly once in Postgres, no seq used
// twice, no client_message_id stored twice. The faults: kill -9 of a
// worker, a worker paused past its lease (so it is fenced when it
// resumes), a graceful worker restart, kill -9 of persist or of the
// projection, and a graceful broker restart.
//
// The seed is logged; CHATPIPE_E2E_NEMESIS_SEED=N replays the same schedule
// (the same faults in the same order with the same gaps between them;
// what the processes do meanwhile is not deterministic), CHATPIPE_E2E_NEMESIS_DURATION
// sets how long faults are injected (default 60 s).
func TestNemesis(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("CHATPIPE_E2E_NEMESIS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHATPIPE_E2E_NEMESIS_SEED=%q: %v", v, err)
		}
		seed = s
	}
	dur := 60 * time.Second
	if v := os.Getenv("CHATPIPE_E2E_NEMESIS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("CHATPIPE_E2E_NEMESIS_DURATION=%q: %v", v, err)
		}
		dur = d
	}
	t.Logf("nemesis seed %d (replay: CHATPIPE_E2E_NEMESIS_SEED=%d), faults for %v", seed, seed, dur)
	rng := rand.New(rand.NewPCG(seed, 0x6e656d))

	dir := t.TempDir()
	port := freePort(t)
	kargs := []string{"kafka", "--data-dir", filepath.Join(dir, "broker"), "--port", strconv.Itoa(port), "--partitions", "10", "--log-level", "warn"} // dev's 8 hashed partitions and its 2 dedicated vshards' own
	kn := 0
	startBroker := func() *proc {
		kn++
		p := startProc(t, dir, fmt.Sprintf("kafka%d", kn), nil, kargs...)
		deadline := time.Now().Add(60 * time.Second)
		for !dialable(port) {
			if time.Now().After(deadline) {
				t.Fatalf("the broker does not listen on %d after 60 s; its log:\n%s", port, tail(p.log))
			}
			time.Sleep(100 * time.Millisecond)
		}
		return p
	}
	broker := startBroker()
	dev := startDev(t, dir, "--kafka", fmt.Sprintf("127.0.0.1:%d", port), "--workers", "0", "--persist=false", "--projection=false")
	ep := filepath.Join(dev.dir, "endpoints.json")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("dev log:\n%s", tail(filepath.Join(dir, "dev.log")))
		}
	})
	n := map[string]int{}
	start := func(role string) *proc {
		n[role]++
		name := fmt.Sprintf("%s-%d", role, n[role])
		switch {
		case strings.HasPrefix(role, "w"):
			return startProc(t, dir, name, nil, "worker", "--endpoints", ep, "--id", role, "--log-level", "warn")
		default:
			return startProc(t, dir, name, nil, role, "--endpoints", ep, "--log-level", "warn")
		}
	}
	procs := map[string]*proc{}
	for _, r := range []string{"w1", "w2", "w3", "persist", "projection"} {
		procs[r] = start(r)
	}
	waitFor(t, 120*time.Second, "the workers to own every vshard", func() bool {
		v := etcdView(t, dev.ep)
		return ownedBy(v, dev.ep.all(), "w1")+ownedBy(v, dev.ep.all(), "w2")+ownedBy(v, dev.ep.all(), "w3") == dev.ep.all()
	})

	// Clients reconnect, as real ones do: a consumer killed and restarted
	// hands the gateway a backlog that overflows a device's send buffer,
	// and the gateway closes such a device ("reconnect and sync").
	load, reconnects := startReconnectingLoad(t, dev, 10, 20)
	waitFor(t, 60*time.Second, "load to flow", func() bool { return load.count() > 200 })

	workers := []string{"w1", "w2", "w3"}
	// pausedAt holds the workers frozen by a pause and when; a worker is
	// resumed only once its pause has outlasted its lease (10 s), so every
	// pause moves its vshards and the resumed writer meets the fence.
	pausedAt := map[string]time.Time{}
	const pastLease = 12 * time.Second
	type fault struct {
		name string
		do   func()
	}
	faults := []fault{
		{"kill -9 a worker, start it again", func() {
			w := workers[rng.IntN(len(workers))]
			procs[w].kill9()
			delete(pausedAt, w)
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Millisecond)
			procs[w] = start(w)
		}},
		{"pause a worker past its lease", func() {
			w := workers[rng.IntN(len(workers))]
			if _, ok := pausedAt[w]; ok {
				return
			}
			procs[w].signal(syscall.SIGSTOP)
			pausedAt[w] = time.Now()
		}},
		{"resume the workers paused past their lease", func() {
			for w, at := range pausedAt {
				if time.Since(at) >= pastLease {
					procs[w].signal(syscall.SIGCONT)
					delete(pausedAt, w)
				}
			}
		}},
		{"restart a worker gracefully", func() {
			w := workers[rng.IntN(len(workers))]
			if _, ok := pausedAt[w]; ok {
				return
			}
			procs[w].stop()
			procs[w] = start(w)
		}},
		{"kill -9 persist, start it again", func() {
			procs["persist"].kill9()
			procs["persist"] = start("persist")
		}},
		{"kill -9 the projection, start it again", func() {
			procs["projection"].kill9()
			procs["projection"] = start("projection")
		}},
		{"restart the broker gracefully", func() {
			broker.stop()
			broker = startBroker()
		}},
	}
	counts := map[string]int{}
	begin := time.Now()
	for time.Since(begin) < dur {
		f := faults[rng.IntN(len(faults))]
		t.Logf("t=%5.1fs %s", time.Since(begin).Seconds(), f.name)
		f.do()
		counts[f.name]++
		time.Sleep(time.Duration(1000+rng.IntN(4000)) * time.Millisecond)
	}

	// Heal: every worker running and unpaused; then the load must go on.
	for w, at := range pausedAt {
		time.Sleep(time.Until(at.Add(pastLease)))
		procs[w].signal(syscall.SIGCONT)
	}
	waitFor(t, 120*time.Second, "the workers to own every vshard again", func() bool {
		v := etcdView(t, dev.ep)
		return ownedBy(v, dev.ep.all(), "w1")+ownedBy(v, dev.ep.all(), "w2")+ownedBy(v, dev.ep.all(), "w3") == dev.ep.all()
	})
	healed := load.count()
	waitFor(t, 120*time.Second, "load to go on after the faults", func() bool { return load.count() > healed+300 })
	accepted := load.finish()
	var kinds []string
	for k, c := range counts {
		kinds = append(kinds, fmt.Sprintf("%s ×%d", k, c))
	}
	sort.Strings(kinds)
	t.Logf("%d sends accepted (%d client reconnects) under %s", len(accepted), reconnects.Load(), strings.Join(kinds, ", "))
	checkWorld(t, dev.ep, accepted)
}
