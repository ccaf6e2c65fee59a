package readmodel

import (
	"cmp"
	"math"
	"slices"

	"github.com/chatpipe/chatpipe/logrecord"
)

// LogPeriods folds events into the membership periods they make, by
// conversation and user, each user's periods in seq order: who was a
// member of which conversation between which seqs, as the log says.
//
// Each conversation's events are taken in seq order, whatever order they
// come in (a moved conversation's events are in more than one partition).
// A create opens a period for its sender and each listed member, a join
// one for its user_id, unless that user's period is open already; a kick
// or a leave closes user_id's open period at its seq (the removal event is
// still theirs). A period still open has To = math.MaxInt64. Records
// without a seq (takeover markers, read markers) and other kinds change
// nothing; so does a kick or leave without user_id (malformed: the
// log-record schema requires it).
//
// These are the rules PlanBatch's membership changes follow, which the
// projection applies to the read model; LogPeriods reads the events
// themselves rather than a plan, so that a check of the read model against
// it does not take the plan's word for them.
func LogPeriods(events []*logrecord.Event) map[string]map[string][]Period {
	evs := make([]*logrecord.Event, 0, len(events))
	for _, e := range events {
		if e.HasSeq() && e.ConversationID != "" {
			evs = append(evs, e)
		}
	}
	slices.SortStableFunc(evs, func(a, b *logrecord.Event) int {
		return cmp.Or(cmp.Compare(a.ConversationID, b.ConversationID), cmp.Compare(a.Seq, b.Seq))
	})
	out := map[string]map[string][]Period{}
	for _, e := range evs {
		conv := e.ConversationID
		users := out[conv]
		if users == nil {
			users = map[string][]Period{}
			out[conv] = users
		}
		open := func(u string) {
			ps := users[u]
			if u == "" || (len(ps) > 0 && ps[len(ps)-1].To == math.MaxInt64) {
				return
			}
			users[u] = append(ps, Period{Conv: conv, User: u, From: e.Seq, To: math.MaxInt64})
		}
		switch e.Kind {
		case logrecord.KindCreate:
			open(e.Sender)
			for _, u := range e.Members {
				open(u)
			}
		case logrecord.KindJoin:
			open(e.UserID)
		case logrecord.KindKick, logrecord.KindLeave:
			if ps := users[e.UserID]; len(ps) > 0 && ps[len(ps)-1].To == math.MaxInt64 {
				ps[len(ps)-1].To = e.Seq
			}
		}
	}
	return out
}

// CoversAny reports whether one of periods covers seq.
func CoversAny(periods []Period, seq int64) bool {
	for _, p := range periods {
		if p.Covers(seq) {
			return true
		}
	}
	return false
}
