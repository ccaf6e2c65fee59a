// Package promtext reads the Prometheus text format: a /metrics page, or a
// snapshot of one saved to a file. It is the module's one reader of that
// format, the Prometheus text parser (expfmt) behind a few helpers, so the
// tests, the pipeline page and the benchmark report read a page the same
// way.
//
// One input is one page. Two pages joined end to end are not one page: a
// metric family both export appears twice, which the parser refuses, so
// each page is parsed on its own and the results added up.
package promtext

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Parse reads one page in the Prometheus text format and returns its
// metric families by name. A family without samples is left out.
func Parse(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse Prometheus text: %w", err)
	}
	return fams, nil
}

// ParseFile is Parse of the page saved in the file at path.
func ParseFile(path string) (map[string]*dto.MetricFamily, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fams, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return fams, nil
}

// Sum adds up the samples of the family name (a counter, gauge or
// untyped one; a histogram's or summary's count as 0) over the series
// that have every one of labels, each written name="value" as on a page
// (a value without quotes is taken as it stands). Without labels it sums
// every series; it is 0 when families has no such family.
func Sum(families map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	type pair struct{ name, value string }
	want := make([]pair, 0, len(labels))
	for _, l := range labels {
		k, v, _ := strings.Cut(l, "=")
		if u, err := strconv.Unquote(v); err == nil {
			v = u
		}
		want = append(want, pair{k, v})
	}
	sum := 0.0
next:
	for _, m := range families[name].GetMetric() {
		for _, w := range want {
			if v, ok := label(m, w.name); !ok || v != w.value {
				continue next
			}
		}
		sum += Value(m)
	}
	return sum
}

// Value is a sample's value: a counter's, gauge's or untyped metric's; 0
// for a histogram or a summary.
func Value(m *dto.Metric) float64 {
	return m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
}

// Label is the value of the series' label name ("" when it has none).
func Label(m *dto.Metric, name string) string {
	v, _ := label(m, name)
	return v
}

func label(m *dto.Metric, name string) (string, bool) {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue(), true
		}
	}
	return "", false
}
