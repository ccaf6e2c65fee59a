package readmodel

import (
	"sort"
	"time"

	"github.com/chatpipe/chatpipe/logrecord"
)

// MemberOp opens (Join) or closes a membership period at Seq.
type MemberOp struct {
	Conv, User string
	Seq        int64
	Join       bool
}

// Touched is one conversation's seq range in a batch.
type Touched struct {
	Conv     string
	From, To int64
	LastAt   time.Time
}

// ReadOp is the highest read marker a batch records for one user and
// conversation.
type ReadOp struct {
	Conv, User string
	Seq        int64
}

// Plan is what one batch of committed records does to the read model.
type Plan struct {
	Members []MemberOp // by conversation, in seq order
	// Seqs lists the conversation and seq of every event of the batch
	// that takes a seq, for the projection's check that it applies each
	// conversation's events in seq order (gapSQL).
	SeqConvs []string
	Seqs     []int64
	Convs    []Touched // sorted by conversation id
	Reads    []ReadOp  // one per (conversation, user), sorted
}

// PlanBatch turns a batch of decoded events (in log order per partition)
// into membership changes (each conversation's in seq order) and each
// conversation's seq range. It is pure:
// the projection applies the plan in one Postgres transaction.
//
// create opens a period for every listed member and the sender; join opens
// one for user_id; kick and leave close user_id's open period at their seq
// (the removal event itself is still theirs). Takeover markers carry no seq
// and are skipped. Read markers take no seq either: each (conversation,
// user) gets the highest marker of the batch, which the projection keeps
// only if it is higher than the one stored.
func PlanBatch(events []*logrecord.Event) Plan {
	var p Plan
	idx := map[string]int{}
	var reads map[[2]string]int
	for _, e := range events {
		if e.Kind == logrecord.KindRead && e.ConversationID != "" {
			k := [2]string{e.ConversationID, e.UserID}
			if reads == nil {
				reads = map[[2]string]int{}
			}
			if i, ok := reads[k]; ok {
				p.Reads[i].Seq = max(p.Reads[i].Seq, e.ReadSeq)
			} else {
				reads[k] = len(p.Reads)
				p.Reads = append(p.Reads, ReadOp{Conv: e.ConversationID, User: e.UserID, Seq: e.ReadSeq})
			}
			continue
		}
		if !e.HasSeq() || e.ConversationID == "" {
			continue
		}
		p.SeqConvs, p.Seqs = append(p.SeqConvs, e.ConversationID), append(p.Seqs, e.Seq)
		switch e.Kind {
		case logrecord.KindCreate:
			seen := map[string]bool{}
			for _, u := range append([]string{e.Sender}, e.Members...) {
				if u != "" && !seen[u] {
					seen[u] = true
					p.Members = append(p.Members, MemberOp{Conv: e.ConversationID, User: u, Seq: e.Seq, Join: true})
				}
			}
		case logrecord.KindJoin:
			p.Members = append(p.Members, MemberOp{Conv: e.ConversationID, User: e.UserID, Seq: e.Seq, Join: true})
		case logrecord.KindKick, logrecord.KindLeave:
			p.Members = append(p.Members, MemberOp{Conv: e.ConversationID, User: e.UserID, Seq: e.Seq})
		}
		i, ok := idx[e.ConversationID]
		if !ok {
			i = len(p.Convs)
			idx[e.ConversationID] = i
			p.Convs = append(p.Convs, Touched{Conv: e.ConversationID, From: e.Seq, To: e.Seq, LastAt: e.CreatedAt})
			continue
		}
		t := &p.Convs[i]
		t.From, t.To = min(t.From, e.Seq), max(t.To, e.Seq)
		if e.CreatedAt.After(t.LastAt) {
			t.LastAt = e.CreatedAt
		}
	}
	// A batch may hold a moved conversation's records of two partitions,
	// the newer vshard's first: its membership changes apply in seq order.
	sort.SliceStable(p.Members, func(a, b int) bool {
		if p.Members[a].Conv != p.Members[b].Conv {
			return p.Members[a].Conv < p.Members[b].Conv
		}
		return p.Members[a].Seq < p.Members[b].Seq
	})
	sort.Slice(p.Convs, func(a, b int) bool { return p.Convs[a].Conv < p.Convs[b].Conv })
	sort.Slice(p.Reads, func(a, b int) bool {
		if p.Reads[a].Conv != p.Reads[b].Conv {
			return p.Reads[a].Conv < p.Reads[b].Conv
		}
		return p.Reads[a].User < p.Reads[b].User
	})
	return p
}
