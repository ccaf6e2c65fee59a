package shardcore

import (
	"time"

	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// A Writer's remembered verdicts: the answers of keyed commands that wrote
// nothing (a rejection, or a join of a current member), kept by key apart
// from the cached conversations, so that evicting a conversation's state
// forgets none of them and none pins a conversation in the cache.

// DefaultMaxVerdicts is WriterConfig.MaxVerdicts' default.
const DefaultMaxVerdicts = 10000

// verdictTable holds verdicts by key, at most a given number, oldest first
// for dropping. A verdict older than the memory is never answered, and is
// dropped as soon as it reaches the front.
type verdictTable struct {
	byKey map[DedupeKey]Verdict
	// order lists byKey's keys by when they were put, from head on.
	order []DedupeKey
	head  int
}

// get returns the verdict of k decided at or after cutoff, if any.
func (t *verdictTable) get(k DedupeKey, cutoff time.Time) (Verdict, bool) {
	v, ok := t.byKey[k]
	if !ok || v.At.Before(cutoff) {
		return Verdict{}, false
	}
	return v, true
}

// put records v as k's verdict unless one decided at or after cutoff is
// held (the first stands), forgetting the ones older than cutoff and,
// while limit are held, the oldest. It returns how many it dropped before
// their time to make room.
func (t *verdictTable) put(k DedupeKey, v Verdict, cutoff time.Time, limit int) int {
	t.trim(cutoff)
	if t.byKey == nil {
		t.byKey = map[DedupeKey]Verdict{}
	}
	if old, ok := t.byKey[k]; ok {
		if old.At.Before(cutoff) {
			t.byKey[k] = v // expired, out of time order: replaced where it stands
		}
		return 0
	}
	dropped := 0
	for len(t.byKey) >= max(limit, 1) {
		t.pop()
		dropped++
	}
	t.byKey[k] = v
	t.order = append(t.order, k)
	return dropped
}

// trim forgets the verdicts decided before cutoff, from the oldest on. It
// returns how many it dropped.
func (t *verdictTable) trim(cutoff time.Time) int {
	n := 0
	for t.head < len(t.order) && t.byKey[t.order[t.head]].At.Before(cutoff) {
		t.pop()
		n++
	}
	return n
}

// pop forgets the oldest verdict.
func (t *verdictTable) pop() {
	delete(t.byKey, t.order[t.head])
	t.order[t.head] = DedupeKey{}
	t.head++
	if t.head == len(t.order) {
		t.order, t.head = t.order[:0], 0
	} else if t.head > 64 && t.head > len(t.order)/2 {
		t.order = append(t.order[:0], t.order[t.head:]...)
		t.head = 0
	}
}

// len is the number of verdicts held.
func (t *verdictTable) len() int { return len(t.byKey) }

// recall returns the verdict remembered for call c's key that applies to
// it (the same sender and op), if any: one decided earlier in the batch in
// hand, else one answered by an earlier batch within RefusalMemory.
func (m *Writer) recall(c *Call, now time.Time) (Verdict, bool) {
	if c.Cmd.ClientMessageID == "" {
		return Verdict{}, false
	}
	k := DedupeKey{c.Cmd.ConversationID, c.Cmd.ClientMessageID}
	v, ok := m.batchVerdicts[k]
	if !ok {
		v, ok = m.verdicts.get(k, now.Add(-m.cfg.RefusalMemory))
	}
	if !ok || v.Sender != c.Cmd.Sender || v.Op != c.Cmd.Op {
		return Verdict{}, false
	}
	return v, true
}

// stageVerdict notes v as the verdict of call c's key, decided in the
// batch in hand: it answers the batch's later attempts of the key, and is
// remembered once the batch's answers are given (keepVerdicts). A batch
// that fails forgets it: its state may have held events that were never
// committed.
func (m *Writer) stageVerdict(c *Call, v Verdict) {
	k := DedupeKey{c.Cmd.ConversationID, c.Cmd.ClientMessageID}
	if _, ok := m.batchVerdicts[k]; ok {
		return
	}
	if m.batchVerdicts == nil {
		m.batchVerdicts = map[DedupeKey]Verdict{}
	}
	m.batchVerdicts[k] = v
	m.batchVerdictOrder = append(m.batchVerdictOrder, k)
}

// keepVerdicts remembers the verdicts of the batch whose answers are being
// given, in the order they were decided.
func (m *Writer) keepVerdicts(now time.Time) {
	cutoff := now.Add(-m.cfg.RefusalMemory)
	for _, k := range m.batchVerdictOrder {
		m.notice.VerdictsDropped += m.verdicts.put(k, m.batchVerdicts[k], cutoff, m.cfg.MaxVerdicts)
	}
}

// MaxCarriedVerdicts bounds the verdicts one moved record carries (the
// newest are kept), so that the record stays far below the broker's
// record size limit (about 400 bytes each at most: 100 kB) whatever
// clients sent. An attempt of a key left out is decided again by the
// writer the conversation moved to.
const MaxCarriedVerdicts = 256

// carried lists the verdicts of conversation cid's keys decided at or
// after cutoff — remembered, or decided in the batch in hand — for its
// moved record, oldest first, at most MaxCarriedVerdicts (the newest).
func (m *Writer) carried(cid string, cutoff time.Time) []logrecord.Verdict {
	var out []logrecord.Verdict
	add := func(k DedupeKey, v Verdict) {
		if k.Conv != cid || v.At.Before(cutoff) {
			return
		}
		lv := logrecord.Verdict{ClientMessageID: k.CMID, Sender: v.Sender, Op: v.Op, Seq: v.Seq, At: v.At}
		if v.Err != nil {
			lv.Code, lv.Message = string(v.Err.Code), v.Err.Message
		}
		out = append(out, lv)
	}
	t := &m.verdicts
	for _, k := range t.order[t.head:] {
		if _, staged := m.batchVerdicts[k]; !staged {
			add(k, t.byKey[k])
		}
	}
	for _, k := range m.batchVerdictOrder {
		add(k, m.batchVerdicts[k])
	}
	if n := len(out) - MaxCarriedVerdicts; n > 0 {
		m.notice.VerdictsDropped += n
		out = out[n:]
	}
	return out
}

// adopt remembers the verdicts that conversation cid's moved record
// carried to this writer, as if it had given them (at their own time, so
// they are forgotten when the first writer would have forgotten them). A
// verdict this writer holds for the key stands.
func (m *Writer) adopt(cid string, vs []logrecord.Verdict, now time.Time) {
	cutoff := now.Add(-m.cfg.RefusalMemory)
	for _, lv := range vs {
		v := Verdict{Sender: lv.Sender, Op: lv.Op, Seq: lv.Seq, At: lv.At}
		if lv.Code != "" {
			v.Err = &protocol.Error{Code: protocol.Code(lv.Code), Message: lv.Message}
		}
		if !v.At.Before(cutoff) {
			m.notice.VerdictsDropped += m.verdicts.put(DedupeKey{cid, lv.ClientMessageID}, v, cutoff, m.cfg.MaxVerdicts)
		}
	}
}
