package loadgen

import "slices"

// convCursor is what a device knows it holds of one conversation: every
// event it may see up to seq (the cursor it syncs from), and the events
// it got beyond a gap. A pushed event does not move the cursor past a
// gap: pushes after a gap are not a proof that the gap is filled
// (docs/protocol.md). Only a run of events with no gap does, or a
// `synced` reply, which covers its cursors.
type convCursor struct {
	seq int64
	// member: the device's user was a member as of seq (so a gap after
	// seq is events it may see). A gap while not a member ends at the
	// user's own join: the events between are not theirs to see.
	member bool
	above  map[int64]cursorEvent // events held beyond seq
}

type cursorEvent struct {
	kind   string
	userID string
}

// event notes an event of user's conversation.
func (c *convCursor) event(user string, seq int64, kind, userID string) {
	if seq <= c.seq {
		return
	}
	if c.above == nil {
		c.above = map[int64]cursorEvent{}
	}
	c.above[seq] = cursorEvent{kind, userID}
	c.advance(user)
}

// covered notes a `synced` reply that covered the conversation up to seq:
// the events up to it the user may see came before the reply.
func (c *convCursor) covered(user string, seq int64) {
	if seq <= c.seq {
		return
	}
	var in []int64
	for s := range c.above {
		if s <= seq {
			in = append(in, s)
		}
	}
	slices.Sort(in)
	for _, s := range in {
		c.apply(user, s)
	}
	c.seq = seq
	c.advance(user)
}

// apply consumes the held event at s, the next one the cursor passes.
func (c *convCursor) apply(user string, s int64) {
	e := c.above[s]
	delete(c.above, s)
	// Events reach the user only while a member (their own join
	// included); their removal is the last one until they are back.
	c.member = !(e.userID == user && (e.kind == "kick" || e.kind == "leave"))
}

func (c *convCursor) advance(user string) {
	for len(c.above) > 0 {
		if _, ok := c.above[c.seq+1]; ok {
			c.apply(user, c.seq+1)
			c.seq++
			continue
		}
		if c.member {
			return
		}
		// Not a member as of the cursor: the next event held, if it is
		// the user's own join, ends the gap.
		low := int64(-1)
		for s := range c.above {
			if low < 0 || s < low {
				low = s
			}
		}
		e := c.above[low]
		if e.userID != user || e.kind != "join" {
			return
		}
		c.apply(user, low)
		c.seq = low
	}
}
