package logsink

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/chatpipe/chatpipe/internal/pglisten"
)

// Announced follows the offsets a consumer stored (persist's, which it
// announces with each batch: AnnouncePayload) from its announcements, so
// that whoever bounds its memory by them (a writer) need not read
// consumer_offsets each time.
//
// The offsets it knows only grow, and each was committed: they may lag
// what is stored, never lead it. While its LISTEN is in effect every
// commit is announced, so once read after that LISTEN (Stale reports when
// a read is due; Learn takes it) they lag only by the announcements in
// flight.
type Announced struct {
	topic string
	mu    sync.Mutex
	known map[int32]int64
	// listening: a LISTEN is in effect. stale: an announcement came that
	// named no offsets (the one after each LISTEN among them): what is
	// stored must be read once.
	listening, stale atomic.Bool
	woken            chan struct{} // an announcement came (cap 1)
}

// NewAnnounced returns a follower of topic's announced offsets; Listen
// starts it.
func NewAnnounced(topic string) *Announced {
	return &Announced{topic: topic, known: map[int32]int64{}, woken: make(chan struct{}, 1)}
}

// Listen LISTENs on channel until ctx ends (pglisten.Run), learning what
// each announcement names; lost is logged when the connection is lost.
func (a *Announced) Listen(ctx context.Context, db *pgxpool.Pool, channel string, log *slog.Logger, lost string) {
	pglisten.Run(ctx, db, channel, a.Announce, a.listening.Store, log, lost)
}

// Announce takes one announcement's payload: it learns the offsets named,
// or, when none are, notes that they must be read. It wakes Woken.
func (a *Announced) Announce(payload string) {
	if got := ParseAnnounce(a.topic, payload); got != nil {
		a.Learn(got)
	} else {
		a.stale.Store(true)
	}
	select {
	case a.woken <- struct{}{}:
	default:
	}
}

// Woken receives after an announcement (one pending at most).
func (a *Announced) Woken() <-chan struct{} { return a.woken }

// Listening reports whether a LISTEN is in effect.
func (a *Announced) Listening() bool { return a.listening.Load() }

// Stale reports whether the known offsets may lag by more than the
// announcements in flight, so that stored offsets should be read (and
// given to Learn): no LISTEN is in effect, or one took effect or an
// announcement without offsets came since the last call. A true answer
// is given once per such event.
func (a *Announced) Stale() bool {
	return !a.listening.Load() || a.stale.Swap(false)
}

// MarkStale makes the next Stale true (a read it asked for failed).
func (a *Announced) MarkStale() { a.stale.Store(true) }

// Learn raises the known offsets to have.
func (a *Announced) Learn(have map[int32]int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for part, o := range have {
		a.known[part] = max(a.known[part], o)
	}
}

// Offset is the known next offset of partition part (ok: one is known).
func (a *Announced) Offset(part int32) (off int64, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	off, ok = a.known[part]
	return off, ok
}
