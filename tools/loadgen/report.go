package loadgen

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Report is report.json: what a run offered, what it got, how fast.
type Report struct {
	Run      string    `json:"run"`
	Shard    string    `json:"shard,omitempty"` // K/N; a merged run's: its parts
	Profile  string    `json:"profile"`
	Status   string    `json:"status"` // finished or failed
	Phase    string    `json:"phase,omitempty"`
	Error    string    `json:"error,omitempty"`
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Rate     float64   `json:"offered_rate"` // messages/s
	Duration string    `json:"duration"`

	Users         int `json:"users"`
	Devices       int `json:"devices"`
	Conversations int `json:"conversations"`

	// Offered counts messages of the schedule that fell due; Sent those
	// that were sent (first attempts); Accepted those that got `accepted`
	// (one per message, duplicates apart); AcceptedPerSec is Accepted over
	// the send phase plus the time its last answer took. All of them come
	// from the run directory's files, so a run that failed in a later
	// phase reports them too.
	Offered        int64   `json:"offered"`
	Sent           int64   `json:"sent"`
	Accepted       int64   `json:"accepted"`
	AcceptedPerSec float64 `json:"accepted_per_sec"`
	// PeakPerSec is the best whole second of accepted sends.
	PeakPerSec int64            `json:"peak_accepted_per_sec"`
	Duplicates int64            `json:"duplicates"` // deliberate second copies answered
	Membership int64            `json:"membership_changes"`
	Rejects    map[string]int64 `json:"rejects"` // final rejections by code
	Retries    map[string]int64 `json:"retries"` // re-sends by cause
	// Resends counts every attempt after a command's first (any command),
	// apart from the offered load; ResendShare is Resends over first
	// attempts; GivenUp counts commands that ended without a final answer
	// after the re-send budget or the attempt limit refused a re-send (a
	// late answer to the latest attempt still counts while the run lasts).
	Resends      int64            `json:"resends"`
	ResendShare  float64          `json:"resend_share"`
	GivenUp      int64            `json:"given_up"`
	Refused      map[string]int64 `json:"resends_refused,omitempty"` // re-sends refused by cause (budget, attempts)
	Errors       int64            `json:"errors"`                    // connection errors and timeouts
	Unanswered   int64            `json:"unanswered"`
	Reconnects   int64            `json:"reconnects"`
	AcceptedLat  Latency          `json:"accepted_latency"`
	DeliveryLat  Latency          `json:"delivery_latency"`
	Deliveries   int64            `json:"deliveries"`
	DeliveryMode string           `json:"delivery"` // "served", or "not served" when the stack answered sync with bad_request
	Timeline     []Second         `json:"timeline"`
}

// Second is one second of the send phase.
type Second struct {
	T        int     `json:"t"`
	Sent     int64   `json:"sent"`
	Accepted int64   `json:"accepted"` // answered in that second
	P50MS    float64 `json:"p50_ms"`   // accepted latency of the second's answers
	P99MS    float64 `json:"p99_ms"`
}

// Markdown renders the report as a Markdown table.
func (r *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# loadgen run %s\n\n", r.Run)
	if r.Shard != "" {
		fmt.Fprintf(&b, "Shard %s of the plan.\n\n", r.Shard)
	}
	row := func(k, v string) { fmt.Fprintf(&b, "| %s | %s |\n", k, v) }
	b.WriteString("| what | value |\n|------|-------|\n")
	row("profile", r.Profile)
	row("status", r.Status+phaseNote(r))
	row("start → end", r.Start.UTC().Format(time.RFC3339)+" → "+r.End.UTC().Format(time.RFC3339))
	row("offered rate", fmt.Sprintf("%.0f msg/s for %s", r.Rate, r.Duration))
	row("users × devices, conversations", fmt.Sprintf("%d × %d, %d", r.Users, r.Devices, r.Conversations))
	row("offered / sent / accepted", fmt.Sprintf("%d / %d / %d", r.Offered, r.Sent, r.Accepted))
	row("re-sends (share of first attempts), refused, given up", fmt.Sprintf("%d (%.1f %%), %s, %d", r.Resends, 100*r.ResendShare, counts(r.Refused), r.GivenUp))
	row("accepted/s (run), best second", fmt.Sprintf("%.0f, %d", r.AcceptedPerSec, r.PeakPerSec))
	row("accepted latency p50 / p90 / p99 / p99.9 / max", latRow(r.AcceptedLat))
	row("delivery latency p50 / p90 / p99 / p99.9 / max", latRow(r.DeliveryLat))
	row("deliveries", fmt.Sprintf("%d (%s)", r.Deliveries, r.DeliveryMode))
	row("duplicates sent on purpose", fmt.Sprint(r.Duplicates))
	row("membership changes", fmt.Sprint(r.Membership))
	row("final rejections", counts(r.Rejects))
	row("re-sends by cause", counts(r.Retries))
	row("errors, reconnects, unanswered", fmt.Sprintf("%d, %d, %d", r.Errors, r.Reconnects, r.Unanswered))
	return b.String()
}

func phaseNote(r *Report) string {
	if r.Status == StatusFinished {
		return ""
	}
	return fmt.Sprintf(" (in phase %s: %s)", r.Phase, r.Error)
}

func latRow(l Latency) string {
	if l.Count == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f / %.1f / %.1f / %.1f / %.1f ms (n=%d)", l.P50MS, l.P90MS, l.P99MS, l.P999MS, l.MaxMS, l.Count)
}

func counts(m map[string]int64) string {
	if len(m) == 0 {
		return "none"
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
