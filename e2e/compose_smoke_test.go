package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/chatpipe/chatpipe/deploy"
	"github.com/chatpipe/chatpipe/internal/auth"
	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/internal/promtext"
	"github.com/chatpipe/chatpipe/internal/stacktest"
)

// The kit's files the compose smoke test reads (deploy).
var (
	composeFilePath = filepath.Join("../deploy", deploy.ComposeFile)
	promConfigPath  = filepath.Join("../deploy", deploy.PrometheusFile)
	dashboardPath   = filepath.Join("../deploy", deploy.DashboardFile)
)

// TestComposeSmoke runs the compose file's own stack as local processes:
// its etcd members with their command lines (Debian's etcd-server), its
// Postgres with the image's environment (this machine's PostgreSQL
// binaries), `chatpipe init` and every chatpipe role with the command lines
// and environment written in the YAML, replicas included. Service names
// become loopback addresses, container paths (volumes) temporary
// directories. There is no Kafka distribution here: one kfake broker
// (`chatpipe kafka`) stands in for the three, creating the topic the
// topic service would. The stack must come up (every role's /readyz, every
// vshard owned) and pass the write-path check (loadgen, then `chatpipe
// check` against the log and Postgres). A mis-split argument, a flag a role
// does not have, or a CHATPIPE_ variable that names no flag of its role
// fails here rather than at `docker compose up`.
func TestComposeSmoke(t *testing.T) {
	sharing(t, 40, 45)
	if testing.Short() {
		t.Skip("-short: the compose smoke test starts a whole stack")
	}
	// A build of its own (CGO_ENABLED=0, -trimpath) is about 150 s when
	// the cache does not hold it yet.
	watch(t).Extend(10 * time.Minute)
	etcdBin, err := exec.LookPath("etcd")
	if err != nil {
		t.Skip("etcd is not installed (Debian: apt-get install etcd-server); compose smoke test skipped")
	}
	pgBin, err := devstack.PostgresBinDir(context.Background())
	if err != nil {
		t.Skipf("no PostgreSQL server binaries (%v); compose smoke test skipped", err)
	}

	secret := fmt.Sprintf("%016x%016x%016x%016x", rand.Uint64(), rand.Uint64(), rand.Uint64(), rand.Uint64())
	if len(secret) < auth.MinSecretBytes {
		t.Fatalf("secret of %d bytes", len(secret))
	}
	raw, err := os.ReadFile(composeFilePath)
	if err != nil {
		t.Fatal(err)
	}
	text := interpolate(t, string(raw), map[string]string{"CHATPIPE_JWT_SECRET": secret})
	var c smokeCompose
	if err := yaml.Unmarshal([]byte(text), &c); err != nil {
		t.Fatalf("%s: %v", composeFilePath, err)
	}

	// A directory postgres (another OS user when we are root) can reach.
	root, err := os.MkdirTemp("", "cpsmoke")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}

	// The binary as the Dockerfile builds it (no race detector, no fault
	// points): under the race detector the stand-in broker and the workers
	// are too slow to take over 4096 vshards in minutes.
	chatpipe := filepath.Join(root, "chatpipe")
	build := exec.Command("go", "build", "-trimpath", "-o", chatpipe, "../cmd/chatpipe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build chatpipe: %v\n%s", err, out)
	}

	s := &smokeStack{t: t, c: c, root: root, chatpipe: chatpipe}
	s.assignAddresses()

	var etcds, chatpipes []string
	for _, name := range sortedKeys(c.Services) {
		svc := c.Services[name]
		switch {
		case strings.HasPrefix(svc.Image, "quay.io/coreos/etcd"):
			etcds = append(etcds, name)
		case svc.Image == "chatpipe:local" && name != "init":
			chatpipes = append(chatpipes, name)
		}
	}
	if len(etcds) == 0 || len(chatpipes) == 0 {
		t.Fatalf("compose file: etcd services %v, chatpipe services %v", etcds, chatpipes)
	}

	// Every variable given to a chatpipe service must be read, before
	// anything starts.
	for _, name := range append([]string{"init"}, chatpipes...) {
		s.checkEnv(name, c.Services[name])
	}
	if t.Failed() {
		t.FailNow()
	}

	// etcd members, all at once (each waits for the others' peers).
	for _, name := range etcds {
		svc := c.Services[name]
		if len(svc.Command) == 0 || svc.Command[0] != "etcd" {
			t.Fatalf("etcd service %s: command %q does not run etcd", name, svc.Command)
		}
		args := s.rewriteAll(name, svc.Command[1:], svc.Volumes)
		s.start(name, etcdBin, args, nil, nil)
	}
	for _, name := range etcds {
		// The healthcheck's etcdctl may not be installed; etcd's /health
		// on its advertised client URL says the same.
		u, ok := deploy.FlagValue(c.Services[name].Command, "advertise-client-urls")
		if !ok {
			t.Fatalf("%s has no --advertise-client-urls", name)
		}
		u = strings.Split(s.rewrite(name, u), ",")[0]
		s.waitHealthy(name, func() error { return httpOK(u + "/health") })
	}

	// Postgres as the postgres image sets it up.
	s.startPostgres()
	s.waitHealthy("postgres", func() error { return s.postgresReady(pgBin) })

	// The topic service's kafka-topics.sh command, done by the stand-in.
	s.startKafka()

	// The one-shot init, then the roles.
	initSvc, ok := c.Services["init"]
	if !ok {
		t.Fatal("compose file has no init service")
	}
	if out, err := s.runToCompletion("init", s.rewriteAll("init", initSvc.Command, initSvc.Volumes), s.env("init", initSvc.Environment), 2*time.Minute); err != nil {
		t.Fatalf("init: %v\n%s", err, out)
	}
	started := time.Now()
	for _, name := range chatpipes {
		svc := c.Services[name]
		for r := 0; r < svc.replicas(); r++ {
			inst := s.instance(name, r)
			s.start(inst, s.chatpipe, s.rewriteAll(inst, svc.Command, svc.Volumes), s.env(inst, svc.Environment), nil)
		}
	}

	// Ready: every role's /readyz, every vshard owned by the workers.
	vshards, ok := deploy.FlagValue(initSvc.Command, "vshards")
	if !ok {
		t.Fatal("init has no --vshards")
	}
	want, _ := strconv.Atoi(vshards)
	if d, ok := deploy.FlagValue(initSvc.Command, "dedicated"); ok {
		n, _ := strconv.Atoi(d)
		want += n // the dedicated vshards have owner rows too
	}
	var gatewayWS string
	var workerMetrics []string
	wantIDs := map[string]string{} // a worker's /metrics → the id it must have
	for _, name := range chatpipes {
		svc := c.Services[name]
		admin, ok := deploy.FlagValue(svc.Command, "admin")
		if !ok {
			t.Fatalf("%s has no --admin address", name)
		}
		for r := 0; r < svc.replicas(); r++ {
			inst := s.instance(name, r)
			a := s.rewrite(inst, admin)
			s.waitHealthy(inst, func() error { return httpOK("http://" + a + "/readyz") })
			if svc.Command[0] == "worker" {
				u := "http://" + a + "/metrics"
				workerMetrics = append(workerMetrics, u)
				// Its HOSTNAME, listen IP and port (the instance's own
				// address replaces the wildcard here; in Docker the id is
				// <container>-7070).
				if l, ok := deploy.FlagValue(svc.Command, "listen"); ok {
					host, port, _ := net.SplitHostPort(s.rewrite(inst, l))
					wantIDs[u] = inst + "-" + host + "-" + port
				}
			}
		}
		if svc.Command[0] == "gateway" {
			h, ok := deploy.FlagValue(svc.Command, "http")
			if !ok {
				t.Fatal("gateway has no --http")
			}
			gatewayWS = "ws://" + s.rewrite(s.instance(name, 0), h) + "/v1/ws"
		}
	}
	if gatewayWS == "" || len(workerMetrics) == 0 {
		t.Fatalf("no gateway (%q) or no worker (%v) in the compose file", gatewayWS, workerMetrics)
	}
	var owned float64
	stacktest.WaitFor(t, 4*time.Minute, fmt.Sprintf("the workers to own all %d vshards", want), func() bool {
		owned = 0
		for _, u := range workerMetrics {
			owned += stacktest.Metric(t, u, "chatpipe_worker_owned_shards")
		}
		return int(owned) == want
	})
	t.Logf("stack ready %v after the roles started: %d vshards owned by %d workers, gateway %s", time.Since(started).Round(time.Millisecond), int(owned), len(workerMetrics), gatewayWS)
	// The replicas run without --id: each is named for its container's
	// host name and listen port, one id each, which a restart in place
	// keeps (so the worker label of their metrics does).
	for _, u := range workerMetrics {
		if id, want := workerLabel(t, u), wantIDs[u]; id != want {
			t.Errorf("%s: worker id %q, want %q (<HOSTNAME>-<listen IP>-<port>)", u, id, want)
		}
	}

	// Each role's Docker healthcheck, run as the container would: the
	// image's binary with the service's environment, 127.0.0.1 being the
	// instance itself.
	for _, name := range chatpipes {
		svc := c.Services[name]
		if svc.Healthcheck == nil || len(svc.Healthcheck.Test) < 3 || svc.Healthcheck.Test[0] != "CMD" || svc.Healthcheck.Test[1] != "/usr/local/bin/chatpipe" {
			t.Errorf("%s: healthcheck %+v does not run the image's chatpipe", name, svc.Healthcheck)
			continue
		}
		for r := 0; r < svc.replicas(); r++ {
			inst := s.instance(name, r)
			if out, err := s.runToCompletion(inst+"-healthcheck", s.rewriteAll(inst, svc.Healthcheck.Test[2:], nil), s.env(inst, svc.Environment), 30*time.Second); err != nil {
				t.Errorf("%s: healthcheck %q: %v\n%s", inst, svc.Healthcheck.Test, err, out)
			}
		}
	}

	// The write-path check, through the gateway with the deployment's
	// secret, against the deployment's Kafka and Postgres.
	env := s.env("init", initSvc.Environment)
	getEnv := func(k string) string {
		for _, kv := range env {
			if v, ok := strings.CutPrefix(kv, k+"="); ok {
				return v
			}
		}
		t.Fatalf("init has no %s", k)
		return ""
	}
	// The compose URL as it is, pool settings included: `chatpipe check`
	// opens one connection from it and must not send pool_max_conns to
	// the server.
	dbURL := getEnv("CHATPIPE_DATABASE_URL")
	runs := filepath.Join(root, "runs")
	if out, err := s.runToCompletion("loadgen", []string{"loadgen", "--ws", gatewayWS, "--jwt-secret", secret,
		"--kafka", getEnv("CHATPIPE_KAFKA"), "--database-url", dbURL,
		"--rate", "100", "--duration", "10s", "--drain", "30s", "--out", runs, "--run", "smoke", "--progress=false"}, nil, 3*time.Minute); err != nil {
		t.Fatalf("loadgen: %v\n%s", err, out)
	}
	out, err := s.runToCompletion("check", []string{"check", "--run", filepath.Join(runs, "smoke")}, nil, 3*time.Minute)
	if err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	t.Logf("chatpipe check:\n%s", out)

	// The compose file's Prometheus, on this stack.
	if prom, err := exec.LookPath("prometheus"); err != nil {
		t.Log("prometheus is not installed (Debian: prometheus): its part of the smoke test skipped")
	} else {
		s.checkPrometheus(prom, vshards)
	}
}

// checkPrometheus runs Prometheus with the compose service's flags and
// deploy/prometheus/prometheus.yml — its targets mapped like everything
// else, the worker replicas (found through DNS in compose) listed, and a
// 1 s scrape interval to be quick — and checks that it scrapes every
// target, that no alert is pending or firing on a healthy stack, and that
// every query of the dashboard returns data.
func (s *smokeStack) checkPrometheus(bin, vshards string) {
	t := s.t
	svc, ok := s.c.Services["prometheus"]
	if !ok {
		t.Fatal("compose file has no prometheus service")
	}
	var cfg map[string]any
	deploy.ReadYAML(t, promConfigPath, &cfg)
	cfg["global"] = map[string]any{"scrape_interval": "1s", "evaluation_interval": "1s"}
	var rules []any
	for _, r := range cfg["rule_files"].([]any) {
		abs, err := filepath.Abs(filepath.Join(filepath.Dir(promConfigPath), fmt.Sprint(r)))
		if err != nil {
			t.Fatal(err)
		}
		rules = append(rules, abs)
	}
	cfg["rule_files"] = rules
	jobs := map[string]bool{}
	for _, sc := range cfg["scrape_configs"].([]any) {
		sc := sc.(map[string]any)
		jobs[fmt.Sprint(sc["job_name"])] = true
		var targets []any
		if st, ok := sc["static_configs"].([]any); ok {
			for _, g := range st {
				for _, tg := range g.(map[string]any)["targets"].([]any) {
					targets = append(targets, s.rewrite("prometheus", fmt.Sprint(tg)))
				}
			}
		}
		if dns, ok := sc["dns_sd_configs"].([]any); ok {
			for _, d := range dns {
				d := d.(map[string]any)
				for _, n := range d["names"].([]any) {
					name := fmt.Sprint(n)
					if _, ok := s.c.Services[name]; !ok {
						t.Fatalf("prometheus.yml: dns_sd name %q is not a service", name)
					}
					for r := 0; r < s.c.Services[name].replicas(); r++ {
						targets = append(targets, fmt.Sprintf("%s:%v", s.ips[s.instance(name, r)], d["port"]))
					}
				}
			}
			delete(sc, "dns_sd_configs")
		}
		sc["static_configs"] = []any{map[string]any{"targets": targets}}
	}
	dir := filepath.Join(s.root, "prometheus")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	listen := s.ips["prometheus"] + ":9090"
	var args []string
	for _, a := range svc.Command {
		k, _, _ := strings.Cut(a, "=")
		switch k {
		case "--config.file":
			a = k + "=" + cfgPath
		case "--storage.tsdb.path":
			a = k + "=" + filepath.Join(dir, "data")
		case "--web.listen-address":
			t.Fatalf("prometheus: the compose file sets %s; the test sets it", a)
		}
		args = append(args, a)
	}
	s.start("prometheus", bin, append(args, "--web.listen-address="+listen), nil, nil)
	api := "http://" + listen
	s.waitHealthy("prometheus", func() error { return httpOK(api + "/-/ready") })

	query := func(path string, into any) error {
		resp, err := http.Get(api + path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s %s", path, resp.Status, b)
		}
		return json.Unmarshal(b, into)
	}
	var down []string
	scrapedAll := func() bool {
		var r struct {
			Data struct {
				ActiveTargets []struct {
					ScrapeURL string `json:"scrapeUrl"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
					Labels    struct {
						Job string `json:"job"`
					} `json:"labels"`
				} `json:"activeTargets"`
			} `json:"data"`
		}
		if err := query("/api/v1/targets", &r); err != nil {
			t.Fatal(err)
		}
		down = nil
		seen := map[string]bool{}
		for _, tg := range r.Data.ActiveTargets {
			seen[tg.Labels.Job] = true
			if tg.Health != "up" {
				down = append(down, fmt.Sprintf("%s %s: %s %s", tg.Labels.Job, tg.ScrapeURL, tg.Health, tg.LastError))
			}
		}
		if len(seen) != len(jobs) {
			down = append(down, fmt.Sprintf("jobs with targets %v of %v", seen, jobs))
		}
		return len(down) == 0
	}
	for deadline := time.Now().Add(time.Minute); !scrapedAll(); time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus does not scrape every target after a minute: %v", down)
		}
	}
	// A few evaluations of the rules on a full set of samples.
	time.Sleep(5 * time.Second)
	var alerts struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if err := query("/api/v1/alerts", &alerts); err != nil {
		t.Fatal(err)
	}
	for _, a := range alerts.Data.Alerts {
		t.Errorf("healthy stack, yet alert %s is %s: %v", a.Labels["alertname"], a.State, a.Labels)
	}
	var rulesResp struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := query("/api/v1/rules", &rulesResp); err != nil {
		t.Fatal(err)
	}
	nrules := 0
	for _, g := range rulesResp.Data.Groups {
		for _, r := range g.Rules {
			nrules++
			if r.Health != "ok" {
				t.Errorf("rule %s: %s %s", r.Name, r.Health, r.LastError)
			}
		}
	}
	if nrules == 0 {
		t.Error("Prometheus loaded no rules")
	}

	// Every dashboard query, with Grafana's variables filled in.
	d := deploy.ReadDashboard(t, dashboardPath)
	var walk func([]deploy.DashPanel)
	walk = func(ps []deploy.DashPanel) {
		for _, pn := range ps {
			walk(pn.Panels)
			for _, tg := range pn.Targets {
				e := strings.NewReplacer("$__rate_interval", "1m", "$__range", "5m", "$vshards", vshards).Replace(tg.Expr)
				var r struct {
					Data struct {
						Result []json.RawMessage `json:"result"`
					} `json:"data"`
				}
				if err := query("/api/v1/query?query="+url.QueryEscape(e), &r); err != nil {
					t.Errorf("dashboard panel %q: %v", pn.Title, err)
				} else if len(r.Data.Result) == 0 {
					t.Errorf("dashboard panel %q: no data on the compose stack for %s", pn.Title, e)
				}
			}
		}
	}
	walk(d.Panels)
	t.Logf("Prometheus scraped %d jobs, %d rules loaded, no alert active", len(jobs), nrules)
}

// interpolate does compose's variable substitution: ${NAME}, ${NAME:-default}
// and $$. A variable neither given nor defaulted fails the test.
func interpolate(t *testing.T, text string, vars map[string]string) string {
	t.Helper()
	re := regexp.MustCompile(`\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}`)
	return re.ReplaceAllStringFunc(text, func(m string) string {
		if m == "$$" {
			return "$"
		}
		sub := re.FindStringSubmatch(m)
		if v, ok := vars[sub[1]]; ok && v != "" {
			return v
		}
		if sub[2] != "" {
			return sub[3]
		}
		t.Fatalf("compose file uses ${%s} with no default", sub[1])
		return ""
	})
}

type smokeService struct {
	Image       string         `json:"image"`
	Command     []string       `json:"command"`
	Environment map[string]any `json:"environment"`
	Volumes     []string       `json:"volumes"`
	Healthcheck *struct {
		Test []string `json:"test"`
	} `json:"healthcheck"`
	Deploy struct {
		Replicas *int `json:"replicas"`
	} `json:"deploy"`
}

func (s smokeService) replicas() int {
	if s.Deploy.Replicas != nil {
		return *s.Deploy.Replicas
	}
	return 1
}

type smokeCompose struct {
	Services map[string]smokeService `json:"services"`
}

type smokeStack struct {
	t        *testing.T
	c        smokeCompose
	root     string
	chatpipe string            // the binary
	ips      map[string]string // service instance -> loopback IP
	kafka    string            // the stand-in broker's 127.0.0.1:port
	procs    []*smokeProc
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// instance names replica r of a service ("worker-2"); a one-replica
// service is its name.
func (s *smokeStack) instance(name string, r int) string {
	if s.c.Services[name].replicas() == 1 {
		return name
	}
	return fmt.Sprintf("%s-%d", name, r+1)
}

// assignAddresses gives every service instance its own loopback address in
// a random 127.X.Y.0/24, so that the compose file's fixed ports (2379,
// 5432, 7071, …) do not collide with anything else on the machine.
func (s *smokeStack) assignAddresses() {
	x, y := 100+rand.IntN(150), 1+rand.IntN(250)
	s.ips = map[string]string{}
	n := 10
	for _, name := range sortedKeys(s.c.Services) {
		for r := 0; r < s.c.Services[name].replicas(); r++ {
			s.ips[s.instance(name, r)] = fmt.Sprintf("127.%d.%d.%d", x, y, n)
			n++
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.t.Fatal(err)
	}
	s.kafka = l.Addr().String()
	l.Close()
}

var hostPort = regexp.MustCompile(`(^|[/@,])([A-Za-z0-9][A-Za-z0-9_.-]*):(\d+)`)

// rewrite maps one argument or value as seen by instance inst: another
// service's name:port becomes its loopback address (the Kafka services
// all become the stand-in broker), a wildcard or loopback listen address
// becomes inst's own.
func (s *smokeStack) rewrite(inst, v string) string {
	return hostPort.ReplaceAllStringFunc(v, func(m string) string {
		sub := hostPort.FindStringSubmatch(m)
		pre, host, port := sub[1], sub[2], sub[3]
		switch {
		case host == "0.0.0.0" || host == "127.0.0.1" || host == "localhost":
			return pre + s.ips[inst] + ":" + port
		case s.isKafka(host):
			return pre + s.kafka
		}
		if _, ok := s.c.Services[host]; ok {
			if s.c.Services[host].replicas() != 1 {
				s.t.Fatalf("%s refers to %s, a service of several replicas, by name", inst, host)
			}
			return pre + s.ips[host] + ":" + port
		}
		return m
	})
}

func (s *smokeStack) isKafka(name string) bool {
	svc, ok := s.c.Services[name]
	return ok && strings.HasPrefix(svc.Image, "apache/kafka") && name != "topic"
}

// rewriteAll rewrites args, and container paths of the service's volumes
// into directories of the test.
func (s *smokeStack) rewriteAll(inst string, args []string, volumes []string) []string {
	paths := map[string]string{}
	for _, v := range volumes {
		src, dst, ok := strings.Cut(v, ":")
		if !ok {
			s.t.Fatalf("%s: volume %q", inst, v)
		}
		dst, _, _ = strings.Cut(dst, ":")
		dir := filepath.Join(s.root, "volumes", inst+"-"+filepath.Base(src))
		if !strings.Contains(src, "/") { // a named volume: one for every service that mounts it
			dir = filepath.Join(s.root, "volumes", src)
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			s.t.Fatal(err)
		}
		paths[dst] = dir
	}
	out := make([]string, len(args))
	for i, a := range args {
		a = s.rewrite(inst, a)
		for dst, dir := range paths {
			if a == dst {
				a = dir
			} else if k, v, ok := strings.Cut(a, "="); ok && (v == dst || strings.HasPrefix(v, dst+"/")) {
				a = k + "=" + dir + strings.TrimPrefix(v, dst)
			}
		}
		out[i] = a
	}
	return out
}

// env is the environment of a chatpipe instance: the compose file's, mapped,
// and nothing of the test's own (no CHATPIPE_ variable leaks in).
func (s *smokeStack) env(inst string, compose map[string]any) []string {
	// HOSTNAME: Docker sets it to each container's own name, and a worker
	// without --id is named for it.
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + s.root, "TMPDIR=" + os.TempDir(), "HOSTNAME=" + inst}
	for _, k := range sortedKeys(compose) {
		env = append(env, k+"="+s.rewrite(inst, fmt.Sprint(compose[k])))
	}
	return env
}

// checkEnv: every variable the compose file gives a chatpipe service must
// be one its command reads, CHATPIPE_<FLAG> of one of its flags.
func (s *smokeStack) checkEnv(name string, svc smokeService) {
	if len(svc.Command) == 0 {
		s.t.Fatalf("%s has no command", name)
	}
	out, _ := exec.Command(s.chatpipe, svc.Command[0], "-h").CombinedOutput()
	flags := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if f, ok := strings.CutPrefix(line, "  -"); ok {
			flags[strings.Fields(f)[0]] = true
		}
	}
	if len(flags) == 0 {
		s.t.Fatalf("%s: `chatpipe %s -h` lists no flags:\n%s", name, svc.Command[0], out)
	}
	for k := range svc.Environment {
		f, ok := strings.CutPrefix(k, "CHATPIPE_")
		if !ok || !flags[strings.ReplaceAll(strings.ToLower(f), "_", "-")] {
			s.t.Errorf("%s: environment %s is read by nothing (`chatpipe %s` reads CHATPIPE_<FLAG> of its flags)", name, k, svc.Command[0])
		}
	}
}

// smokeProc is one process of the stack.
type smokeProc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

func (s *smokeStack) start(name, bin string, args, env []string, cred *syscall.Credential) *smokeProc {
	s.t.Helper()
	logPath := filepath.Join(s.root, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if env != nil {
		cmd.Env = env
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start %s: %v", name, err)
	}
	p := &smokeProc{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { cmd.Wait(); f.Close(); close(p.done) }()
	s.t.Cleanup(func() {
		select {
		case <-p.done:
			return
		default:
		}
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-p.done
		}
	})
	s.procs = append(s.procs, p)
	return p
}

// waitHealthy waits for probe to pass, failing with the process's log if
// it exits first.
func (s *smokeStack) waitHealthy(inst string, probe func() error) {
	s.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	var err error
	for time.Now().Before(deadline) {
		if err = probe(); err == nil {
			return
		}
		for _, p := range s.procs {
			select {
			case <-p.done:
				s.t.Fatalf("%s exited (%v) while waiting for %s; its log:\n%s", p.name, p.cmd.ProcessState, inst, stacktest.Tail(p.log))
			default:
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	s.t.Fatalf("%s not healthy after 3 minutes: %v; log:\n%s", inst, err, stacktest.Tail(filepath.Join(s.root, inst+".log")))
}

func httpOK(url string) error {
	cl := http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s %s", url, resp.Status, bytes.TrimSpace(b))
	}
	return nil
}

// runToCompletion runs the chatpipe binary to its exit, like a one-shot
// service that must complete successfully.
func (s *smokeStack) runToCompletion(name string, args, env []string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.chatpipe, args...)
	if env != nil {
		cmd.Env = env
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err := cmd.Run()
	os.WriteFile(filepath.Join(s.root, name+".log"), out.Bytes(), 0o644)
	return out.String(), err
}

// startPostgres does what the postgres image's entrypoint does with the
// service's environment, with devstack's Postgres: initdb with
// POSTGRES_USER as superuser, its POSTGRES_PASSWORD, POSTGRES_INITDB_ARGS
// and password authentication over TCP, then the server on the service's
// address, then POSTGRES_DB.
func (s *smokeStack) startPostgres() {
	t := s.t
	svc, ok := s.c.Services["postgres"]
	if !ok || !strings.HasPrefix(svc.Image, "postgres:") {
		t.Fatalf("compose file has no postgres service of the postgres image")
	}
	env := map[string]string{}
	for k, v := range svc.Environment {
		switch k {
		case "POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB", "POSTGRES_INITDB_ARGS":
			env[k] = fmt.Sprint(v)
		default:
			t.Fatalf("postgres: environment %s is not one this test knows the image for", k)
		}
	}
	pgUser, pgDB := env["POSTGRES_USER"], env["POSTGRES_DB"]
	if pgUser == "" {
		pgUser = "postgres"
	}
	if pgDB == "" {
		pgDB = pgUser
	}
	if env["POSTGRES_PASSWORD"] == "" {
		t.Fatalf("postgres: no POSTGRES_PASSWORD (the image refuses to start without one)")
	}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			t.Skipf("running as root without a postgres OS user: %v", err)
		}
	}
	// The server's log (pg/postgres.log) shows beside the other services'.
	if err := os.Symlink(filepath.Join("pg", "postgres.log"), filepath.Join(s.root, "postgres.log")); err != nil {
		t.Fatal(err)
	}
	p, err := devstack.StartPostgresWith(context.Background(), filepath.Join(s.root, "pg"), 5432, devstack.PostgresSetup{
		Listen:     s.ips["postgres"],
		Superuser:  pgUser,
		Password:   env["POSTGRES_PASSWORD"],
		InitdbArgs: strings.Fields(env["POSTGRES_INITDB_ARGS"]),
		Database:   pgDB,
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("postgres: %v", err)
	}
	t.Cleanup(func() { // after the roles' clean-ups: registered before they start
		if err := p.Close(); err != nil {
			t.Errorf("postgres: %v", err)
		}
	})
}

// postgresReady runs the service's own healthcheck (pg_isready) as the
// container would, its loopback address mapped to the service's.
func (s *smokeStack) postgresReady(pgBin string) error {
	hc := s.c.Services["postgres"].Healthcheck
	if hc == nil || len(hc.Test) < 2 {
		return fmt.Errorf("postgres has no healthcheck")
	}
	var cmd *exec.Cmd
	switch hc.Test[0] {
	case "CMD-SHELL":
		cmd = exec.Command("sh", "-c", s.rewriteShell("postgres", strings.Join(hc.Test[1:], " ")))
	case "CMD":
		cmd = exec.Command(hc.Test[1], s.rewriteAll("postgres", hc.Test[2:], nil)...)
	default:
		return fmt.Errorf("postgres healthcheck %q", hc.Test)
	}
	cmd.Env = []string{"PATH=" + pgBin + ":" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("healthcheck %q: %v: %s", cmd.Args, err, out)
	}
	return nil
}

// rewriteShell maps a shell command's loopback host (-h 127.0.0.1) to the
// service's address.
func (s *smokeStack) rewriteShell(inst, sh string) string {
	return regexp.MustCompile(`\b(127\.0\.0\.1|localhost)\b`).ReplaceAllString(sh, s.ips[inst])
}

// startKafka starts the stand-in broker with the topic the topic service
// creates: its kafka-topics.sh arguments are read, not assumed.
func (s *smokeStack) startKafka() {
	t := s.t
	svc, ok := s.c.Services["topic"]
	if !ok || len(svc.Command) == 0 || !strings.HasSuffix(svc.Command[0], "/kafka-topics.sh") {
		t.Fatalf("compose file has no topic service running kafka-topics.sh: %+v", svc)
	}
	args := svc.Command[1:]
	if _, ok := deploy.FlagValue(args, "create"); !ok && !contains(args, "--create") {
		t.Fatalf("topic service does not --create: %q", args)
	}
	bootstrap, _ := deploy.FlagValue(args, "bootstrap-server")
	if s.rewrite("topic", bootstrap) != s.kafka {
		t.Fatalf("topic service's --bootstrap-server %q is not a Kafka service of the file", bootstrap)
	}
	topic, ok1 := deploy.FlagValue(args, "topic")
	partitions, ok2 := deploy.FlagValue(args, "partitions")
	rf, ok3 := deploy.FlagValue(args, "replication-factor")
	if !ok1 || !ok2 || !ok3 {
		t.Fatalf("topic service lacks --topic, --partitions or --replication-factor: %q", args)
	}
	configs := map[string]string{}
	for i, a := range args {
		if a == "--config" && i+1 < len(args) {
			k, v, _ := strings.Cut(args[i+1], "=")
			configs[k] = v
		}
	}
	brokers := 0
	for name := range s.c.Services {
		if s.isKafka(name) {
			brokers++
		}
	}
	n, err := strconv.Atoi(rf)
	if err != nil || n > brokers {
		t.Errorf("topic service: --replication-factor %s with %d brokers", rf, brokers)
	}
	if configs["retention.ms"] != "-1" {
		t.Errorf("topic service: retention.ms %q: the log must be kept forever", configs["retention.ms"])
	}
	// A write needs min.insync.replicas in sync: equal to the replication
	// factor, one broker down stops every write.
	if mi, err := strconv.Atoi(configs["min.insync.replicas"]); err != nil || mi < 1 || mi >= n {
		t.Errorf("topic service: min.insync.replicas %q with replication factor %s", configs["min.insync.replicas"], rf)
	}
	_, port, _ := net.SplitHostPort(s.kafka)
	s.start("kafka", s.chatpipe, []string{"kafka", "--data-dir", filepath.Join(s.root, "kafka"), "--port", port,
		"--topic", topic, "--partitions", partitions, "--log-level", "warn"}, nil, nil)
	s.waitHealthy("kafka", func() error {
		conn, err := net.DialTimeout("tcp", s.kafka, time.Second)
		if err == nil {
			conn.Close()
		}
		return err
	})
	// The broker creates the topic as it starts; init checks its partitions.
	time.Sleep(500 * time.Millisecond)
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// workerLabel is the worker label of chatpipe_worker_owned_shards on a
// worker's /metrics.
func workerLabel(t *testing.T, metricsURL string) string {
	t.Helper()
	for _, m := range stacktest.Scrape(t, metricsURL)["chatpipe_worker_owned_shards"].GetMetric() {
		if w := promtext.Label(m, "worker"); w != "" {
			return w
		}
	}
	t.Fatalf("%s: no chatpipe_worker_owned_shards with a worker label", metricsURL)
	return ""
}
