package gateway

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/internal/delivery"
	"github.com/chatpipe/chatpipe/protocol"
)

// The feed pushes in bursts. After persist was down for a
// while, one read of the outbox carries everything that piled up, often more
// frames for one user than a send buffer holds, to devices that read as fast
// as they can. Closing them all would answer an outage with a reconnect
// storm. Instead a session whose buffer has no room for a push stops taking
// pushes and keeps, per conversation, the range of seqs it did not take and
// the highest read marker it did not take: memory bounded by the user's
// conversations, not by the burst. Its catch-up goroutine reads the ranges
// back from the read model (Since, which also applies the membership
// periods) and queues them, and the markers, as room appears; once nothing
// is left, the session takes pushes again. A device that does not read at
// all is still closed with 1008: a frame of its catch-up that waits
// SlowReader for room ends it.
//
// Per conversation a device gets its pushed events in seq order, each for
// the first time after every lower one (a repeat of one it already has may
// come later), and pushed read markers never go back:
//   - Every pushed frame, live or read back, goes through the send buffer,
//     one FIFO queue written by one writer. Live pushes are queued only
//     while no backlog is kept, read-back frames only while one is: the
//     two never interleave.
//   - The feed pushes a conversation's events in seq order. The first push
//     that finds no room starts the backlog, and it and every later push
//     join it: each is above everything of its conversation already queued.
//   - The catch-up reads a conversation back from the lowest seq not queued
//     upward, in seq order, each read starting after the last; it hands
//     the session back to live pushes only once it read past every seq
//     that joined the backlog. The read model may return more than was
//     pushed (it is ahead of the feed); those the feed pushes again later
//     arrive as repeats.
//   - A marker that finds no room is queued as the highest one that did not
//     fit, not as the read model's current marker: the feed pushes a
//     user's markers of a conversation in increasing order, and would
//     follow a newer one read from the read model with older ones it had
//     not pushed yet.
// Devices drop repeats by (conversation_id, seq).

var errNoReads = errors.New("this gateway has no read model")

// backlog is what a session's send buffer had no room for.
type backlog struct {
	mu     sync.Mutex
	active bool             // pushes go here, not to the send buffer
	from   map[string]int64 // per conversation, the lowest seq not queued
	upto   map[string]int64 // and the highest
	read   map[string]int64 // per conversation, the highest read marker not queued
	wake   chan struct{}    // the catch-up goroutine's signal (capacity 1)
	// room is the writer's signal that it took a frame from the send
	// buffer (capacity 1), for a catch-up waiting for room; wait is that
	// catch-up's timer (SlowReader per frame).
	room chan struct{}
	wait *time.Timer
}

// newBacklog returns an empty backlog; its maps are made on first use (most
// sessions never need them).
func newBacklog() backlog {
	return backlog{wake: make(chan struct{}, 1), room: make(chan struct{}, 1)}
}

// add records a push not queued.
func (b *backlog) add(p delivery.Push) {
	if p.Read {
		if b.read == nil {
			b.read = map[string]int64{}
		}
		b.read[p.Conv] = max(b.read[p.Conv], p.Seq)
		return
	}
	if b.from == nil {
		b.from, b.upto = map[string]int64{}, map[string]int64{}
	}
	if f, ok := b.from[p.Conv]; !ok || p.Seq < f {
		b.from[p.Conv] = p.Seq
	}
	b.upto[p.Conv] = max(b.upto[p.Conv], p.Seq)
}

// empty reports whether nothing is left to read back.
func (b *backlog) empty() bool { return len(b.from) == 0 && len(b.read) == 0 }

// push queues pushes without blocking, each as its own message, or, for a
// batching device, as the messages of joined (batchFrames pushes each).
// From the first message the send buffer has no room for, the pushes go to
// the backlog, and so does everything pushed until the catch-up goroutine
// has read the backlog back.
func (s *session) push(pushes []delivery.Push, joined [][]byte) {
	b := &s.backlog
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.active {
		n, per := len(pushes), 1
		if joined != nil {
			n, per = len(joined), batchFrames
		}
		i := 0
		for ; i < n; i++ {
			frame := pushes[i].Frame
			if joined != nil {
				frame = joined[i]
			}
			if !s.offer(frame) {
				break
			}
		}
		if i == n {
			return
		}
		pushes = pushes[i*per:]
		b.active = true
		s.g.backlogged.Add(1)
		select {
		case b.wake <- struct{}{}:
		default:
		}
	}
	for _, p := range pushes {
		b.add(p)
	}
}

// offer queues a pushed frame if the send buffer has room for pushes.
func (s *session) offer(frame []byte) bool {
	if len(s.out) >= s.pushRoom {
		return false
	}
	select {
	case s.out <- frame:
		return true
	default:
		return false
	}
}

// took is the writer's signal that it took a frame from the send buffer:
// it wakes a catch-up waiting for room (queueBack).
func (s *session) took() {
	select {
	case s.backlog.room <- struct{}{}:
	default:
	}
}

// catchUp reads the backlog back whenever push starts one, until ctx ends.
func (s *session) catchUp(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.backlog.wake:
		}
		if !s.drainBacklog(ctx) {
			return
		}
	}
}

// drainBacklog queues the backlog's events, read from the read model, and
// its markers, until the backlog is empty (true) or the session ends
// (false).
func (s *session) drainBacklog(ctx context.Context) bool {
	b := &s.backlog
	for {
		b.mu.Lock()
		if b.empty() {
			b.active = false
			b.mu.Unlock()
			return true
		}
		cursors := make(map[string]int64, len(b.from))
		upto := make(map[string]int64, len(b.from))
		for c, f := range b.from {
			cursors[c], upto[c] = f-1, b.upto[c]
		}
		markers := b.read
		b.read = nil
		b.mu.Unlock()

		if len(cursors) > 0 && !s.readBack(ctx, cursors, upto) {
			return false
		}
		for c, seq := range markers {
			if !s.queueBack(ctx, protocol.EncodeReadMarker(&protocol.ReadMarker{Op: protocol.OpRead, ConversationID: c, Seq: seq})) {
				return false
			}
		}
	}
}

// readBack queues one read of the events after cursors (up to upto, or
// more) and moves the backlog's ranges past what it queued. It returns
// false when the session ends or is closed.
func (s *session) readBack(ctx context.Context, cursors, upto map[string]int64) bool {
	var res *delivery.SyncResult
	var err error
	if s.g.cfg.Reads == nil {
		err = errNoReads
	} else {
		res, err = s.g.cfg.Reads.Since(ctx, s.user, cursors, s.g.cfg.SyncMax)
	}
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		return s.resync("reading back a full send buffer's events failed", "err", err)
	}
	for _, e := range res.Events {
		e.Op = protocol.OpEvent
		if !s.queueBack(ctx, protocol.EncodeEvent(e)) {
			return false
		}
	}
	for c := range cursors {
		if done, member := res.Cursors[c]; member && done < upto[c] && !res.More {
			// Not expected: the feed pushed these from the read model.
			// Rather than asking again and again:
			return s.resync("the read model does not cover a full send buffer's events",
				"conversation", c, "covered", done, "pushed", upto[c])
		}
	}
	b := &s.backlog
	b.mu.Lock()
	defer b.mu.Unlock()
	for c := range cursors {
		done, member := res.Cursors[c]
		switch {
		case !member: // never a member: nothing to read back
			delete(b.from, c)
			delete(b.upto, c)
		case done >= b.upto[c]:
			delete(b.from, c)
			delete(b.upto, c)
		default:
			b.from[c] = done + 1
		}
	}
	return true
}

// resync gives up on catching the device up from here: it is closed with
// 1013 and reconnects and syncs, as after any lost connection. It returns
// false for drainBacklog to return.
func (s *session) resync(why string, args ...any) bool {
	s.g.cfg.Log.Warn(why+"; closing the connection", append([]any{"user", s.user}, args...)...)
	s.closeOnce(websocket.StatusTryAgainLater, "delivery fell behind; reconnect and sync")
	return false
}

// queueBack queues a frame read back in the send buffer, behind
// everything queued before it, within the room pushes may fill. It waits
// up to SlowReader for room; a device that takes longer is closed with
// 1008.
func (s *session) queueBack(ctx context.Context, frame []byte) bool {
	if s.offer(frame) {
		return true
	}
	b := &s.backlog
	if b.wait == nil {
		b.wait = time.NewTimer(s.g.cfg.SlowReader)
	} else {
		b.wait.Reset(s.g.cfg.SlowReader)
	}
	defer b.wait.Stop()
	for {
		// Each frame the writer takes sends a signal after taking it, so a
		// signal received here is followed by a fresh look at the room.
		select {
		case <-b.room:
			if s.offer(frame) {
				return true
			}
		case <-ctx.Done():
			return false
		case <-b.wait.C:
			s.closeOnce(websocket.StatusPolicyViolation, "send buffer overflow; reconnect and sync")
			return false
		}
	}
}
