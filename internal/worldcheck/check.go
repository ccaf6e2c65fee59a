// Package worldcheck checks the world — the committed log, read
// read_committed, and Postgres — against what clients were told and what
// their devices hold, not against what the servers say: the invariants of
// docs/reliability.md that can be seen from outside. It is the one checker
// of the end-to-end tests' world check, the nemesis's must-be-zero counts
// and `chatpipe check` of a load run (tools/loadcheck). Check and its
// rules stay in this one file, longer than most, so that they read as one
// list beside docs/loadgen.md's table of rules; reading the world is in
// world.go.
//
// What it checks, each violation under its rule (the Rule constants):
//
//   - every accepted event is in the log and in Postgres, at its seq, as
//     answered (I1);
//   - no record of a vshard has an older ownership epoch than one before
//     it, and every record is in its vshard's partition (I2);
//   - per conversation, no seq is used twice, the seqs run 1, 2, 3, …
//     without a gap, grow in each partition's order, and an op accepted
//     before another was sent has the smaller seq (I3);
//   - a client_message_id is stored once per conversation, every answer
//     to it names the same event, a message_id is stored once, and a
//     command finally rejected wrote nothing (I4);
//   - no message is from a user who is not a member at its seq (I5);
//   - Postgres holds exactly the log's events;
//   - every device view holds exactly the log's events its user may see —
//     those inside their membership periods — as the log holds them (I5,
//     I6).
//
// Check is pure (what clients saw and the world in, violations out);
// ReadWorld does the I/O. Membership periods come from the log through
// readmodel.LogPeriods.
package worldcheck

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/chatpipe/chatpipe/internal/readmodel"
	"github.com/chatpipe/chatpipe/logrecord"
)

// Event is one event (a record with a seq) as the world holds it: the log,
// Postgres, or a device's view.
type Event struct {
	logrecord.Event
	// Partition and Offset say where the log holds it (the log's events
	// only).
	Partition int32
	Offset    int64
}

// Write is one record of the log, takeover markers included: who wrote it
// and where it is.
type Write struct {
	VShard        int
	Epoch         int64
	Kind          string
	Partition     int32
	Offset        int64
	ProducerID    int64
	ProducerEpoch int16
}

// World is what the checker read.
type World struct {
	// Layout is the stack's vshards and partitions; nil: where records
	// are is not checked.
	Layout *logrecord.Layout
	// Log holds the events of the conversations read, in the order read:
	// each partition's in offset order.
	Log []Event
	// Writes holds every record read, of every conversation and marker,
	// in the order read.
	Writes []Write
	// DB holds Postgres's events of the conversations read.
	DB []Event
	// SeqConflicts counts persist's seq_conflicts rows of the
	// conversations read.
	SeqConflicts int
}

// Accepted is an answer `accepted`: what a client was told.
type Accepted struct {
	Op              string // create, send, join, kick, leave ("": not recorded)
	Conv            string
	Seq             int64
	MessageID       string // "": a join of a current member, answered with the seq that made them one
	ClientMessageID string
	Sender          string
	UserID          string // join, kick: the user added or removed
	// Sent is when the command's first attempt was written and At when
	// the answer came, in unix ns; 0: not known.
	Sent, At int64
}

// Rejected is a final (not retried) rejection.
type Rejected struct {
	Op, Conv, ClientMessageID, Sender, Code string
}

// GaveUp is a command given up unanswered: stored or not, both are right.
// Its first attempt may still be what took the seq: Sent (unix ns; 0:
// not known) dates the command's sending.
type GaveUp struct {
	Op, Conv, ClientMessageID, Sender string
	Sent                              int64
}

// View is what one reader of a user got of the world: a device's events
// after its final sync, or what one sync or history read returned.
type View struct {
	Name string
	User string
	// Convs limits the view to these conversations (a history read of
	// one); nil: every conversation.
	Convs []string
	// Events are the events the view holds; Kind, Sender and MessageID
	// are compared with the log's.
	Events []Event
	// Bodies says the events carry their bodies, compared too.
	Bodies bool
}

// Run is what clients saw: the answers, and the devices' views.
type Run struct {
	Accepted []Accepted
	Rejected []Rejected
	GaveUp   []GaveUp
	Views    []View
}

// Rules, as they appear in violations.
const (
	RuleNotInLog       = "accepted-not-in-log"
	RuleNotInDB        = "accepted-not-in-postgres"
	RuleMismatch       = "accepted-differs-from-stored"
	RuleStoredTwice    = "message-stored-twice"
	RuleCollision      = "seq-collision"
	RuleGap            = "seq-gap"
	RuleRegression     = "seq-regression"
	RuleDuplicate      = "duplicate-not-resolved"
	RuleRemovedSender  = "message-after-removal"
	RuleNoUser         = "membership-event-without-user"
	RuleRejectedStored = "rejected-but-stored"
	RuleNotPersisted   = "postgres-lacks-event"
	RuleNotCommitted   = "postgres-not-in-log"
	RuleLogVsDB        = "log-postgres-mismatch"
	RuleStaleEpoch     = "stale-epoch"
	RulePlacement      = "record-outside-its-partition"
	RuleDeviceNotInLog = "device-not-in-log"
	RuleDeviceOutside  = "device-outside-membership"
	RuleDeviceLacks    = "device-lacks-event"
	RuleDeviceDiffers  = "device-differs-from-log"
)

// Rules lists every rule Check reports, in the order of the constants.
func Rules() []string {
	return []string{RuleNotInLog, RuleNotInDB, RuleMismatch, RuleStoredTwice, RuleCollision, RuleGap, RuleRegression,
		RuleDuplicate, RuleRemovedSender, RuleNoUser, RuleRejectedStored, RuleNotPersisted, RuleNotCommitted, RuleLogVsDB,
		RuleStaleEpoch, RulePlacement, RuleDeviceNotInLog, RuleDeviceOutside, RuleDeviceLacks, RuleDeviceDiffers}
}

type key struct {
	conv string
	seq  int64
}

type cmidKey struct{ conv, cmid string }

type checker struct {
	res   *Result
	run   *Run
	w     *World
	logBy map[key][]*Event
	dbBy  map[key][]*Event
	per   map[string]map[string][]readmodel.Period // conversation → user → periods
}

// Check verifies run against w.
func Check(run *Run, w *World) *Result {
	res := newResult()
	c := &checker{res: res, run: run, w: w, logBy: index(w.Log), dbBy: index(w.DB)}
	res.Checked["log records"] = len(w.Writes)
	res.Checked["log events"] = len(w.Log)
	res.Checked["postgres events"] = len(w.DB)
	res.Checked["accepted answers"] = len(run.Accepted)
	res.Checked["final rejections"] = len(run.Rejected)
	if len(run.GaveUp) > 0 {
		res.Checked["given up (unknown)"] = len(run.GaveUp)
	}
	evs := make([]*logrecord.Event, len(w.Log))
	for i := range w.Log {
		evs[i] = &w.Log[i].Event
	}
	c.per = readmodel.LogPeriods(evs)

	c.collisions()
	c.storedTwice()
	c.accepted()
	c.duplicates()
	c.gaps()
	c.regression()
	c.epochs()
	c.placement()
	c.membership()
	c.rejected()
	c.logVsDB()
	c.views()
	return res
}

// index points at each (conversation, seq)'s events.
func index(es []Event) map[key][]*Event {
	by := make(map[key][]*Event, len(es))
	for i := range es {
		e := &es[i]
		k := key{e.ConversationID, e.Seq}
		by[k] = append(by[k], e)
	}
	return by
}

func sortedKeys(m map[key][]*Event) []key {
	ks := make([]key, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b key) int { return cmp.Or(cmp.Compare(a.conv, b.conv), cmp.Compare(a.seq, b.seq)) })
	return ks
}

func describe(es []*Event) string {
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

// stores names the log and Postgres with their events.
func (c *checker) stores() []struct {
	name string
	es   []Event
	by   map[key][]*Event
} {
	return []struct {
		name string
		es   []Event
		by   map[key][]*Event
	}{{"log", c.w.Log, c.logBy}, {"postgres", c.w.DB, c.dbBy}}
}

// collisions: no (conversation, seq) holds two events in the log or in
// Postgres, persist recorded no seq conflict, and no two answers gave one
// seq to different commands.
func (c *checker) collisions() {
	for _, st := range c.stores() {
		for _, k := range sortedKeys(st.by) {
			if es := st.by[k]; len(es) > 1 {
				c.res.Add(RuleCollision, len(es)-1, "%s: %s seq %d holds %d events: %s", st.name, k.conv, k.seq, len(es), describe(es))
			}
		}
	}
	if c.w.SeqConflicts > 0 {
		c.res.Add(RuleCollision, c.w.SeqConflicts, "postgres: seq_conflicts holds %d rows for the conversations checked", c.w.SeqConflicts)
	}
	answered := map[key]Accepted{}
	for _, a := range c.run.Accepted {
		if a.MessageID == "" {
			continue // a join of a current member: answered with the seq of the join that made them one
		}
		k := key{a.Conv, a.Seq}
		if prev, ok := answered[k]; ok && (prev.MessageID != a.MessageID || prev.ClientMessageID != a.ClientMessageID) {
			c.res.Add(RuleCollision, 1, "answers: %s seq %d was accepted for %s (%q) and for %s (%q)", a.Conv, a.Seq, prev.MessageID, prev.ClientMessageID, a.MessageID, a.ClientMessageID)
			continue
		}
		answered[k] = a
	}
}

// storedTwice: a message_id is stored once, in the log and in Postgres.
func (c *checker) storedTwice() {
	for _, st := range c.stores() {
		at := map[string][]*Event{}
		for i := range st.es {
			if e := &st.es[i]; e.MessageID != "" {
				at[e.MessageID] = append(at[e.MessageID], e)
			}
		}
		for _, mid := range slices.Sorted(maps.Keys(at)) {
			if es := at[mid]; len(es) > 1 {
				c.res.Add(RuleStoredTwice, len(es)-1, "%s: message %s is stored %d times: %s", st.name, mid, len(es), describeAt(es))
			}
		}
	}
}

func describeAt(es []*Event) string {
	var parts []string
	for _, e := range es {
		parts = append(parts, fmt.Sprintf("%s seq %d", e.ConversationID, e.Seq))
	}
	return strings.Join(parts, ", ")
}

// kindOf is the event kind an op writes.
var kindOf = map[string]string{"send": logrecord.KindMessage, "create": logrecord.KindCreate, "join": logrecord.KindJoin,
	"kick": logrecord.KindKick, "leave": logrecord.KindLeave}

// accepted: every accepted event is in the log and in Postgres at its
// seq, as answered — its message_id, client_message_id, sender and kind.
func (c *checker) accepted() {
	seen := map[Accepted]bool{}
	for _, a := range c.run.Accepted {
		id := a
		id.Sent, id.At = 0, 0
		if seen[id] {
			continue
		}
		seen[id] = true
		for _, st := range []struct {
			name    string
			by      map[key][]*Event
			missing string
		}{{"log", c.logBy, RuleNotInLog}, {"postgres", c.dbBy, RuleNotInDB}} {
			es := st.by[key{a.Conv, a.Seq}]
			if a.MessageID == "" {
				// A join of a current member writes nothing and names the
				// seq of the event that made them one.
				if !addedAt(es, a.UserID) {
					c.res.Add(st.missing, 1, "%s: join of %s to %s was answered with seq %d, which does not add them (%s)", st.name, a.UserID, a.Conv, a.Seq, describe(es))
				}
				continue
			}
			var match *Event
			for _, e := range es {
				if e.MessageID == a.MessageID {
					match = e
				}
			}
			switch {
			case match == nil && len(es) == 0:
				c.res.Add(st.missing, 1, "%s: accepted %s %s seq %d (message %s, client id %q, by %s) is missing", st.name, a.Op, a.Conv, a.Seq, a.MessageID, a.ClientMessageID, a.Sender)
			case match == nil:
				c.res.Add(RuleMismatch, 1, "%s: accepted %s seq %d as message %s, stored %s", st.name, a.Conv, a.Seq, a.MessageID, describe(es))
			case a.ClientMessageID != "" && match.ClientMessageID != a.ClientMessageID,
				a.Sender != "" && match.Sender != a.Sender,
				a.Op != "" && kindOf[a.Op] != match.Kind:
				c.res.Add(RuleMismatch, 1, "%s: %s seq %d accepted as %s %q by %s, stored as %s %q by %s", st.name, a.Conv, a.Seq,
					a.Op, a.ClientMessageID, a.Sender, match.Kind, match.ClientMessageID, match.Sender)
			}
		}
	}
}

// addedAt reports whether one of es (the events at one seq) made user a
// member: a create listing them or a join of them.
func addedAt(es []*Event, user string) bool {
	for _, e := range es {
		switch {
		case e.Kind == logrecord.KindJoin && e.UserID == user:
			return true
		case e.Kind == logrecord.KindCreate && (e.Sender == user || slices.Contains(e.Members, user)):
			return true
		}
	}
	return false
}

// duplicates: every answer for one (conversation, client_message_id)
// names the same event, and the log and Postgres hold it once.
func (c *checker) duplicates() {
	first := map[cmidKey]Accepted{}
	for _, a := range c.run.Accepted {
		if a.ClientMessageID == "" {
			continue
		}
		k := cmidKey{a.Conv, a.ClientMessageID}
		if prev, ok := first[k]; ok {
			if prev.Seq != a.Seq || prev.MessageID != a.MessageID {
				c.res.Add(RuleDuplicate, 1, "%s %q was accepted as seq %d (%s) and as seq %d (%s)", a.Conv, a.ClientMessageID, prev.Seq, prev.MessageID, a.Seq, a.MessageID)
			}
			continue
		}
		first[k] = a
	}
	for _, st := range c.stores() {
		stored := map[cmidKey][]*Event{}
		var order []cmidKey
		for i := range st.es {
			e := &st.es[i]
			if e.ClientMessageID == "" {
				continue
			}
			k := cmidKey{e.ConversationID, e.ClientMessageID}
			if stored[k] == nil {
				order = append(order, k)
			}
			stored[k] = append(stored[k], e)
		}
		for _, k := range order {
			if es := stored[k]; len(es) > 1 {
				c.res.Add(RuleDuplicate, len(es)-1, "%s: %s %q is stored %d times: %s", st.name, k.conv, k.cmid, len(es), describe(es))
			}
		}
	}
}

// bySeq returns the log's seqs per conversation, ascending, each once.
func bySeq(es []Event) map[string][]int64 {
	out := map[string][]int64{}
	for _, e := range es {
		out[e.ConversationID] = append(out[e.ConversationID], e.Seq)
	}
	for conv, l := range out {
		slices.Sort(l)
		out[conv] = slices.Compact(l)
	}
	return out
}

// gaps: a conversation's seqs in the log are 1, 2, 3, … without a gap.
func (c *checker) gaps() {
	seqs := bySeq(c.w.Log)
	for _, conv := range slices.Sorted(maps.Keys(seqs)) {
		for i, s := range seqs[conv] {
			if s != int64(i+1) {
				prev := "it starts there"
				if i > 0 {
					prev = fmt.Sprintf("after seq %d", seqs[conv][i-1])
				}
				c.res.Add(RuleGap, 1, "log: %s has seq %d at place %d (%s)", conv, s, i+1, prev)
				break
			}
		}
	}
}

// regression: within a partition a conversation's seqs only grow (a
// conversation moved to a dedicated vshard and back has its seqs in more
// than one partition), and an op accepted before another was sent has the
// smaller seq.
func (c *checker) regression() {
	type convPart struct {
		conv string
		part int32
	}
	last := map[convPart]*Event{}
	for i := range c.w.Log {
		e := &c.w.Log[i]
		k := convPart{e.ConversationID, e.Partition}
		if p, ok := last[k]; ok && e.Seq <= p.Seq {
			c.res.Add(RuleRegression, 1, "log: %s seq %d at %d/%d comes after seq %d at %d/%d", e.ConversationID, e.Seq, e.Partition, e.Offset, p.Seq, p.Partition, p.Offset)
		}
		last[k] = e
	}
	// One entry per op: an op is sent when its first copy is (a duplicate
	// from another device, or a re-send, may go out after other ops were
	// accepted and rightly get the first copy's seq) and accepted when its
	// first answer comes. A join of a current member names an older seq
	// and is left out.
	type op struct {
		a           Accepted
		sent, at    int64 // 0: not known
		sentUnknown bool  // a copy of unknown send time may have gone first
	}
	ident := func(conv, cmid, mid string) cmidKey {
		if cmid != "" {
			return cmidKey{conv, cmid}
		}
		return cmidKey{conv, "#" + mid}
	}
	earliest := func(a, b int64) int64 {
		switch {
		case a == 0:
			return b
		case b == 0:
			return a
		}
		return min(a, b)
	}
	ops := map[cmidKey]*op{}
	var order []cmidKey
	for _, a := range c.run.Accepted {
		if a.MessageID == "" {
			continue
		}
		k := ident(a.Conv, a.ClientMessageID, a.MessageID)
		o, ok := ops[k]
		if !ok {
			ops[k] = &op{a: a, sent: a.Sent, at: a.At}
			order = append(order, k)
			continue
		}
		o.sent, o.at = earliest(o.sent, a.Sent), earliest(o.at, a.At)
	}
	// A copy given up (its answers lost or never sent) may have gone out
	// first and been the one that took the seq: its first attempt's time
	// counts. Without that time the op's send time is unknown: it is left
	// out as one sent late.
	for _, g := range c.run.GaveUp {
		if g.ClientMessageID == "" {
			continue
		}
		o, ok := ops[cmidKey{g.Conv, g.ClientMessageID}]
		if !ok {
			continue
		}
		if g.Sent == 0 {
			o.sentUnknown = true
		} else {
			o.sent = earliest(o.sent, g.Sent)
		}
	}
	byConv := map[string][]*op{}
	for _, k := range order {
		byConv[k.conv] = append(byConv[k.conv], ops[k])
	}
	for _, conv := range slices.Sorted(maps.Keys(byConv)) {
		var byAt, bySent []*op
		for _, o := range byConv[conv] {
			if o.at != 0 {
				byAt = append(byAt, o)
			}
			if o.sent != 0 && !o.sentUnknown {
				bySent = append(bySent, o)
			}
		}
		sort.SliceStable(byAt, func(i, j int) bool { return byAt[i].at < byAt[j].at })
		sort.SliceStable(bySent, func(i, j int) bool { return bySent[i].sent < bySent[j].sent })
		// Sweep: for each b in send order, the highest seq accepted before
		// b was first sent must be below b's seq.
		var best *op
		i := 0
		for _, b := range bySent {
			for ; i < len(byAt) && byAt[i].at < b.sent; i++ {
				if best == nil || byAt[i].a.Seq > best.a.Seq {
					best = byAt[i]
				}
			}
			if best != nil && best != b && best.a.Seq >= b.a.Seq {
				c.res.Add(RuleRegression, 1, "%s: %s %q was accepted as seq %d before %s %q was sent, which got seq %d",
					conv, best.a.Op, best.a.ClientMessageID, best.a.Seq, b.a.Op, b.a.ClientMessageID, b.a.Seq)
			}
		}
	}
}

// epochs: per vshard, in its partition's order, no record (event or
// marker) has an older ownership epoch than one before it — a writer that
// lost its vshard committed nothing after the new owner's records (I2).
func (c *checker) epochs() {
	top := map[int]Write{}
	for _, wr := range c.w.Writes {
		t, ok := top[wr.VShard]
		if ok && wr.Epoch < t.Epoch {
			c.res.Add(RuleStaleEpoch, 1, "vshard %d: %s at %d/%d (producer %d epoch %d) has ownership epoch %d after epoch %d's %s at %d/%d (producer %d epoch %d)",
				wr.VShard, wr.Kind, wr.Partition, wr.Offset, wr.ProducerID, wr.ProducerEpoch, wr.Epoch, t.Epoch, t.Kind, t.Partition, t.Offset, t.ProducerID, t.ProducerEpoch)
		}
		if !ok || wr.Epoch > t.Epoch {
			top[wr.VShard] = wr
		}
	}
}

// placement: every record is in its vshard's partition, and every event
// was written by its conversation's hashed vshard or a dedicated one.
func (c *checker) placement() {
	l := c.w.Layout
	if l == nil || l.VShards <= 0 || l.Partitions <= 0 {
		c.res.Skipped = append(c.res.Skipped, "record placement: the stack's vshards and partitions are not known")
		return
	}
	for _, wr := range c.w.Writes {
		if want := l.Partition(wr.VShard); want != wr.Partition {
			c.res.Add(RulePlacement, 1, "%s of vshard %d at %d/%d: its partition is %d", wr.Kind, wr.VShard, wr.Partition, wr.Offset, want)
		}
	}
	for i := range c.w.Log {
		e := &c.w.Log[i]
		if home := logrecord.VShard(e.ConversationID, l.VShards); e.VShard != home && !l.IsDedicated(e.VShard) {
			c.res.Add(RulePlacement, 1, "%s seq %d written by vshard %d: neither its own (%d) nor a dedicated one", e.ConversationID, e.Seq, e.VShard, home)
		}
	}
}

// membership: no message from a user who is not a member at its seq
// (I5), and every join, kick and leave names the user it adds or removes.
func (c *checker) membership() {
	for i := range c.w.Log {
		e := &c.w.Log[i]
		switch e.Kind {
		case logrecord.KindMessage:
			if !readmodel.CoversAny(c.per[e.ConversationID][e.Sender], e.Seq) {
				c.res.Add(RuleRemovedSender, 1, "log: %s seq %d is a message from %s, not a member at that seq (periods %s)",
					e.ConversationID, e.Seq, e.Sender, periodList(c.per[e.ConversationID][e.Sender]))
			}
		case logrecord.KindJoin, logrecord.KindKick, logrecord.KindLeave:
			if e.UserID == "" {
				c.res.Add(RuleNoUser, 1, "log: %s seq %d, a %s by %s, names no user", e.ConversationID, e.Seq, e.Kind, e.Sender)
			}
		}
	}
}

func periodList(ps []readmodel.Period) string {
	if len(ps) == 0 {
		return "none"
	}
	var parts []string
	for _, p := range ps {
		to := fmt.Sprint(p.To)
		if p.To == math.MaxInt64 {
			to = ""
		}
		parts = append(parts, fmt.Sprintf("%d–%s", p.From, to))
	}
	return strings.Join(parts, ", ")
}

// rejected: a command finally rejected wrote nothing.
func (c *checker) rejected() {
	stored := map[cmidKey]*Event{}
	for i := range c.w.Log {
		if e := &c.w.Log[i]; e.ClientMessageID != "" {
			stored[cmidKey{e.ConversationID, e.ClientMessageID}] = e
		}
	}
	for _, r := range c.run.Rejected {
		if r.ClientMessageID == "" {
			continue
		}
		if e, ok := stored[cmidKey{r.Conv, r.ClientMessageID}]; ok && e.Sender == r.Sender {
			c.res.Add(RuleRejectedStored, 1, "%s %s %q by %s was answered %s, yet the log holds it as seq %d", r.Conv, r.Op, r.ClientMessageID, r.Sender, r.Code, e.Seq)
		}
	}
}

// logVsDB: Postgres holds exactly the log's events.
func (c *checker) logVsDB() {
	for _, k := range sortedKeys(c.logBy) {
		l := c.logBy[k][0]
		d, ok := c.dbBy[k]
		switch {
		case !ok:
			c.res.Add(RuleNotPersisted, 1, "%s seq %d (%s %s) is in the log, not in postgres", k.conv, k.seq, l.Kind, l.MessageID)
		case !sameEvent(&l.Event, &d[0].Event, true):
			c.res.Add(RuleLogVsDB, 1, "%s seq %d is %s in the log, %s in postgres", k.conv, k.seq, describeOne(&l.Event), describeOne(&d[0].Event))
		}
	}
	for _, k := range sortedKeys(c.dbBy) {
		if _, ok := c.logBy[k]; !ok {
			c.res.Add(RuleNotCommitted, 1, "%s seq %d (%s) is in postgres, not in the committed log", k.conv, k.seq, describe(c.dbBy[k]))
		}
	}
}

// sameEvent compares what an event says (not where the log holds it).
func sameEvent(a, b *logrecord.Event, bodies bool) bool {
	return a.Kind == b.Kind && a.MessageID == b.MessageID && a.ClientMessageID == b.ClientMessageID && a.Sender == b.Sender &&
		a.UserID == b.UserID && slices.Equal(a.Members, b.Members) && (!bodies || a.Body == b.Body)
}

func describeOne(e *logrecord.Event) string {
	return fmt.Sprintf("%s %s by %s (client id %q, user %q, members %v, body %q)", e.Kind, e.MessageID, e.Sender, e.ClientMessageID, e.UserID, e.Members, e.Body)
}

// views: every view holds exactly the log's events its user may see —
// inside their membership periods, the removal event included — each as
// the log holds it.
func (c *checker) views() {
	if len(c.run.Views) == 0 {
		return
	}
	userConvs := map[string][]string{}
	for conv, users := range c.per {
		for u := range users {
			userConvs[u] = append(userConvs[u], conv)
		}
	}
	logSeqs := map[string][]*Event{}
	for _, k := range sortedKeys(c.logBy) {
		logSeqs[k.conv] = append(logSeqs[k.conv], c.logBy[k][0])
	}
	events := 0
	for _, v := range c.run.Views {
		events += len(v.Events)
		held := map[string]map[int64]*Event{}
		for i := range v.Events {
			e := &v.Events[i]
			m := held[e.ConversationID]
			if m == nil {
				m = map[int64]*Event{}
				held[e.ConversationID] = m
			}
			if prev, ok := m[e.Seq]; ok && !sameEvent(&prev.Event, &e.Event, v.Bodies) {
				c.res.Add(RuleDeviceDiffers, 1, "%s holds %s seq %d as %s and as %s", v.Name, e.ConversationID, e.Seq, describeOne(&prev.Event), describeOne(&e.Event))
			}
			m[e.Seq] = e
		}
		// The conversations to check: those the view covers that its user
		// was ever in, and those it holds events of.
		var convs []string
		if v.Convs == nil {
			convs = append(convs, userConvs[v.User]...)
		} else {
			for _, conv := range v.Convs {
				if _, ok := c.per[conv][v.User]; ok {
					convs = append(convs, conv)
				}
			}
		}
		for conv := range held {
			convs = append(convs, conv)
		}
		slices.Sort(convs)
		for _, conv := range slices.Compact(convs) {
			ps := c.per[conv][v.User]
			have := held[conv]
			var notInLog, outside, differs, missing []int64
			example := ""
			for _, s := range slices.Sorted(maps.Keys(have)) {
				e := have[s]
				l, ok := c.logBy[key{conv, s}]
				switch {
				case !ok:
					notInLog = append(notInLog, s)
				case !readmodel.CoversAny(ps, s):
					outside = append(outside, s)
				case !sameShown(&e.Event, &l[0].Event, v.Bodies):
					if len(differs) == 0 {
						example = fmt.Sprintf("seq %d as %s, the log as %s", s, describeOne(&e.Event), describeOne(&l[0].Event))
					}
					differs = append(differs, s)
				}
			}
			inScope := v.Convs == nil || slices.Contains(v.Convs, conv)
			if inScope {
				for _, l := range logSeqs[conv] {
					if _, ok := have[l.Seq]; !ok && readmodel.CoversAny(ps, l.Seq) {
						missing = append(missing, l.Seq)
					}
				}
			}
			if len(notInLog) > 0 {
				c.res.Add(RuleDeviceNotInLog, len(notInLog), "%s holds %d events of %s the committed log does not: seqs %s", v.Name, len(notInLog), conv, seqList(notInLog))
			}
			if len(outside) > 0 {
				c.res.Add(RuleDeviceOutside, len(outside), "%s holds %d events of %s outside %s's membership periods (%s): seqs %s", v.Name, len(outside), conv, v.User, periodList(ps), seqList(outside))
			}
			if len(differs) > 0 {
				c.res.Add(RuleDeviceDiffers, len(differs), "%s holds %d events of %s other than the log's: seqs %s (%s)", v.Name, len(differs), conv, seqList(differs), example)
			}
			if len(missing) > 0 {
				c.res.Add(RuleDeviceLacks, len(missing), "%s lacks %d events of %s that %s may see (periods %s): seqs %s", v.Name, len(missing), conv, v.User, periodList(ps), seqList(missing))
			}
		}
	}
	c.res.Checked["device views"] = len(c.run.Views)
	c.res.Checked["device events"] = events
}

// sameShown compares what a view shows of an event with the log's.
func sameShown(view, log *logrecord.Event, bodies bool) bool {
	return view.MessageID == log.MessageID && view.Kind == log.Kind && view.Sender == log.Sender && (!bodies || view.Body == log.Body)
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
