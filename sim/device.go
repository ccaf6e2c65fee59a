package sim

import "github.com/chatpipe/chatpipe/logrecord"

// device is one app instance of a user. It builds its view of every
// conversation from the sink only ("delivery after persist"), with a sync
// cursor per conversation: each sync pulls the events above the cursor in
// seq order and keeps those its user may see.
type device struct {
	user   string
	n      int
	cursor map[string]int64
	got    map[string][]*logrecord.Event
}

func newDevice(user string, n int) *device {
	return &device{user: user, n: n, cursor: map[string]int64{}, got: map[string][]*logrecord.Event{}}
}

// behind reports whether the sink holds events above a cursor.
func (d *device) behind(s *Sink, convs []string) bool {
	for _, c := range convs {
		if s.MaxSeq(c) > d.cursor[c] {
			return true
		}
	}
	return false
}

// sync pulls every conversation once.
func (d *device) sync(s *Sink, convs []string) {
	for _, c := range convs {
		all := s.Events(c)
		r := roster{}
		for _, e := range all {
			r.apply(e)
			if e.Seq <= d.cursor[c] {
				continue
			}
			if r[d.user] || removes(e, d.user) {
				d.got[c] = append(d.got[c], e)
			}
			d.cursor[c] = e.Seq
		}
	}
}
