package sim

import "github.com/chatpipe/chatpipe/logrecord"

// roster is the checker's own membership of one conversation, kept apart
// from shardcore so that the properties do not trust the code they check.
type roster map[string]bool

// apply changes the roster by one event.
func (r roster) apply(e *logrecord.Event) {
	switch e.Kind {
	case logrecord.KindCreate:
		r[e.Sender] = true
		for _, m := range e.Members {
			r[m] = true
		}
	case logrecord.KindJoin:
		r[e.UserID] = true
	case logrecord.KindKick, logrecord.KindLeave:
		delete(r, e.UserID)
	}
}

// removes reports whether e removes user.
func removes(e *logrecord.Event, user string) bool {
	return (e.Kind == logrecord.KindKick || e.Kind == logrecord.KindLeave) && e.UserID == user
}

// visibleTo filters a seq-ordered event list to what user's devices are
// delivered: the events while user is a member, and the event removing them.
func visibleTo(evs []*logrecord.Event, user string) []*logrecord.Event {
	r := roster{}
	var out []*logrecord.Event
	for _, e := range evs {
		r.apply(e)
		if r[user] || removes(e, user) {
			out = append(out, e)
		}
	}
	return out
}

// logPeriods are the membership periods of a conversation's events evs
// (in seq order) up to seq upTo: a create opens one for its sender and
// each member, a join for its user, unless they are members already; a
// kick or leave closes the user's at its seq. A period the log closes
// only after upTo is open.
func logPeriods(evs []*logrecord.Event, upTo int64) []period {
	open := map[string]int{}
	var out []period
	opens := func(u string, seq int64) {
		if _, ok := open[u]; !ok && u != "" {
			open[u] = len(out)
			out = append(out, period{user: u, joined: seq})
		}
	}
	for _, e := range evs {
		if e.Seq > upTo {
			break
		}
		switch e.Kind {
		case logrecord.KindCreate:
			opens(e.Sender, e.Seq)
			for _, m := range e.Members {
				opens(m, e.Seq)
			}
		case logrecord.KindJoin:
			opens(e.UserID, e.Seq)
		case logrecord.KindKick, logrecord.KindLeave:
			if i, ok := open[e.UserID]; ok {
				out[i].left = e.Seq
				delete(open, e.UserID)
			}
		}
	}
	sortPeriods(out)
	return out
}
