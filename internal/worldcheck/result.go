package worldcheck

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
)

// Violation is one broken invariant.
type Violation struct {
	Rule   string `json:"rule"`
	Detail string `json:"detail"`
	// N is how many events, records or answers it stands for (a device
	// lacking five events is one violation of five).
	N int `json:"n"`
}

// Result is the outcome of a check.
type Result struct {
	Run        string         `json:"run,omitempty"` // the load run checked, if one was
	Checked    map[string]int `json:"checked"`
	Skipped    []string       `json:"skipped,omitempty"`
	Violations []Violation    `json:"violations"` // by rule
	// Truncated counts violations per rule that were not listed.
	Truncated map[string]int `json:"truncated,omitempty"`
	// Counts sums N per rule over every violation, listed or not.
	Counts map[string]int `json:"counts,omitempty"`
}

// maxPerRule bounds the violations listed per rule; the rest are counted.
const maxPerRule = 25

func newResult() *Result {
	return &Result{Checked: map[string]int{}, Violations: []Violation{}}
}

// OK reports whether nothing was violated.
func (r *Result) OK() bool { return len(r.Counts) == 0 }

// Add records a violation of rule standing for n (at least 1) events: it
// is listed, in rule order, while its rule has fewer than maxPerRule
// listed, and counted in any case.
func (r *Result) Add(rule string, n int, format string, args ...any) {
	n = max(n, 1)
	if r.Counts == nil {
		r.Counts = map[string]int{}
	}
	r.Counts[rule] += n
	listed := 0
	for _, v := range r.Violations {
		if v.Rule == rule {
			listed++
		}
	}
	if listed >= maxPerRule {
		if r.Truncated == nil {
			r.Truncated = map[string]int{}
		}
		r.Truncated[rule]++
		return
	}
	at := sort.Search(len(r.Violations), func(i int) bool { return r.Violations[i].Rule > rule })
	r.Violations = slices.Insert(r.Violations, at, Violation{Rule: rule, Detail: fmt.Sprintf(format, args...), N: n})
}

// Text renders the result for people: what was checked, what was skipped,
// then every violation (a bounded number per rule, the rest counted).
func (r *Result) Text() string {
	var b strings.Builder
	verdict := "PASS"
	if !r.OK() {
		verdict = "FAIL"
	}
	if r.Run != "" {
		fmt.Fprintf(&b, "check of run %s: %s\n", r.Run, verdict)
	} else {
		fmt.Fprintf(&b, "world check: %s\n", verdict)
	}
	for _, k := range slices.Sorted(maps.Keys(r.Checked)) {
		fmt.Fprintf(&b, "  %-18s %d\n", k, r.Checked[k])
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(&b, "  skipped: %s\n", s)
	}
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "VIOLATION %s: %s\n", v.Rule, v.Detail)
	}
	for _, k := range slices.Sorted(maps.Keys(r.Truncated)) {
		fmt.Fprintf(&b, "VIOLATION %s: … and %d more\n", k, r.Truncated[k])
	}
	return b.String()
}
