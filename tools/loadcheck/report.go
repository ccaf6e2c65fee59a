package loadcheck

import (
	"fmt"
	"sort"
	"strings"
)

// Text renders the result for people: what was checked, what was skipped,
// then every violation (a bounded number per rule, the rest counted).
func (r *Result) Text() string {
	var b strings.Builder
	verdict := "PASS"
	if !r.OK() {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "check of run %s: %s\n", r.Run, verdict)
	var keys []string
	for k := range r.Checked {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-18s %d\n", k, r.Checked[k])
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(&b, "  skipped: %s\n", s)
	}
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "VIOLATION %s: %s\n", v.Rule, v.Detail)
	}
	var rules []string
	for k := range r.Truncated {
		rules = append(rules, k)
	}
	sort.Strings(rules)
	for _, k := range rules {
		fmt.Fprintf(&b, "VIOLATION %s: … and %d more\n", k, r.Truncated[k])
	}
	return b.String()
}
