package loadgen

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Totals is what a run directory's own files say a run did, whatever
// phase it reached: the counts, the accepted latency and the per-second
// timeline are read back from accepted.jsonl, rejected.jsonl,
// delivered.jsonl and counters.json.
type Totals struct {
	Counters   Counters
	Accepted   int64 // messages of the schedule accepted (duplicates and probes apart)
	Duplicates int64
	Probes     int64 // probes accepted (forbidden was expected)
	Rejects    map[string]int64
	Deliveries int64
	// FirstAnswer, LastAnswer bound the answers to the schedule's
	// messages (unix ns; 0 when none).
	FirstAnswer, LastAnswer int64
	Latency                 *hdrhistogram.Histogram // due → accepted, µs
	Timeline                []Second
}

// isProbe tells a probe from a message of the schedule (older runs did
// not mark probes; their client ids are "p<n>", the schedule's "m<n>").
func (a *Accepted) isProbe() bool { return a.Probe || strings.HasPrefix(a.ClientMessageID, "p") }

// ReadTotals reads the totals of the run directory dir. It needs no
// report.json: a run that failed or died mid-way has totals too.
func ReadTotals(dir string) (*Totals, error) {
	t := &Totals{Rejects: map[string]int64{}, Latency: newHist()}
	if err := readJSON(filepath.Join(dir, CountersFile), &t.Counters); err != nil && !isNotExist(err) {
		return nil, err
	}
	c := &t.Counters
	type bucket struct {
		n int64
		h *hdrhistogram.Histogram
	}
	var buckets []bucket
	err := eachLine(filepath.Join(dir, AcceptedFile), func(a *Accepted) {
		if a.Op != "send" {
			return
		}
		switch {
		case a.Dup:
			t.Duplicates++
			return
		case a.isProbe():
			t.Probes++
			return
		}
		t.Accepted++
		us := clampUS(time.Duration(a.At - a.Due))
		t.Latency.RecordValue(us)
		if t.FirstAnswer == 0 || a.At < t.FirstAnswer {
			t.FirstAnswer = a.At
		}
		t.LastAnswer = max(t.LastAnswer, a.At)
		if c.SendStart > 0 && a.At >= c.SendStart {
			i := int((a.At - c.SendStart) / int64(time.Second))
			for len(buckets) <= i {
				buckets = append(buckets, bucket{})
			}
			if buckets[i].h == nil {
				buckets[i].h = newHist()
			}
			buckets[i].n++
			buckets[i].h.RecordValue(us)
		}
	})
	if err != nil {
		return nil, err
	}
	if err := eachLine(filepath.Join(dir, RejectedFile), func(r *Rejected) { t.Rejects[r.Code]++ }); err != nil {
		return nil, err
	}
	if t.Deliveries, err = countLines(filepath.Join(dir, DeliveredFile)); err != nil {
		return nil, err
	}
	n := max(len(buckets), len(c.SentPerSec))
	for i := 0; i < n; i++ {
		s := Second{T: i + 1}
		if i < len(c.SentPerSec) {
			s.Sent = c.SentPerSec[i]
		}
		if i < len(buckets) && buckets[i].h != nil {
			s.Accepted = buckets[i].n
			s.P50MS = usToMS(buckets[i].h.ValueAtQuantile(50))
			s.P99MS = usToMS(buckets[i].h.ValueAtQuantile(99))
		}
		t.Timeline = append(t.Timeline, s)
	}
	return t, nil
}

// Apply fills rep's counts, accepted latency and timeline from t.
func (t *Totals) Apply(rep *Report) {
	c := &t.Counters
	rep.Offered, rep.Sent, rep.Resends, rep.GivenUp = c.Offered, c.Sent, c.Resends, c.GivenUp
	rep.Accepted, rep.Duplicates, rep.Deliveries = t.Accepted, t.Duplicates, t.Deliveries
	rep.Membership, rep.Errors, rep.Reconnects, rep.Unanswered = c.Membership, c.Errors, c.Reconnects, c.Unanswered
	rep.Rejects, rep.Retries, rep.Refused = t.Rejects, orEmpty(c.Retries), c.Refused
	if c.Commands > 0 {
		rep.ResendShare = float64(c.Resends) / float64(c.Commands)
	}
	// accepted/s over the send phase and the time its answers took after
	// it; a run that died in the send phase is measured to its last answer.
	if c.SendStart > 0 {
		end := max(c.SendEnd, t.LastAnswer)
		if secs := float64(end-c.SendStart) / 1e9; secs > 0 {
			rep.AcceptedPerSec = float64(t.Accepted) / secs
		}
	}
	rep.PeakPerSec = 0
	for _, s := range t.Timeline {
		rep.PeakPerSec = max(rep.PeakPerSec, s.Accepted)
	}
	rep.Timeline = t.Timeline
	rep.AcceptedLat = summarize(t.Latency)
}

func orEmpty(m map[string]int64) map[string]int64 {
	if m == nil {
		return map[string]int64{}
	}
	return m
}

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, maxLatencyUS, 3) }

func clampUS(d time.Duration) int64 { return min(max(d.Microseconds(), 1), maxLatencyUS) }

func usToMS(us int64) float64 { return float64(us) / 1000 }

func isNotExist(err error) bool { return errors.Is(err, os.ErrNotExist) }
