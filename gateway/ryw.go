package gateway

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/chatpipe/chatpipe/protocol"
)

// Read-your-writes: after one of a session's writes is accepted at seq N in
// a conversation, that session's history, sync and conversations include
// it. The write is committed to the log when it is accepted, but the read
// model (persist) applies it a little later; a read
// that comes first waits, at most Config.ReadYourWrites, until the read
// model covers N, and is answered unavailable with retry_after_ms if it
// does not in time. Only the session's own writes are waited for: other
// sessions' reads are as fresh as the read model.

// maxPendingWrites bounds the writes one session remembers as not yet
// known to be in the read model. Past it the session asks the read model
// which are, and forgets the oldest if still too many: a write forgotten
// that way is still in the log and arrives as an event; only the wait
// before a read is lost for it.
const maxPendingWrites = 1024

// pendingWrites is a session's accepted writes the read model may not
// cover yet: conversation → the highest seq accepted there.
type pendingWrites struct {
	mu sync.Mutex
	m  map[string]pendingWrite
}

type pendingWrite struct {
	seq int64
	at  time.Time
}

// note remembers an accepted write.
func (p *pendingWrites) note(conv string, seq int64, now time.Time) (full bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]pendingWrite{}
	}
	if w, ok := p.m[conv]; ok && w.seq >= seq {
		return false
	}
	p.m[conv] = pendingWrite{seq: seq, at: now}
	return len(p.m) > maxPendingWrites
}

// wanted returns the pending writes of conv ("" for every conversation).
func (p *pendingWrites) wanted(conv string) map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int64{}
	if conv != "" {
		if w, ok := p.m[conv]; ok {
			out[conv] = w.seq
		}
		return out
	}
	for c, w := range p.m {
		out[c] = w.seq
	}
	return out
}

// covered forgets the writes the read model covers (a later write to the
// same conversation stays).
func (p *pendingWrites) covered(have map[string]int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c, seq := range have {
		if w, ok := p.m[c]; ok && w.seq <= seq {
			delete(p.m, c)
		}
	}
}

// trim forgets the oldest writes beyond maxPendingWrites.
func (p *pendingWrites) trim() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.m) > maxPendingWrites {
		var oldest string
		var at time.Time
		for c, w := range p.m {
			if oldest == "" || w.at.Before(at) {
				oldest, at = c, w.at
			}
		}
		delete(p.m, oldest)
	}
}

// wrote records an accepted write of this session.
func (s *session) wrote(ctx context.Context, rep *protocol.Reply) {
	if s.g.cfg.Reads == nil || s.g.cfg.ReadYourWrites < 0 || rep.Op != protocol.OpAccepted || rep.ConversationID == "" || rep.Seq <= 0 {
		return
	}
	if !s.pending.note(rep.ConversationID, rep.Seq, time.Now()) {
		return
	}
	// Too many remembered: most are in the read model by now.
	want := s.pending.wanted("")
	convs := make([]string, 0, len(want))
	for c := range want {
		convs = append(convs, c)
	}
	if have, err := s.g.cfg.Reads.Covered(ctx, convs); err == nil {
		s.pending.covered(have)
	}
	s.pending.trim()
}

// awaitWrites waits until the read model covers this session's accepted
// writes in conv ("" for all of them). It returns nil, or the reply to give
// instead of the read: unavailable, to retry shortly.
func (s *session) awaitWrites(ctx context.Context, reqID, conv string) *protocol.Reply {
	want := s.pending.wanted(conv)
	if len(want) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.g.cfg.ReadYourWrites)
	defer cancel()
	delay := time.Millisecond
	for {
		convs := make([]string, 0, len(want))
		for c := range want {
			convs = append(convs, c)
		}
		have, err := s.g.cfg.Reads.Covered(ctx, convs)
		if err == nil {
			s.pending.covered(have)
			for c, seq := range have {
				if want[c] <= seq {
					delete(want, c)
				}
			}
			if len(want) == 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			s.g.rywTimeouts.Add(1)
			c, seq := anyWrite(want)
			return unavailable(reqID, fmt.Sprintf("the read model does not include your write at seq %d in %s yet; retry", seq, c), 200)
		case <-time.After(delay):
		}
		delay = min(2*delay, 50*time.Millisecond)
	}
}

// anyWrite is the first conversation of want in sorted order, and its seq.
func anyWrite(want map[string]int64) (string, int64) {
	convs := make([]string, 0, len(want))
	for c := range want {
		convs = append(convs, c)
	}
	slices.Sort(convs)
	return convs[0], want[convs[0]]
}
