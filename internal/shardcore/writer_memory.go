package shardcore

import (
	"maps"
	"slices"
	"time"

	"golang.org/x/time/rate"

	"github.com/chatpipe/chatpipe/protocol"
)

// What a Writer remembers and how it bounds it: the events persist may not
// have stored yet, dedupe trimming, eviction, and the per-conversation
// rate limits.

// KnownKeysMax bounds a cached conversation's filter of known keys
// (Conv.Known, a few bytes a key): past it the filter is dropped, and the
// conversation's new keys are looked up in durable state until it is
// loaded again.
const KnownKeysMax = 1 << 20

// housekept bounds the writer's memory once persist's offset is known: it
// forgets what persist has stored, trims every cached conversation's
// dedupe to the configured bounds, forgets the verdicts past
// RefusalMemory, and evicts conversations beyond MaxConvs. Without
// persist's offset it trims nothing.
func (m *Writer) housekept(now time.Time, persisted int64, ok bool) {
	defer m.afterBatch(now)
	if !ok {
		return
	}
	n := 0
	for ; n < len(m.unstored) && m.unstored[n].off < persisted; n++ {
		u := m.unstored[n]
		st := m.stored[u.conv]
		st.seq = max(st.seq, u.seq)
		if st.pending--; st.pending == 0 {
			delete(m.stored, u.conv)
		}
	}
	if n > 0 {
		m.unstored = append(m.unstored[:0], m.unstored[n:]...)
	}
	cutoff := now.Add(-m.cfg.DedupeMemory)
	trimmed, held := 0, 0
	for cid, conv := range m.convs {
		known := conv.Known
		if m.cfg.Faults.KnownForgetsTrimmed {
			conv.Known = nil
		}
		trimmed += TrimDedupe(conv, m.storedUpTo(cid, conv), m.cfg.DedupeKeep, cutoff)
		conv.Known = known
		if known != nil && known.Len() > KnownKeysMax {
			conv.Known = nil // its keys are looked up again, as without one
		}
		held += len(conv.Dedupe)
	}
	m.verdicts.trim(now.Add(-m.cfg.RefusalMemory))
	m.notice.Trimmed, m.notice.DedupeHeld = trimmed, held
	if len(m.convs) > m.cfg.MaxConvs {
		m.notice.Evicted = m.evict()
	}
}

// evict drops cached conversations whose events are all in durable state
// (none listed unstored, as of the last read of persist's offset) until
// the cache is at 3/4 of MaxConvs; they are reloaded on their next
// command. Conversations persist has not caught up with stay: reloading
// them would miss their newest events, so the cache is bounded by
// MaxConvs plus persist's lag. The verdicts remembered for a
// conversation's keys are the writer's, not the cached state's: evicting
// it forgets none of them. It looks at the conversations in id order, not
// in the map's random one, so that what it drops is a function of the
// writer's inputs (the simulation replays a schedule from its seed).
func (m *Writer) evict() int {
	target := m.cfg.MaxConvs * 3 / 4
	n := 0
	for _, cid := range slices.Sorted(maps.Keys(m.convs)) {
		if len(m.convs) <= target {
			break
		}
		if m.stored[cid] == nil && !m.pinnedByVerdict(cid) {
			delete(m.convs, cid)
			delete(m.rates, cid)
			n++
		}
	}
	return n
}

// pinnedByVerdict reports whether the VerdictsPinConvs fault keeps
// conversation cid cached: a verdict remembered for one of its keys.
func (m *Writer) pinnedByVerdict(cid string) bool {
	if !m.cfg.Faults.VerdictsPinConvs {
		return false
	}
	for k := range m.verdicts.byKey {
		if k.Conv == cid {
			return true
		}
	}
	return false
}

// unstoredEvent is an event at a log offset that persist may not have
// stored yet.
type unstoredEvent struct {
	conv string
	seq  int64
	off  int64
}

// storedSeq is what the writer knows of a conversation with unstored
// events: how many are listed, and the highest seq known stored.
type storedSeq struct {
	pending int
	seq     int64
}

// markUnstored lists conversation cid's event seq at log offset off as not
// yet known stored. Seqs of a conversation grow with offsets, so when the
// conversation had nothing pending, everything below seq is stored.
func (m *Writer) markUnstored(cid string, seq, off int64) {
	st := m.stored[cid]
	if st == nil {
		st = &storedSeq{seq: seq - 1}
		m.stored[cid] = st
	}
	st.pending++
	m.unstored = append(m.unstored, unstoredEvent{cid, seq, off})
}

// storedUpTo is the highest seq of conversation cid known to be in
// durable state: every seq of a conversation with nothing pending.
func (m *Writer) storedUpTo(cid string, conv *Conv) int64 {
	if st := m.stored[cid]; st != nil {
		return st.seq
	}
	return conv.LastSeq
}

// allowSend takes a token from the conversation's message bucket for a new
// send; a retry that dedupe or its remembered verdict (prior) answers
// costs nothing (it writes nothing). It runs in the mailbox, before any
// seq is assigned.
func (m *Writer) allowSend(conv *Conv, cmd *Command, prior *Verdict, now time.Time) (time.Duration, bool) {
	if cmd.Op != protocol.OpSend || m.cfg.ConvRate <= 0 || prior != nil || !m.here(conv, cmd.ConversationID) {
		return 0, true
	}
	if _, dup := conv.Dedupe[cmd.ClientMessageID]; dup {
		return 0, true
	}
	if m.rates == nil {
		m.rates = map[string]*rate.Limiter{}
	}
	lim := m.rates[cmd.ConversationID]
	if lim == nil {
		lim = rate.NewLimiter(rate.Limit(m.cfg.ConvRate), m.cfg.ConvBurst)
		m.rates[cmd.ConversationID] = lim
	}
	r := lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d, false
	}
	return 0, true
}
