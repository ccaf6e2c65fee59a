package sim

import (
	"math"
	"slices"

	"github.com/chatpipe/chatpipe/internal/readmodel"
	"github.com/chatpipe/chatpipe/logrecord"
)

// Projection is the stand-in for the read model (projection/projection.go)
// and whoever applies it: membership periods (memberships) and each
// conversation's projected last seq (conversations). Each batch is one
// Postgres transaction over records persist has stored (it takes only
// records below persist's offset), from the partitions' own offsets. A
// batch holds one partition's records, or several partitions' one after
// the other, as a consumer that owns them fetches them; each partition
// lags on its own (and may stop for a few ticks: a rebalance, a slow
// member), so after a move a conversation's newer events may be applied
// before its older partition's tail.
//
// persist applies the read model in the transaction that stores a batch,
// so a running pipeline's read model never lags persist: its orderings
// (each partition applied in log order, with its events) are among those
// explored here, and the lagging ones are those of a rebuild
// (persist/rebuild.go), which projects a stored log in the order it reads
// it.
//
// The batch's plan is readmodel.PlanBatch's (membership changes by
// conversation and seq); then, as projection.ReadModel.Queue does: gapSQL (a
// conversation whose seqs leave a hole above its projected last seq gets
// every period rewritten from the events persist stored up to the batch's
// highest seq, docs/architecture.md rule 25), joinSQL and leaveSQL for
// each change, conversationsSQL for the last seqs. Bugs.ProjectionRecordOrder
// applies the changes in record order and fills no hole.
type Projection struct {
	next     map[int32]int64
	lagUntil map[int32]int64                 // a partition's consumer does not poll while now < lagUntil
	periods  map[string]map[periodKey]*int64 // conversation → (user, joined_seq) → left_seq (nil: open)
	lastSeq  map[string]int64
}

// periodKey is memberships' primary key within a conversation.
type periodKey struct {
	user   string
	joined int64
}

// NewProjection returns an empty read model.
func NewProjection() *Projection {
	return &Projection{next: map[int32]int64{}, lagUntil: map[int32]int64{}, periods: map[string]map[periodKey]*int64{}, lastSeq: map[string]int64{}}
}

// Pending reports whether part has records persist stored that the
// projection has not applied.
func (p *Projection) Pending(s *Sink, part int32) bool {
	return p.next[part] < s.next[part]
}

// lagging reports whether part's consumer is not polling at now.
func (p *Projection) lagging(part int32, now int64) bool { return now < p.lagUntil[part] }

// take reads up to max committed records of part that persist has stored,
// from the projection's offset on; it returns their events and the
// partition's next offset after them.
func (p *Projection) take(l *Log, s *Sink, part int32, max int) ([]*logrecord.Event, int64) {
	recs, upto := l.ReadCommitted(part, p.next[part], s.next[part])
	if len(recs) > max {
		recs = recs[:max]
		upto = recs[max-1].Offset + 1
	}
	evs := make([]*logrecord.Event, len(recs))
	for i, r := range recs {
		evs[i] = r.Event
	}
	return evs, upto
}

// Poll applies one batch of the partitions parts, in that order, and
// returns the conversations it touched.
func (p *Projection) Poll(w *World, parts []int32, max int) []string {
	var events []*logrecord.Event
	next := map[int32]int64{}
	for _, part := range parts {
		evs, upto := p.take(w.log, w.sink, part, max)
		events = append(events, evs...)
		next[part] = upto
	}
	touched := p.apply(events, w.sink, w.cfg.Bugs.ProjectionRecordOrder, &w.stats)
	for part, upto := range next {
		p.next[part] = upto
	}
	w.stats.ProjectedBatches++
	return touched
}

// apply is one batch's changes to the read model (projection.ReadModel.Queue).
func (p *Projection) apply(events []*logrecord.Event, s *Sink, recordOrder bool, st *Stats) []string {
	plan := readmodel.PlanBatch(events)
	members := plan.Members
	if recordOrder {
		// The order before rule 25: each event's changes as it comes.
		members = nil
		for _, e := range events {
			members = append(members, readmodel.PlanBatch([]*logrecord.Event{e}).Members...)
		}
	} else if len(plan.Seqs) > 0 {
		st.GapFills += p.fillGaps(plan.SeqConvs, plan.Seqs, s)
	}
	for _, m := range members {
		rows := p.rows(m.Conv)
		if m.Join {
			k := periodKey{m.User, m.Seq}
			if _, ok := rows[k]; !ok { // joinSQL: ON CONFLICT DO NOTHING
				rows[k] = nil
			}
			continue
		}
		// leaveSQL: close the user's open periods that began before it.
		for k, left := range rows {
			if k.user == m.User && left == nil && k.joined < m.Seq {
				seq := m.Seq
				rows[k] = &seq
			}
		}
	}
	var touched []string
	for _, t := range plan.Convs { // conversationsSQL: GREATEST
		p.lastSeq[t.Conv] = max(p.lastSeq[t.Conv], t.To)
		touched = append(touched, t.Conv)
	}
	return touched
}

// fillGaps is gapSQL: for each conversation of the batch (one entry of
// convs/seqs per event with a seq) whose seqs after its projected last
// seq leave a hole below the batch's highest seq hi, every period of its
// stored events up to hi is written (inserted, or its left_seq replaced).
// The periods are readmodel.LogPeriods's, the rule gapSQL keeps (the
// projection's TestGapFillMatchesLogPeriods holds gapSQL to it). It
// returns how many conversations it rewrote.
func (p *Projection) fillGaps(convs []string, seqs []int64, s *Sink) int {
	hi, above := map[string]int64{}, map[string]map[int64]bool{}
	var order []string
	for i, c := range convs {
		if _, ok := hi[c]; !ok {
			order = append(order, c)
			above[c] = map[int64]bool{}
		}
		hi[c] = max(hi[c], seqs[i])
		if seqs[i] > p.lastSeq[c] {
			above[c][seqs[i]] = true
		}
	}
	n := 0
	for _, c := range order {
		lo := p.lastSeq[c]
		if hi[c] <= lo || int64(len(above[c])) >= hi[c]-lo {
			continue
		}
		n++
		var ev []*logrecord.Event
		for _, e := range s.Events(c) {
			if e.Seq <= hi[c] {
				ev = append(ev, e)
			}
		}
		rows := p.rows(c)
		for user, ps := range readmodel.LogPeriods(ev)[c] {
			for _, per := range ps {
				var left *int64
				if per.To != math.MaxInt64 {
					to := per.To
					left = &to
				}
				rows[periodKey{user, per.From}] = left
			}
		}
	}
	return n
}

func (p *Projection) rows(conv string) map[periodKey]*int64 {
	rows := p.periods[conv]
	if rows == nil {
		rows = map[periodKey]*int64{}
		p.periods[conv] = rows
	}
	return rows
}

// period is one membership period, as the read model or the log gives it.
type period struct {
	user   string
	joined int64
	left   int64 // 0: open
}

// Periods returns conv's membership periods, by user and joined seq.
func (p *Projection) Periods(conv string) []period {
	var out []period
	for k, left := range p.periods[conv] {
		pr := period{user: k.user, joined: k.joined}
		if left != nil {
			pr.left = *left
		}
		out = append(out, pr)
	}
	sortPeriods(out)
	return out
}

// LastSeq is conv's projected last seq (0: none).
func (p *Projection) LastSeq(conv string) int64 { return p.lastSeq[conv] }

func sortPeriods(ps []period) {
	slices.SortFunc(ps, func(a, b period) int {
		if a.user != b.user {
			if a.user < b.user {
				return -1
			}
			return 1
		}
		return int(a.joined - b.joined)
	})
}
