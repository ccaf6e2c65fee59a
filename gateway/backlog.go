package gateway

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/delivery"
	"github.com/chatpipe/chatpipe/protocol"
)

// The feed pushes in bursts. After the projection or persist was down for a
// while, one read of the outbox carries everything that piled up, often more
// frames for one user than a send buffer holds, to devices that read as fast
// as they can. Closing them all would answer an outage with a reconnect
// storm. Instead a session whose buffer has no room for a push stops taking
// pushes and keeps, per conversation, the range of seqs it did not take (and
// whether it missed a read marker there): memory bounded by the user's
// conversations, not by the burst. Its catch-up goroutine reads those ranges
// back from the read model (Since, which also applies the membership
// periods) and queues them as room appears, in seq order per conversation;
// once nothing is left, the session takes pushes again. Devices drop
// duplicates by (conversation_id, seq), so a range read back may overlap
// what was queued. A device that does not read at all is still closed with
// 1008: a frame of its catch-up that waits SlowReader for room ends it.

var errNoReads = errors.New("this gateway has no read model")

// backlog is what a session's send buffer had no room for.
type backlog struct {
	mu     sync.Mutex
	active bool             // pushes go here, not to the send buffer
	from   map[string]int64 // per conversation, the lowest seq not queued
	upto   map[string]int64 // and the highest
	read   map[string]bool  // a read marker not queued
	wake   chan struct{}    // the catch-up goroutine's signal (capacity 1)
}

// newBacklog returns an empty backlog; its maps are made on first use (most
// sessions never need them).
func newBacklog() backlog { return backlog{wake: make(chan struct{}, 1)} }

// add records a push not queued. A read marker at seq n is read back with
// the user's current marker, and the events after n with it (usually none
// the device lacks; duplicates are dropped).
func (b *backlog) add(p delivery.Push) {
	if b.from == nil {
		b.from, b.upto = map[string]int64{}, map[string]int64{}
	}
	if b.read == nil {
		b.read = map[string]bool{}
	}
	from, upto := p.Seq, p.Seq
	if p.Read {
		from, b.read[p.Conv] = p.Seq+1, true
	}
	if f, ok := b.from[p.Conv]; !ok || from < f {
		b.from[p.Conv] = from
	}
	b.upto[p.Conv] = max(b.upto[p.Conv], upto)
}

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

// drainBacklog queues the backlog's events and markers, read from the read
// model, until the backlog is empty (true) or the session ends (false).
func (s *session) drainBacklog(ctx context.Context) bool {
	b := &s.backlog
	for {
		b.mu.Lock()
		if len(b.from) == 0 {
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
			if !s.queueWithin(ctx, protocol.EncodeEvent(e)) {
				return false
			}
		}
		for c := range markers {
			seq, ok := res.Read[c]
			if !ok {
				continue
			}
			if !s.queueWithin(ctx, protocol.EncodeReadMarker(&protocol.ReadMarker{Op: protocol.OpRead, ConversationID: c, Seq: seq})) {
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
		b.mu.Lock()
		for c := range cursors {
			done, member := res.Cursors[c]
			switch {
			case !member: // never a member: nothing to read back
				delete(b.from, c)
				delete(b.upto, c)
				delete(b.read, c)
			case done >= b.upto[c] && !b.read[c]:
				delete(b.from, c)
				delete(b.upto, c)
			default:
				b.from[c] = done + 1
			}
		}
		b.mu.Unlock()
	}
}

// resync gives up on catching the device up from here: it is closed with
// 1013 and reconnects and syncs, as after any lost connection. It returns
// false for drainBacklog to return.
func (s *session) resync(why string, args ...any) bool {
	s.g.cfg.Log.Warn(why+"; closing the connection", append([]any{"user", s.user}, args...)...)
	s.closeOnce(websocket.StatusTryAgainLater, "delivery fell behind; reconnect and sync")
	return false
}

// queueWithin hands a frame read back to the writer, waiting up to
// SlowReader; a device that takes longer is closed with 1008.
func (s *session) queueWithin(ctx context.Context, frame []byte) bool {
	select {
	case s.backfill <- frame:
		return true
	default:
	}
	t := time.NewTimer(s.g.cfg.SlowReader)
	defer t.Stop()
	select {
	case s.backfill <- frame:
		return true
	case <-ctx.Done():
		return false
	case <-t.C:
		s.closeOnce(websocket.StatusPolicyViolation, "send buffer overflow; reconnect and sync")
		return false
	}
}
