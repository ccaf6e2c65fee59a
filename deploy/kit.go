// Package deploy holds the operator's kit: the Grafana dashboard
// (grafana/), the Prometheus scrape config and alert rules (prometheus/)
// and the compose file that runs a stack with them (docker-compose/). Its
// tests are the kit's checks: every metric the dashboard and the alerts
// name is one a running stack exports, Prometheus scrapes every role the
// compose file runs, and the dashboard matches its schema. The Go code
// here reads the kit's files for those checks and for e2e's compose smoke
// test, which runs the compose file's stack.
package deploy

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The kit's files, relative to this directory.
const (
	DashboardFile       = "grafana/chatpipe.json"
	DashboardSchemaFile = "grafana/dashboard.schema.json"
	DatasourceFile      = "grafana/provisioning/datasources/prometheus.yml"
	AlertsFile          = "prometheus/alerts.yml"
	PrometheusFile      = "prometheus/prometheus.yml"
	ComposeFile         = "docker-compose/docker-compose.yml"
)

// Dashboard is the part of the Grafana dashboard the checks read.
type Dashboard struct {
	UID        string      `json:"uid"`
	Panels     []DashPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Query string `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// DashPanel is a dashboard panel: a row holds Panels, any other panel
// Targets, its Prometheus queries.
type DashPanel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *DashSource `json:"datasource"`
	Targets    []struct {
		Expr       string      `json:"expr"`
		Datasource *DashSource `json:"datasource"`
	} `json:"targets"`
	Panels []DashPanel `json:"panels"`
}

// DashSource names a panel's or a query's data source.
type DashSource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// ReadDashboard reads the dashboard at path (DashboardFile under this
// directory); an error fails t.
func ReadDashboard(t testing.TB, path string) Dashboard {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d Dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return d
}

// ReadYAML decodes the YAML file at path into into (through JSON, so
// into's json tags apply); an error fails t.
func ReadYAML(t testing.TB, path string, into any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// FlagValue returns the value of --name in a command line's args
// ("--name v" or "--name=v"; -name too), and whether it is there.
func FlagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		switch {
		case a == "--"+name || a == "-"+name:
			if i+1 < len(args) {
				return args[i+1], true
			}
		case strings.HasPrefix(a, "--"+name+"="):
			return strings.TrimPrefix(a, "--"+name+"="), true
		}
	}
	return "", false
}
