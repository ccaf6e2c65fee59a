package web

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/chatpipe/chatpipe/internal/promtext"
)

// metricSample holds the chatpipe_* metrics of one or more /metrics pages:
// those with a worker label by worker, the others summed over their label
// sets. Histograms appear as <name>_sum and <name>_count. A series with a
// result label is also summed under <name>{result=<value>}
// (gatewayAccepted).
type metricSample struct {
	global  map[string]float64
	workers map[string]map[string]float64
}

func newMetricSample() *metricSample {
	return &metricSample{global: map[string]float64{}, workers: map[string]map[string]float64{}}
}

// parse adds the chatpipe_* metrics of a Prometheus text page to s.
func (s *metricSample) parse(text []byte) error {
	fams, err := promtext.Parse(bytes.NewReader(text))
	if err != nil {
		return fmt.Errorf("web: metrics: %w", err)
	}
	for name, f := range fams {
		if !strings.HasPrefix(name, "chatpipe_") {
			continue
		}
		for _, m := range f.GetMetric() {
			into := s.global
			if w := promtext.Label(m, "worker"); w != "" {
				if s.workers[w] == nil {
					s.workers[w] = map[string]float64{}
				}
				into = s.workers[w]
			}
			if r := promtext.Label(m, "result"); r != "" && m.Counter != nil {
				into[name+"{result="+r+"}"] += m.Counter.GetValue()
			}
			switch {
			case m.Counter != nil:
				into[name] += m.Counter.GetValue()
			case m.Gauge != nil:
				into[name] += m.Gauge.GetValue()
			case m.Untyped != nil:
				into[name] += m.Untyped.GetValue()
			case m.Histogram != nil:
				into[name+"_sum"] += m.Histogram.GetSampleSum()
				into[name+"_count"] += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return nil
}

// gatewayAccepted is the sample key of the commands the gateways answered
// accepted.
const gatewayAccepted = "chatpipe_gateway_commands_total{result=accepted}"
