package deploy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/chatpipe/chatpipe/deploy"
	"github.com/chatpipe/chatpipe/internal/clustersec"
	"github.com/chatpipe/chatpipe/internal/stacktest"
)

// TestMain builds the chatpipe binary for the checks that run a stack
// once, when the first of them starts one, and removes it at the end.
func TestMain(m *testing.M) { os.Exit(stacktest.Run(m)) }

// exportedMetrics returns the names a /metrics page offers, with a
// histogram's _bucket, _sum and _count series and a summary's _sum and
// _count.
func exportedMetrics(t *testing.T, url string) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for name, f := range stacktest.Scrape(t, url) {
		names[name] = true
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			names[name+"_sum"], names[name+"_count"] = true, true
		}
	}
	return names
}

// linkTLSGatewayMetrics returns the metric names of a `chatpipe gateway`
// on dev's stack whose link is mutual TLS (certificates from `chatpipe
// init --link-certs`): what a gateway exports only then, such as
// chatpipe_link_cert_expiry_seconds.
func linkTLSGatewayMetrics(t *testing.T, dev *stacktest.Dev) map[string]bool {
	t.Helper()
	link := filepath.Join(t.TempDir(), "link")
	if out, err := exec.Command(stacktest.Binary(t), "init", "--link-certs", link).CombinedOutput(); err != nil {
		t.Fatalf("init --link-certs: %v\n%s", err, out)
	}
	f := clustersec.LinkDir(link, clustersec.RoleGateway)
	port, adminPort := stacktest.FreePort(t), stacktest.FreePort(t)
	stacktest.StartProc(t, dev.Dir, "gateway-link-tls", nil, "gateway", "--endpoints", filepath.Join(dev.Dir, "endpoints.json"),
		"--data-dir", dev.Dir, "--http", "127.0.0.1:"+strconv.Itoa(port), "--admin", "127.0.0.1:"+strconv.Itoa(adminPort), "--log-level", "warn",
		"--link-tls-ca", f.CA, "--link-tls-cert", f.Cert, "--link-tls-key", f.Key)
	stacktest.WaitFor(t, 60*time.Second, "the link TLS gateway to listen", func() bool { return stacktest.Dialable(port) && stacktest.Dialable(adminPort) })
	return exportedMetrics(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", adminPort))
}

var (
	promqlString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promqlMatchers = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	// The metric families the kit refers to: chatpipe's own, the Go and
	// process collectors every role registers, and Prometheus' own `up`.
	promqlMetric = regexp.MustCompile(`\b(?:(?:chatpipe|go|process)_[a-zA-Z0-9_]*|up)\b`)
)

// metricNames returns the metric names an expression refers to (leaving
// out label values, label matchers and ranges).
func metricNames(expr string) []string {
	e := promqlString.ReplaceAllString(expr, `""`)
	e = promqlMatchers.ReplaceAllString(e, "")
	return promqlMetric.FindAllString(e, -1)
}

type alertRules struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert string `json:"alert"`
			Expr  string `json:"expr"`
		} `json:"rules"`
	} `json:"groups"`
}

// TestDashboardAndAlertsUseExportedMetrics: every metric name in the
// dashboard's queries and the alert rules is one the code exports, read
// off a running stack's /metrics (all roles in one process), so a renamed
// or invented metric fails here instead of showing an empty panel or an
// alert that can never fire.
func TestDashboardAndAlertsUseExportedMetrics(t *testing.T) {
	p := stacktest.StartDev(t, t.TempDir())
	have := exportedMetrics(t, p.EP.Admin+"/metrics")
	if !have["chatpipe_worker_owned_shards"] || !have["go_goroutines"] {
		t.Fatalf("the dev stack's /metrics lacks the worker's or Go's metrics: %v", have)
	}
	have["up"] = true // written by Prometheus for every target it scrapes
	// A gateway or worker exports its link certificate's expiry only when
	// its link is mutual TLS, which dev's own gateway's is not.
	for n := range linkTLSGatewayMetrics(t, p) {
		have[n] = true
	}

	check := func(where, expr string) {
		t.Helper()
		names := metricNames(expr)
		if len(names) == 0 {
			t.Errorf("%s: no metric name in %q", where, expr)
		}
		for _, n := range names {
			if !have[n] {
				t.Errorf("%s: %s is not exported by chatpipe (expr %q)", where, n, expr)
			}
		}
	}

	d := deploy.ReadDashboard(t, deploy.DashboardFile)
	var ds struct {
		Datasources []struct {
			UID string `json:"uid"`
		} `json:"datasources"`
	}
	deploy.ReadYAML(t, deploy.DatasourceFile, &ds)
	if len(ds.Datasources) != 1 {
		t.Fatalf("%s: want one data source, have %d", deploy.DatasourceFile, len(ds.Datasources))
	}
	uid := ds.Datasources[0].UID
	ids := map[int]bool{}
	queries := 0
	var walk func([]deploy.DashPanel)
	walk = func(ps []deploy.DashPanel) {
		for _, pn := range ps {
			if ids[pn.ID] {
				t.Errorf("dashboard: panel id %d used twice", pn.ID)
			}
			ids[pn.ID] = true
			walk(pn.Panels)
			if pn.Type == "row" {
				continue
			}
			if pn.Datasource == nil || pn.Datasource.UID != uid {
				t.Errorf("dashboard panel %q: data source %+v, want uid %q (provisioned)", pn.Title, pn.Datasource, uid)
			}
			if len(pn.Targets) == 0 {
				t.Errorf("dashboard panel %q has no query", pn.Title)
			}
			for _, tg := range pn.Targets {
				queries++
				if tg.Datasource != nil && tg.Datasource.UID != uid {
					t.Errorf("dashboard panel %q: query data source %q, want %q", pn.Title, tg.Datasource.UID, uid)
				}
				check(fmt.Sprintf("dashboard panel %q", pn.Title), tg.Expr)
			}
		}
	}
	walk(d.Panels)
	if queries < 10 {
		t.Errorf("dashboard: only %d queries", queries)
	}

	var rules alertRules
	deploy.ReadYAML(t, deploy.AlertsFile, &rules)
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts++
			check("alert "+r.Alert, r.Expr)
		}
	}
	if alerts == 0 {
		t.Fatalf("%s: no rules", deploy.AlertsFile)
	}
}

// composeFile is the part of the compose file the kit's checks read.
type composeFile struct {
	Services map[string]struct {
		Image       string         `json:"image"`
		Command     []string       `json:"command"`
		Environment map[string]any `json:"environment"`
		Healthcheck *struct {
			Test []string `json:"test"`
		} `json:"healthcheck"`
		Volumes []string `json:"volumes"`
	} `json:"services"`
}

func readCompose(t *testing.T) composeFile {
	t.Helper()
	var c composeFile
	deploy.ReadYAML(t, deploy.ComposeFile, &c)
	if len(c.Services) == 0 {
		t.Fatalf("%s: no services", deploy.ComposeFile)
	}
	return c
}

// TestComposePrometheusScrapesEveryRole: every chatpipe role of the
// compose file has an --admin address, and the compose file's Prometheus
// scrapes exactly that service and port; the vshard count the alert and
// the dashboard compare with is the one the compose file's init writes.
func TestComposePrometheusScrapesEveryRole(t *testing.T) {
	c := readCompose(t)
	var prom struct {
		ScrapeConfigs []struct {
			JobName       string `json:"job_name"`
			StaticConfigs []struct {
				Targets []string `json:"targets"`
			} `json:"static_configs"`
			DNSSDConfigs []struct {
				Names []string `json:"names"`
				Type  string   `json:"type"`
				Port  int      `json:"port"`
			} `json:"dns_sd_configs"`
		} `json:"scrape_configs"`
	}
	deploy.ReadYAML(t, deploy.PrometheusFile, &prom)
	scraped := map[string]string{} // host:port -> job
	for _, sc := range prom.ScrapeConfigs {
		for _, s := range sc.StaticConfigs {
			for _, tg := range s.Targets {
				scraped[tg] = sc.JobName
			}
		}
		for _, d := range sc.DNSSDConfigs {
			for _, n := range d.Names {
				scraped[fmt.Sprintf("%s:%d", n, d.Port)] = sc.JobName
			}
		}
	}
	roles := map[string]bool{"gateway": true, "worker": true, "persist": true}
	seen := 0
	for name, s := range c.Services {
		if len(s.Command) == 0 || !roles[s.Command[0]] {
			continue
		}
		seen++
		admin, ok := deploy.FlagValue(s.Command, "admin")
		if !ok {
			t.Errorf("compose service %s (%s) has no --admin address: its metrics are on a random loopback port", name, s.Command[0])
			continue
		}
		port := admin[strings.LastIndex(admin, ":")+1:]
		target := name + ":" + port
		if job, ok := scraped[target]; !ok {
			t.Errorf("compose service %s serves /metrics on %s, which prometheus.yml does not scrape (it scrapes %v)", name, admin, scraped)
		} else if job != s.Command[0] {
			t.Errorf("prometheus.yml scrapes %s as job %q; the dashboard groups by the role name %q", target, job, s.Command[0])
		}
	}
	if seen != len(roles) {
		t.Errorf("compose file runs %d of the %d roles", seen, len(roles))
	}

	// The vshards without a live owner: the alert reads the gateways'
	// count, which needs no copy of the deployment's vshard count; the
	// dashboard's constant is the compose init's.
	vshards, ok := deploy.FlagValue(c.Services["init"].Command, "vshards")
	if !ok {
		t.Fatal("compose init has no --vshards")
	}
	var rules alertRules
	deploy.ReadYAML(t, deploy.AlertsFile, &rules)
	found := false
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "ChatpipeVShardWithoutLiveOwner" {
				found = true
				if !strings.Contains(r.Expr, "chatpipe_gateway_unowned_vshards") || regexp.MustCompile(`[<>] *[1-9][0-9]*`).MatchString(r.Expr) {
					t.Errorf("ChatpipeVShardWithoutLiveOwner should alert on chatpipe_gateway_unowned_vshards > 0, without a copy of the vshard count: %q", r.Expr)
				}
			}
		}
	}
	if !found {
		t.Error("no ChatpipeVShardWithoutLiveOwner alert")
	}
	d := deploy.ReadDashboard(t, deploy.DashboardFile)
	for _, v := range d.Templating.List {
		if v.Name == "vshards" && v.Query != vshards {
			t.Errorf("dashboard variable vshards is %s, the compose init's --vshards %s", v.Query, vshards)
		}
	}

	// Every long-running service has a healthcheck. chatpipe's image is
	// distroless: its roles run `chatpipe probe` of the /readyz on their
	// own --admin port.
	var missing []string
	for name, s := range c.Services {
		if name == "topic" || name == "init" {
			continue
		}
		if s.Healthcheck == nil {
			missing = append(missing, name)
			continue
		}
		if s.Image != "chatpipe:local" {
			continue
		}
		admin, _ := deploy.FlagValue(s.Command, "admin")
		want := []string{"CMD", "/usr/local/bin/chatpipe", "probe"}
		url := "http://127.0.0.1:" + admin[strings.LastIndex(admin, ":")+1:] + "/readyz"
		test := s.Healthcheck.Test
		if len(test) < len(want)+1 || strings.Join(test[:len(want)], " ") != strings.Join(want, " ") || test[len(test)-1] != url {
			t.Errorf("compose service %s: healthcheck %q, want [%s … %s]", name, test, strings.Join(want, " "), url)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("compose services without a healthcheck: %v", missing)
	}
}

// dashboardSchema compiles deploy/grafana/dashboard.schema.json.
func dashboardSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	b, err := os.ReadFile(deploy.DashboardSchemaFile)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s: %v", deploy.DashboardSchemaFile, err)
	}
	const url = "https://chatpipe.dev/schemas/grafana-dashboard.json"
	c := jsonschema.NewCompiler()
	if err := c.AddResource(url, doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		t.Fatalf("%s: %v", deploy.DashboardSchemaFile, err)
	}
	return sch
}

// gridOverlaps names the panels of ps (nested rows' panels included) that
// do not fit the 24-column grid or cover a cell another panel covers.
func gridOverlaps(ps []any) []string {
	type cell struct{ x, y int }
	taken := map[cell]string{}
	var bad []string
	var walk func([]any)
	walk = func(ps []any) {
		for _, p := range ps {
			pm, _ := p.(map[string]any)
			g, _ := pm["gridPos"].(map[string]any)
			title, _ := pm["title"].(string)
			num := func(k string) int { n, _ := g[k].(json.Number).Int64(); return int(n) }
			x, y, w, h := num("x"), num("y"), num("w"), num("h")
			if x+w > 24 {
				bad = append(bad, fmt.Sprintf("%q ends at column %d of 24", title, x+w))
			}
			for i := x; i < x+w; i++ {
				for j := y; j < y+h; j++ {
					if other, ok := taken[cell{i, j}]; ok {
						bad = append(bad, fmt.Sprintf("%q overlaps %q at column %d, row %d", title, other, i, j))
						return
					}
					taken[cell{i, j}] = title
				}
			}
			if sub, ok := pm["panels"].([]any); ok {
				walk(sub)
			}
		}
	}
	walk(ps)
	return bad
}

// TestDashboardMatchesSchema validates the shipped Grafana dashboard
// against the schema of what Grafana's dashboard model requires of it
// (deploy/grafana/dashboard.schema.json) and checks that its panels tile
// the 24-column grid without overlapping; dashboards that break each rule
// are refused, so the check can fail.
func TestDashboardMatchesSchema(t *testing.T) {
	sch := dashboardSchema(t)
	b, err := os.ReadFile(deploy.DashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	load := func() map[string]any {
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", deploy.DashboardFile, err)
		}
		return v.(map[string]any)
	}
	d := load()
	if err := sch.Validate(d); err != nil {
		t.Fatalf("%s does not match %s: %v", deploy.DashboardFile, deploy.DashboardSchemaFile, err)
	}
	if bad := gridOverlaps(d["panels"].([]any)); len(bad) > 0 {
		t.Fatalf("%s: panels off the grid: %s", deploy.DashboardFile, strings.Join(bad, "; "))
	}

	panel := func(d map[string]any, i int) map[string]any { return d["panels"].([]any)[i].(map[string]any) }
	firstQuery := func(d map[string]any) (map[string]any, map[string]any) {
		for i := range d["panels"].([]any) {
			if p := panel(d, i); p["type"] != "row" {
				return p, p["targets"].([]any)[0].(map[string]any)
			}
		}
		t.Fatal("the dashboard has no query panel")
		return nil, nil
	}
	for name, breakIt := range map[string]func(map[string]any){
		"no uid":               func(d map[string]any) { delete(d, "uid") },
		"a 41-character uid":   func(d map[string]any) { d["uid"] = strings.Repeat("u", 41) },
		"an old schemaVersion": func(d map[string]any) { d["schemaVersion"] = 16.0 },
		"a misspelt field":     func(d map[string]any) { d["pannels"] = d["panels"] },
		"a panel 25 wide":      func(d map[string]any) { p, _ := firstQuery(d); p["gridPos"].(map[string]any)["w"] = 25.0 },
		"a query without refId": func(d map[string]any) {
			_, q := firstQuery(d)
			delete(q, "refId")
		},
		"a query without expr": func(d map[string]any) {
			_, q := firstQuery(d)
			delete(q, "expr")
		},
		"a panel without data source": func(d map[string]any) { p, _ := firstQuery(d); delete(p, "datasource") },
		"a Loki data source": func(d map[string]any) {
			p, _ := firstQuery(d)
			p["datasource"] = map[string]any{"type": "loki", "uid": "x"}
		},
		"an unknown panel type": func(d map[string]any) { p, _ := firstQuery(d); p["type"] = "graphh" },
		"a row with queries": func(d map[string]any) {
			panel(d, 0)["targets"] = []any{map[string]any{"refId": "A", "expr": "up"}}
		},
	} {
		d := load()
		breakIt(d)
		if err := sch.Validate(d); err == nil {
			t.Errorf("a dashboard with %s passes the schema", name)
		}
	}

	d = load()
	p, _ := firstQuery(d)
	p["gridPos"].(map[string]any)["x"] = json.Number("20") // still within the schema's 0–23, but past column 24 with its width
	if bad := gridOverlaps(d["panels"].([]any)); len(bad) == 0 {
		t.Error("a panel moved past the grid's right edge is not found")
	}
}
