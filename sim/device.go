package sim

import (
	"slices"

	"github.com/chatpipe/chatpipe/internal/readmodel"
	"github.com/chatpipe/chatpipe/logrecord"
)

// device is one app instance of a user. It builds its view of every
// conversation with sync, as delivery.Store.Sync answers it: the user's
// membership periods and the conversation's last seq from the projection,
// each period clipped to that last seq and to the seqs after the device's
// cursor (readmodel.Visible), the events in those ranges from what persist
// stored; the cursor moves to the end of the user's last period covered
// (delivery after persist, membership from the read model). Duplicates
// are dropped by seq, and the list is kept in seq order.
type device struct {
	user   string
	n      int
	cursor map[string]int64
	got    map[string][]*logrecord.Event
}

func newDevice(user string, n int) *device {
	return &device{user: user, n: n, cursor: map[string]int64{}, got: map[string][]*logrecord.Event{}}
}

// ranges is what a sync of conv reads for the device: the seq ranges it
// may see past its cursor, and the cursor it moves to.
func (d *device) ranges(p *Projection, conv string) ([]readmodel.Range, int64) {
	cur, last := d.cursor[conv], p.LastSeq(conv)
	next := cur
	var out []readmodel.Range
	for _, pr := range p.Periods(conv) {
		if pr.user != d.user {
			continue
		}
		var left *int64
		if pr.left != 0 {
			left = &pr.left
		}
		per := readmodel.NewPeriod(conv, d.user, pr.joined, left)
		next = max(next, min(per.To, last))
		if r, ok := readmodel.Visible(per, cur, last); ok {
			out = append(out, r)
		}
	}
	return out, next
}

// behind reports whether a sync would move a cursor: a period of the
// user ends (or the projected last seq is) past it.
func (d *device) behind(p *Projection, convs []string) bool {
	for _, c := range convs {
		cur, last := d.cursor[c], p.LastSeq(c)
		if last <= cur {
			continue
		}
		for k, left := range p.periods[c] {
			if k.user == d.user && (left == nil || *left > cur) {
				return true
			}
		}
	}
	return false
}

// sync pulls every conversation once.
func (d *device) sync(p *Projection, s *Sink, convs []string) {
	for _, c := range convs {
		rs, next := d.ranges(p, c)
		if len(rs) > 0 {
			for _, e := range s.Events(c) {
				for _, r := range rs {
					if e.Seq >= r.From && e.Seq <= r.To {
						d.add(c, e)
						break
					}
				}
			}
		}
		d.cursor[c] = next
	}
}

// add keeps e in conv's list, in seq order, unless its seq is there.
func (d *device) add(conv string, e *logrecord.Event) {
	evs := d.got[conv]
	i, found := slices.BinarySearchFunc(evs, e.Seq, func(x *logrecord.Event, seq int64) int { return int(x.Seq - seq) })
	if !found {
		d.got[conv] = slices.Insert(evs, i, e)
	}
}
