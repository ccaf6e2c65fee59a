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
