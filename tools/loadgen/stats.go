package loadgen

import (
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// latency is an HDR histogram of durations in microseconds (1 µs … 10 min,
// 3 significant digits) with an interval copy for the progress line.
type latency struct {
	mu       sync.Mutex
	total    *hdrhistogram.Histogram
	interval *hdrhistogram.Histogram
}

const maxLatencyUS = int64(10 * time.Minute / time.Microsecond)

func newLatency() *latency {
	return &latency{total: hdrhistogram.New(1, maxLatencyUS, 3), interval: hdrhistogram.New(1, maxLatencyUS, 3)}
}

func (l *latency) record(d time.Duration) {
	us := min(max(d.Microseconds(), 1), maxLatencyUS)
	l.mu.Lock()
	l.total.RecordValue(us)
	l.interval.RecordValue(us)
	l.mu.Unlock()
}

// takeInterval returns the p99 of the values recorded since the last call
// and starts a new interval.
func (l *latency) takeInterval() (p99 time.Duration, n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n = l.interval.TotalCount()
	p99 = time.Duration(l.interval.ValueAtQuantile(99)) * time.Microsecond
	l.interval.Reset()
	return p99, n
}

func (l *latency) summary() Latency {
	l.mu.Lock()
	defer l.mu.Unlock()
	return summarize(l.total)
}

// Latency summarises an HDR histogram; HDR is the histogram itself
// (V2 compressed encoding, base64) for tools that want more.
type Latency struct {
	Count  int64   `json:"count"`
	MeanMS float64 `json:"mean_ms"`
	P50MS  float64 `json:"p50_ms"`
	P90MS  float64 `json:"p90_ms"`
	P99MS  float64 `json:"p99_ms"`
	P999MS float64 `json:"p999_ms"`
	MaxMS  float64 `json:"max_ms"`
	HDR    string  `json:"hdr,omitempty"`
}

func summarize(h *hdrhistogram.Histogram) Latency {
	ms := func(us int64) float64 { return float64(us) / 1000 }
	l := Latency{Count: h.TotalCount()}
	if l.Count == 0 {
		return l
	}
	l.MeanMS = h.Mean() / 1000
	l.P50MS, l.P90MS, l.P99MS = ms(h.ValueAtQuantile(50)), ms(h.ValueAtQuantile(90)), ms(h.ValueAtQuantile(99))
	l.P999MS, l.MaxMS = ms(h.ValueAtQuantile(99.9)), ms(h.Max())
	if b, err := h.Encode(hdrhistogram.V2CompressedEncodingCookieBase); err == nil {
		l.HDR = string(b) // already base64
	}
	return l
}
