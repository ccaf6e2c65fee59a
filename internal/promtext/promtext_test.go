package promtext

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// page is a worker's /metrics as promhttp writes it, with a histogram, a
// gauge, an untyped sample and a label value that needs escapes.
const page = `# HELP chatpipe_worker_commits_total Kafka transactions committed.
# TYPE chatpipe_worker_commits_total counter
chatpipe_worker_commits_total{worker="w1"} 1.2100478e+07
# HELP chatpipe_gateway_commands_total Commands answered.
# TYPE chatpipe_gateway_commands_total counter
chatpipe_gateway_commands_total{code="",op="join",result="accepted"} 3
chatpipe_gateway_commands_total{code="",op="send",result="accepted"} 40
chatpipe_gateway_commands_total{code="forbidden",op="join",result="rejected"} 2
# HELP chatpipe_worker_commit_seconds Time to commit one transaction.
# TYPE chatpipe_worker_commit_seconds histogram
chatpipe_worker_commit_seconds_bucket{worker="w1",le="0.001"} 1
chatpipe_worker_commit_seconds_bucket{worker="w1",le="+Inf"} 4
chatpipe_worker_commit_seconds_sum{worker="w1"} 0.25
chatpipe_worker_commit_seconds_count{worker="w1"} 4
# HELP chatpipe_worker_owned_shards Vshards this worker is accepting for.
# TYPE chatpipe_worker_owned_shards gauge
chatpipe_worker_owned_shards{worker="w1"} 5
chatpipe_build_info{version="a \"quoted\" one,{x}"} 1
`

func TestParseAndSum(t *testing.T) {
	fams, err := Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"chatpipe_worker_commits_total", nil, 12100478},
		{"chatpipe_gateway_commands_total", nil, 45},
		{"chatpipe_gateway_commands_total", []string{`result="accepted"`}, 43},
		{"chatpipe_gateway_commands_total", []string{`op="join"`, `result="accepted"`}, 3},
		{"chatpipe_gateway_commands_total", []string{`op=join`}, 5},
		{"chatpipe_gateway_commands_total", []string{`code=""`}, 43},
		{"chatpipe_gateway_commands_total", []string{`worker="w1"`}, 0},
		{"chatpipe_worker_owned_shards", []string{`worker="w1"`}, 5},
		{"chatpipe_worker_commit_seconds", nil, 0},
		{"chatpipe_build_info", []string{`version="a \"quoted\" one,{x}"`}, 1},
		{"chatpipe_no_such_metric", nil, 0},
	} {
		if got := Sum(fams, c.name, c.labels...); got != c.want {
			t.Errorf("Sum(%s, %q) = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if h := fams["chatpipe_worker_commit_seconds"].GetMetric()[0].GetHistogram(); h.GetSampleCount() != 4 || h.GetSampleSum() != 0.25 {
		t.Errorf("histogram: count %d, sum %v; want 4 and 0.25", h.GetSampleCount(), h.GetSampleSum())
	}
	m := fams["chatpipe_worker_owned_shards"].GetMetric()[0]
	if Label(m, "worker") != "w1" || Label(m, "nope") != "" {
		t.Errorf("Label: worker %q, nope %q; want w1 and empty", Label(m, "worker"), Label(m, "nope"))
	}
}

// Two pages joined end to end repeat a family, which the parser refuses:
// each page is parsed on its own.
func TestJoinedPagesAreParsedApart(t *testing.T) {
	w1 := "# TYPE chatpipe_worker_events_total counter\nchatpipe_worker_events_total{worker=\"w1\"} 10\n"
	w2 := "# TYPE chatpipe_worker_events_total counter\nchatpipe_worker_events_total{worker=\"w2\"} 32\n"
	if _, err := Parse(strings.NewReader(w1 + w2)); err == nil {
		t.Fatal("two joined pages parsed as one")
	}
	sum := 0.0
	for _, p := range []string{w1, w2} {
		fams, err := Parse(strings.NewReader(p))
		if err != nil {
			t.Fatal(err)
		}
		sum += Sum(fams, "chatpipe_worker_events_total")
	}
	if sum != 42 {
		t.Errorf("sum over both pages = %v, want 42", sum)
	}
}

func TestParseFile(t *testing.T) {
	dir := t.TempDir()
	good, bad, empty := filepath.Join(dir, "good"), filepath.Join(dir, "bad"), filepath.Join(dir, "empty")
	for p, s := range map[string]string{good: page, bad: "chatpipe_x{worker=\"w1\" 3\n", empty: ""} {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if fams, err := ParseFile(good); err != nil || Sum(fams, "chatpipe_worker_owned_shards") != 5 {
		t.Errorf("ParseFile(good): %v, %v", fams, err)
	}
	if fams, err := ParseFile(empty); err != nil || len(fams) != 0 {
		t.Errorf("ParseFile(empty) = %v, %v; want no families and no error", fams, err)
	}
	if _, err := ParseFile(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("ParseFile(bad) = %v, want an error naming the file", err)
	}
	if _, err := ParseFile(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ParseFile(missing) = %v, want fs.ErrNotExist", err)
	}
}
