package readmodel

import "math"

// Period is a user's membership of a conversation: seqs From through To,
// both inclusive (the removal event is still theirs). An open period has
// To = math.MaxInt64.
type Period struct {
	Conv string
	User string
	From int64
	To   int64
}

// NewPeriod builds a period from the read model's joined_seq and left_seq
// (nil while a member).
func NewPeriod(conv, user string, joined int64, left *int64) Period {
	p := Period{Conv: conv, User: user, From: joined, To: math.MaxInt64}
	if left != nil {
		p.To = *left
	}
	return p
}

// Covers reports whether the user may see seq of the conversation.
func (p Period) Covers(seq int64) bool { return seq >= p.From && seq <= p.To }

// Range is a conversation's seq range, both ends inclusive.
type Range struct {
	Conv     string
	From, To int64
}

// Visible clips period p to the seqs the read model has applied (through
// last) and to those after cursor. ok is false when nothing is left.
func Visible(p Period, cursor, last int64) (r Range, ok bool) {
	r = Range{Conv: p.Conv, From: max(p.From, cursor+1), To: min(p.To, last)}
	return r, r.From <= r.To
}

// Covering lists the users whose periods (of one conversation) cover seq:
// who receives the event at seq.
func Covering(periods []Period, seq int64) []string {
	var out []string
	for _, p := range periods {
		if p.Covers(seq) {
			out = append(out, p.User)
		}
	}
	return out
}
