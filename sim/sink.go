package sim

import (
	"fmt"
	"sort"

	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/logrecord"
)

// Sink is the stand-in for persist and its Postgres tables: each poll is
// one transaction that reads the log read_committed from the partition's
// stored offset, inserts events with ON CONFLICT DO NOTHING on
// (conversation_id, seq) and (conversation_id, client_message_id), records a
// row it did not insert because a different message holds the key as a
// conflict, and stores the partition's next offset in the same transaction.
// It also answers the two queries a writer asks (shardworker/pgstate.go).
type Sink struct {
	next   map[int32]int64
	rows   map[string]map[int64]*logrecord.Event
	cmids  map[string]map[string]int64
	maxSeq map[string]int64
	// storedStep is the world step each (conversation, seq) was stored at.
	storedStep map[string]map[int64]int

	// Conflicts describes every broken invariant persist would log.
	Conflicts []string
	Inserted  int
	Skipped   int
}

// NewSink returns an empty sink.
func NewSink() *Sink {
	return &Sink{next: map[int32]int64{}, rows: map[string]map[int64]*logrecord.Event{}, cmids: map[string]map[string]int64{}, maxSeq: map[string]int64{},
		storedStep: map[string]map[int64]int{}}
}

// Offset is persist's next offset of part; ok is false before its first
// transaction there.
func (s *Sink) Offset(part int32) (int64, bool) {
	off, ok := s.next[part]
	return off, ok
}

// Pending reports whether part has records persist has not read yet.
func (s *Sink) Pending(l *Log, part int32) bool {
	return s.next[part] < l.StableOffset(part)
}

// Poll runs one persist transaction on part at world step step: at most
// max committed records.
func (s *Sink) Poll(l *Log, part int32, max, step int) {
	from := s.next[part]
	recs, upto := l.ReadCommitted(part, from, l.End(part))
	if len(recs) > max {
		recs = recs[:max]
		upto = recs[max-1].Offset + 1
	}
	for _, r := range recs {
		if r.Event.HasSeq() {
			s.insert(r, step)
		}
	}
	if upto > from || len(recs) > 0 {
		s.next[part] = upto
	}
}

func (s *Sink) insert(r *Record, step int) {
	e := r.Event
	rows, cm := s.rows[e.ConversationID], s.cmids[e.ConversationID]
	if rows == nil {
		rows, cm = map[int64]*logrecord.Event{}, map[string]int64{}
		s.rows[e.ConversationID], s.cmids[e.ConversationID] = rows, cm
	}
	if have, ok := rows[e.Seq]; ok {
		if have.MessageID == e.MessageID {
			s.Skipped++
			return
		}
		s.Conflicts = append(s.Conflicts, fmt.Sprintf("%s seq %d held by %s, incoming %s (partition %d offset %d)",
			e.ConversationID, e.Seq, have.MessageID, e.MessageID, r.Partition, r.Offset))
		return
	}
	if e.ClientMessageID != "" {
		if seq, ok := cm[e.ClientMessageID]; ok {
			s.Conflicts = append(s.Conflicts, fmt.Sprintf("%s client_message_id %s held by seq %d, incoming seq %d %s (partition %d offset %d)",
				e.ConversationID, e.ClientMessageID, seq, e.Seq, e.MessageID, r.Partition, r.Offset))
			return
		}
		cm[e.ClientMessageID] = e.Seq
	}
	rows[e.Seq] = e
	if s.storedStep[e.ConversationID] == nil {
		s.storedStep[e.ConversationID] = map[int64]int{}
	}
	s.storedStep[e.ConversationID][e.Seq] = step
	s.maxSeq[e.ConversationID] = max(s.maxSeq[e.ConversationID], e.Seq)
	s.Inserted++
}

// Events returns the stored events of conv in seq order.
func (s *Sink) Events(conv string) []*logrecord.Event {
	rows := s.rows[conv]
	out := make([]*logrecord.Event, 0, len(rows))
	for _, e := range rows {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out
}

// StoredAt reports the world step at which persist stored conv's seq.
func (s *Sink) StoredAt(conv string, seq int64) (int, bool) {
	step, ok := s.storedStep[conv][seq]
	return step, ok
}

// MaxSeq is the largest stored seq of conv (0: none).
func (s *Sink) MaxSeq(conv string) int64 { return s.maxSeq[conv] }

// LoadConv is shardworker's loadConvsSQL: every membership event of conv
// plus its last event, in seq order, in one snapshot.
func (s *Sink) LoadConv(conv string) *shardcore.Conv {
	c := shardcore.NewConv()
	evs := s.Events(conv)
	for i, e := range evs {
		if e.Kind == logrecord.KindMessage {
			if i == len(evs)-1 {
				shardcore.ObserveSeq(c, e.Seq)
			}
			continue
		}
		shardcore.Apply(c, &logrecord.Event{Kind: e.Kind, ConversationID: conv, Seq: e.Seq, Sender: e.Sender, UserID: e.UserID, Members: e.Members,
			ToVShard: e.ToVShard, CreatedAt: e.CreatedAt, Verdicts: e.Verdicts})
	}
	// shardworker's loadKeysSQL, in the same snapshot here.
	keys := make([]string, 0, len(s.cmids[conv]))
	for k := range s.cmids[conv] {
		keys = append(keys, k)
	}
	shardcore.KnowKeys(c, keys)
	return c
}

// Lookup is shardworker's lookupDedupeSQL for one key.
func (s *Sink) Lookup(conv, cmid string) (shardcore.First, bool) {
	seq, ok := s.cmids[conv][cmid]
	if !ok {
		return shardcore.First{}, false
	}
	e := s.rows[conv][seq]
	return shardcore.First{Seq: e.Seq, MessageID: e.MessageID, Sender: e.Sender, Kind: e.Kind, At: e.CreatedAt}, true
}
