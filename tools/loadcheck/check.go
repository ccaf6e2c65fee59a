// Package loadcheck verifies a loadgen run directory against the world —
// the committed log read read_committed and Postgres — not against what
// the servers answered: every accepted event is in the log and in Postgres
// exactly once, no seq is used twice or goes back, a duplicated send
// resolved to one message, nobody sends after their removal, a final
// rejection wrote nothing, and every device converged to exactly the events
// of its memberships.
//
// Check is pure (run + world in, violations out); ReadWorld does the I/O.
package loadcheck

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/chatpipe/chatpipe/tools/loadgen"
)

// Event is one event as the world holds it (log or Postgres).
type Event struct {
	Conv            string
	Seq             int64
	Kind            string
	MessageID       string
	ClientMessageID string
	Sender          string
	UserID          string
	Members         []string
	Partition       int32 // log only
	Offset          int64 // log only
}

// World is what the checker read: the run's conversations only.
type World struct {
	Log          []Event // in partition, offset order
	DB           []Event
	SeqConflicts int // rows of seq_conflicts for the run's conversations
}

// Rules, as they appear in violations.
const (
	RuleNotInLog       = "accepted-not-in-log"
	RuleNotInDB        = "accepted-not-in-postgres"
	RuleTwice          = "accepted-stored-twice"
	RuleMismatch       = "accepted-differs-from-stored"
	RuleCollision      = "seq-collision"
	RuleRegression     = "seq-regression"
	RuleDuplicate      = "duplicate-not-resolved"
	RuleRemovedSender  = "message-after-removal"
	RuleRejectedStored = "rejected-but-stored"
	RuleLogVsDB        = "log-postgres-mismatch"
	RuleConverged      = "device-not-converged"
)

// Violation is one broken invariant.
type Violation struct {
	Rule   string `json:"rule"`
	Detail string `json:"detail"`
}

// Result is the outcome of a check.
type Result struct {
	Run        string         `json:"run"`
	Checked    map[string]int `json:"checked"`
	Skipped    []string       `json:"skipped,omitempty"`
	Violations []Violation    `json:"violations"`
	// Truncated counts violations per rule that were not listed.
	Truncated map[string]int `json:"truncated,omitempty"`
}

// OK reports whether nothing was violated.
func (r *Result) OK() bool { return len(r.Violations) == 0 && len(r.Truncated) == 0 }

// maxPerRule bounds the violations listed per rule; the rest are counted.
const maxPerRule = 25

type checker struct {
	res   *Result
	count map[string]int
}

func (c *checker) add(rule, format string, args ...any) {
	c.count[rule]++
	if c.count[rule] > maxPerRule {
		c.res.Truncated[rule]++
		return
	}
	c.res.Violations = append(c.res.Violations, Violation{Rule: rule, Detail: fmt.Sprintf(format, args...)})
}

type key struct {
	conv string
	seq  int64
}

type cmidKey struct{ conv, cmid string }

// Check verifies run against w.
func Check(run *loadgen.RunDir, w *World) *Result {
	res := &Result{Run: run.Info.Run, Checked: map[string]int{}, Truncated: map[string]int{}}
	c := &checker{res: res, count: map[string]int{}}
	if run.Report.Status != loadgen.StatusFinished {
		c.add("run-not-finished", "the run ended %q in phase %s: %s", run.Report.Status, run.Report.Phase, run.Report.Error)
	}
	logBy, logMID := index(w.Log)
	dbBy, dbMID := index(w.DB)
	res.Checked["log events"] = len(w.Log)
	res.Checked["postgres events"] = len(w.DB)
	res.Checked["accepted answers"] = len(run.Accepted)
	res.Checked["final rejections"] = len(run.Rejected)
	res.Checked["deliveries"] = len(run.Delivered)
	if len(run.GaveUp) > 0 {
		// Given up unanswered: stored or not, both are right.
		res.Checked["given up (unknown)"] = len(run.GaveUp)
	}

	// No seq used twice, in the world or in the answers.
	for _, k := range sortedKeys(logBy) {
		if es := logBy[k]; len(es) > 1 {
			c.add(RuleCollision, "log: %s seq %d holds %d events: %s", k.conv, k.seq, len(es), describe(es))
		}
	}
	if w.SeqConflicts > 0 {
		c.add(RuleCollision, "postgres: seq_conflicts holds %d rows for the run's conversations", w.SeqConflicts)
	}
	answered := map[key]loadgen.Accepted{}
	for _, a := range run.Accepted {
		if a.MessageID == "" {
			continue // a join of a current member: answered with the seq of the join that made them one
		}
		k := key{a.Conv, a.Seq}
		if prev, ok := answered[k]; ok && prev.MessageID != a.MessageID {
			c.add(RuleCollision, "answers: %s seq %d was accepted for %s (%s) and for %s (%s)", a.Conv, a.Seq, prev.MessageID, prev.ClientMessageID, a.MessageID, a.ClientMessageID)
			continue
		}
		answered[k] = a
	}

	// Every accepted event is stored once, as accepted.
	seen := map[string]bool{}
	for _, a := range run.Accepted {
		id := fmt.Sprintf("%s/%d/%s/%s", a.Conv, a.Seq, a.MessageID, a.UserID)
		if seen[id] {
			continue
		}
		seen[id] = true
		for _, st := range []struct {
			name      string
			by        map[key][]Event
			mid       map[string]int
			ruleWhere string
		}{{"log", logBy, logMID, RuleNotInLog}, {"postgres", dbBy, dbMID, RuleNotInDB}} {
			es := st.by[key{a.Conv, a.Seq}]
			if a.MessageID == "" {
				// A join of a current member writes nothing and names the
				// seq of the event that made them one.
				if !addedAt(es, a.UserID) {
					c.add(st.ruleWhere, "%s: join of %s to %s was answered with seq %d, which does not add them (%s)", st.name, a.UserID, a.Conv, a.Seq, describe(es))
				}
				continue
			}
			var match *Event
			for i := range es {
				if es[i].MessageID == a.MessageID {
					match = &es[i]
				}
			}
			switch {
			case match == nil && len(es) == 0:
				c.add(st.ruleWhere, "%s: accepted %s %s seq %d (message %s, client id %q, by %s) is missing", st.name, a.Op, a.Conv, a.Seq, a.MessageID, a.ClientMessageID, a.Sender)
			case match == nil:
				c.add(RuleMismatch, "%s: accepted %s seq %d as message %s, stored %s", st.name, a.Conv, a.Seq, a.MessageID, describe(es))
			case a.Op == "send" && (match.ClientMessageID != a.ClientMessageID || match.Sender != a.Sender):
				c.add(RuleMismatch, "%s: %s seq %d accepted as %q by %s, stored as %q by %s", st.name, a.Conv, a.Seq, a.ClientMessageID, a.Sender, match.ClientMessageID, match.Sender)
			}
			if n := st.mid[a.MessageID]; n > 1 {
				c.add(RuleTwice, "%s: message %s (%s seq %d) is stored %d times", st.name, a.MessageID, a.Conv, a.Seq, n)
			}
		}
	}

	checkDuplicates(c, run, w)
	checkRegression(c, run, w)
	checkMembership(c, run, w)
	checkLogVsDB(c, w, logBy, dbBy)
	checkConvergence(c, run, w)
	sort.SliceStable(res.Violations, func(i, j int) bool { return res.Violations[i].Rule < res.Violations[j].Rule })
	if len(res.Truncated) == 0 {
		res.Truncated = nil
	}
	return res
}

// addedAt reports whether one of es (the events at one seq) made user a
// member: a create listing them or a join of them.
func addedAt(es []Event, user string) bool {
	for _, e := range es {
		switch {
		case e.Kind == "join" && e.UserID == user:
			return true
		case e.Kind == "create" && (e.Sender == user || slices.Contains(e.Members, user)):
			return true
		}
	}
	return false
}

func index(es []Event) (map[key][]Event, map[string]int) {
	by := map[key][]Event{}
	mid := map[string]int{}
	for _, e := range es {
		k := key{e.Conv, e.Seq}
		by[k] = append(by[k], e)
		mid[e.MessageID]++
	}
	return by, mid
}

func sortedKeys(m map[key][]Event) []key {
	ks := make([]key, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool {
		if ks[i].conv != ks[j].conv {
			return ks[i].conv < ks[j].conv
		}
		return ks[i].seq < ks[j].seq
	})
	return ks
}

func describe(es []Event) string {
	var parts []string
	for _, e := range es {
		s := fmt.Sprintf("%s %s by %s", e.Kind, e.MessageID, e.Sender)
		if e.ClientMessageID != "" {
			s += fmt.Sprintf(" (%q)", e.ClientMessageID)
		}
		if e.Offset > 0 || e.Partition > 0 {
			s += fmt.Sprintf(" at %d/%d", e.Partition, e.Offset)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// checkDuplicates: every answer for the same (conversation,
// client_message_id) names the same message, and the log holds it once.
func checkDuplicates(c *checker, run *loadgen.RunDir, w *World) {
	first := map[cmidKey]loadgen.Accepted{}
	for _, a := range run.Accepted {
		if a.Op != "send" {
			continue
		}
		k := cmidKey{a.Conv, a.ClientMessageID}
		if prev, ok := first[k]; ok {
			if prev.Seq != a.Seq || prev.MessageID != a.MessageID {
				c.add(RuleDuplicate, "%s %q was accepted as seq %d (%s) and as seq %d (%s)", a.Conv, a.ClientMessageID, prev.Seq, prev.MessageID, a.Seq, a.MessageID)
			}
			continue
		}
		first[k] = a
	}
	stored := map[cmidKey][]Event{}
	for _, e := range w.Log {
		if e.Kind == "message" {
			k := cmidKey{e.Conv, e.ClientMessageID}
			stored[k] = append(stored[k], e)
		}
	}
	for k, es := range stored {
		if len(es) > 1 {
			c.add(RuleDuplicate, "log: %s %q is stored %d times: %s", k.conv, k.cmid, len(es), describe(es))
		}
	}
}

// checkRegression: within a partition a conversation's seqs only grow (a
// conversation moved to a dedicated vshard and back has its seqs in more
// than one partition), and a message accepted before another was sent has
// the smaller seq.
func checkRegression(c *checker, run *loadgen.RunDir, w *World) {
	type convPart struct {
		conv string
		part int32
	}
	last := map[convPart]Event{}
	for _, e := range w.Log {
		k := convPart{e.Conv, e.Partition}
		if p, ok := last[k]; ok && e.Seq <= p.Seq {
			c.add(RuleRegression, "log: %s seq %d at %d/%d comes after seq %d at %d/%d", e.Conv, e.Seq, e.Partition, e.Offset, p.Seq, p.Partition, p.Offset)
		}
		last[k] = e
	}
	// One entry per message: a message is sent when its first copy is (a
	// duplicate from another device, or a re-send, may go out after other
	// messages were accepted and rightly get the first copy's seq) and
	// accepted when its first answer comes.
	type key struct{ conv, cmid string }
	first := map[key]loadgen.Accepted{}
	for _, a := range run.Accepted {
		if a.Op != "send" {
			continue
		}
		k := key{a.Conv, a.ClientMessageID}
		f, ok := first[k]
		if !ok {
			first[k] = a
			continue
		}
		f.Sent, f.At = min(f.Sent, a.Sent), min(f.At, a.At)
		first[k] = f
	}
	// A copy given up (its answers lost or never sent) may have gone out
	// first and been the one that took the seq: its first attempt's time
	// counts. A record without it (a run from before the field) leaves the
	// message's send time unknown: it is left out as one sent late.
	for _, g := range run.GaveUp {
		k := key{g.Conv, g.ClientMessageID}
		f, ok := first[k]
		if g.Op != "send" || !ok {
			continue
		}
		if g.Sent == 0 {
			f.Sent = math.MinInt64
		} else {
			f.Sent = min(f.Sent, g.Sent)
		}
		first[k] = f
	}
	byConv := map[string][]loadgen.Accepted{}
	for _, a := range first {
		byConv[a.Conv] = append(byConv[a.Conv], a)
	}
	for conv, as := range byConv {
		byAt := append([]loadgen.Accepted(nil), as...)
		sort.Slice(byAt, func(i, j int) bool { return byAt[i].At < byAt[j].At })
		bySent := append([]loadgen.Accepted(nil), as...)
		sort.Slice(bySent, func(i, j int) bool { return bySent[i].Sent < bySent[j].Sent })
		// Sweep: for each b in send order, the highest seq accepted before
		// b was first sent must be below b's seq.
		var best loadgen.Accepted
		i := 0
		for _, b := range bySent {
			for ; i < len(byAt) && byAt[i].At < b.Sent; i++ {
				if byAt[i].Seq > best.Seq {
					best = byAt[i]
				}
			}
			if best.Seq >= b.Seq && best.MessageID != b.MessageID {
				c.add(RuleRegression, "%s: %q was accepted as seq %d before %q was sent, which got seq %d", conv, best.ClientMessageID, best.Seq, b.ClientMessageID, b.Seq)
			}
		}
	}
}

// membership replays a conversation's events in seq order.
type membership struct {
	members map[string]bool
}

func (m *membership) apply(e *Event) {
	switch e.Kind {
	case "create":
		m.members = map[string]bool{e.Sender: true}
		for _, u := range e.Members {
			m.members[u] = true
		}
	case "join":
		m.members[e.UserID] = true
	case "kick":
		delete(m.members, e.UserID)
	case "leave":
		u := e.UserID
		if u == "" {
			u = e.Sender
		}
		delete(m.members, u)
	}
}

// bySeq returns the log's events per conversation in seq order.
func bySeq(es []Event) map[string][]Event {
	out := map[string][]Event{}
	for _, e := range es {
		out[e.Conv] = append(out[e.Conv], e)
	}
	for _, l := range out {
		sort.SliceStable(l, func(i, j int) bool { return l[i].Seq < l[j].Seq })
	}
	return out
}

// checkMembership: no message from someone who is not a member at its
// seq (I5), and no final rejection of a send that was stored anyway.
func checkMembership(c *checker, run *loadgen.RunDir, w *World) {
	for conv, es := range bySeq(w.Log) {
		m := &membership{members: map[string]bool{}}
		for i := range es {
			e := &es[i]
			if e.Kind == "message" && !m.members[e.Sender] {
				c.add(RuleRemovedSender, "log: %s seq %d is a message from %s, not a member at that seq", conv, e.Seq, e.Sender)
			}
			m.apply(e)
		}
	}
	stored := map[cmidKey]Event{}
	for _, e := range w.Log {
		if e.Kind == "message" {
			stored[cmidKey{e.Conv, e.ClientMessageID}] = e
		}
	}
	for _, r := range run.Rejected {
		if r.Op != "send" {
			continue
		}
		if e, ok := stored[cmidKey{r.Conv, r.ClientMessageID}]; ok && e.Sender == r.Sender {
			c.add(RuleRejectedStored, "%s %q by %s was answered %s, yet the log holds it as seq %d", r.Conv, r.ClientMessageID, r.Sender, r.Code, e.Seq)
		}
	}
}

// checkLogVsDB: Postgres holds exactly the log's events.
func checkLogVsDB(c *checker, w *World, logBy, dbBy map[key][]Event) {
	for _, k := range sortedKeys(logBy) {
		l := logBy[k][0]
		d, ok := dbBy[k]
		switch {
		case !ok:
			c.add(RuleLogVsDB, "%s seq %d (%s %s) is in the log, not in postgres", k.conv, k.seq, l.Kind, l.MessageID)
		case d[0].MessageID != l.MessageID:
			c.add(RuleLogVsDB, "%s seq %d is %s in the log, %s in postgres", k.conv, k.seq, l.MessageID, d[0].MessageID)
		}
	}
	for _, k := range sortedKeys(dbBy) {
		if _, ok := logBy[k]; !ok {
			c.add(RuleLogVsDB, "%s seq %d (%s) is in postgres, not in the log", k.conv, k.seq, dbBy[k][0].MessageID)
		}
	}
}

// window is a membership interval [from, to] (to 0: still a member).
type window struct{ from, to int64 }

func (w window) has(seq int64) bool { return seq >= w.from && (w.to == 0 || seq <= w.to) }

// windows returns, per conversation and user, the seqs during which the
// user was a member: from the create or join that added them to the kick
// or leave that removed them, both included.
func windows(log map[string][]Event) map[string]map[string][]window {
	out := map[string]map[string][]window{}
	for conv, es := range log {
		ws := map[string][]window{}
		open := func(u string, seq int64) {
			l := ws[u]
			if len(l) > 0 && l[len(l)-1].to == 0 {
				return
			}
			ws[u] = append(l, window{from: seq})
		}
		closeW := func(u string, seq int64) {
			if l := ws[u]; len(l) > 0 && l[len(l)-1].to == 0 {
				l[len(l)-1].to = seq
			}
		}
		for _, e := range es {
			switch e.Kind {
			case "create":
				open(e.Sender, e.Seq)
				for _, u := range e.Members {
					open(u, e.Seq)
				}
			case "join":
				open(e.UserID, e.Seq)
			case "kick":
				closeW(e.UserID, e.Seq)
			case "leave":
				u := e.UserID
				if u == "" {
					u = e.Sender
				}
				closeW(u, e.Seq)
			}
		}
		out[conv] = ws
	}
	return out
}

// checkConvergence: every device of every user holds exactly the events of
// the user's membership windows (I5, I6), each with the log's message id.
func checkConvergence(c *checker, run *loadgen.RunDir, w *World) {
	if len(run.Delivered) == 0 && run.Report.DeliveryMode != "served" {
		c.res.Skipped = append(c.res.Skipped, "device convergence: the stack answered sync with bad_request and delivered nothing (delivery not served)")
		return
	}
	log := bySeq(w.Log)
	win := windows(log)
	type dk struct{ dev, conv string }
	got := map[dk]map[int64]string{}
	for _, d := range run.Delivered {
		k := dk{d.Device, d.Conv}
		if got[k] == nil {
			got[k] = map[int64]string{}
		}
		if prev, ok := got[k][d.Seq]; ok && prev != d.MessageID {
			c.add(RuleConverged, "%s got %s seq %d as %s and as %s", d.Device, d.Conv, d.Seq, prev, d.MessageID)
		}
		got[k][d.Seq] = d.MessageID
	}
	devices := 0
	for _, u := range run.Info.Plan.Users {
		for i := 0; i < run.Info.Plan.Devices; i++ {
			dev := loadgen.DeviceName(u, i)
			devices++
			for _, conv := range sortedConvs(log) {
				ws := win[conv][u]
				have := got[dk{dev, conv}]
				if len(ws) == 0 && have == nil {
					continue
				}
				var missing, extra []int64
				for _, e := range log[conv] {
					in := false
					for _, x := range ws {
						in = in || x.has(e.Seq)
					}
					mid, ok := have[e.Seq]
					switch {
					case in && !ok:
						missing = append(missing, e.Seq)
					case !in && ok:
						extra = append(extra, e.Seq)
					case ok && mid != e.MessageID:
						c.add(RuleConverged, "%s holds %s seq %d as %s, the log as %s", dev, conv, e.Seq, mid, e.MessageID)
					}
				}
				for seq := range have {
					if _, ok := findSeq(log[conv], seq); !ok {
						extra = append(extra, seq)
					}
				}
				if len(missing) > 0 {
					c.add(RuleConverged, "%s lacks %d events of %s: seqs %s", dev, len(missing), conv, seqList(missing))
				}
				if len(extra) > 0 {
					sort.Slice(extra, func(i, j int) bool { return extra[i] < extra[j] })
					c.add(RuleConverged, "%s got %d events of %s outside its membership or not in the log: seqs %s", dev, len(extra), conv, seqList(extra))
				}
			}
		}
	}
	c.res.Checked["devices"] = devices
}

func sortedConvs(m map[string][]Event) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func findSeq(es []Event, seq int64) (Event, bool) {
	i := sort.Search(len(es), func(i int) bool { return es[i].Seq >= seq })
	if i < len(es) && es[i].Seq == seq {
		return es[i], true
	}
	return Event{}, false
}

func seqList(s []int64) string {
	var parts []string
	for i, v := range s {
		if i == 10 {
			parts = append(parts, fmt.Sprintf("… (%d more)", len(s)-10))
			break
		}
		parts = append(parts, fmt.Sprint(v))
	}
	return strings.Join(parts, ", ")
}
