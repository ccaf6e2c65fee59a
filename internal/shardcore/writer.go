package shardcore

// This file is longer than most: it holds the writer's phases and every
// transition between them (takeover, replay, accepting, committing,
// backoff), which read as one machine. What a batch decides, what the
// writer remembers and its verdicts are in writer_batch.go,
// writer_memory.go and writer_verdicts.go.

import (
	"fmt"
	"maps"
	"time"

	"golang.org/x/time/rate"

	"github.com/chatpipe/chatpipe/internal/groupcommit"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// Writer is the writer of one vshard for one ownership epoch, as a pure
// state machine: inputs in (commands, the results of its round trips, the
// time), effects out (the next round trip to make, the answers to send).
// It has no goroutines, clock, I/O or randomness; time and ids come in with
// the inputs. shardworker drives it against Kafka, etcd and Postgres; sim
// drives the same code against its in-memory log, owner store and sink.
//
// A session is: open the producer (initialising the vshard's
// transactional.id fences every older writer and aborts its open
// transaction) → commit the takeover marker → read persist's offset → read
// the log tail from there up to the marker and load its conversations →
// accept. While accepting it collects a batch (lingering as the group
// commit says), loads the state the batch lacks, decides every command in
// arrival order, commits the batch's events in one transaction, and only
// then answers. Any failure of the marker, a replay step or a commit ends
// the session: the state is dropped, every command of the batch in hand is
// answered unavailable, and after a backoff the writer re-reads the owner
// row; it takes over again only if the row still names it.
//
// The driver loop is: feed an input (Submit, Tick, Stop or the result of
// the effect it performed), then call Ready and act on it: send its
// answers, perform its Effect (one at a time; its result is the next
// input), and call Tick when nothing else happened by its Wake time.
type Writer struct {
	cfg   WriterConfig
	phase Phase
	// cancelled: Stop was called; the writer ends as soon as no round trip
	// it must finish is in flight.
	cancelled bool

	// out is what the next Ready returns.
	answers []Answer
	effect  *Effect
	wake    time.Time
	notice  Notice

	sessionStart time.Time
	backoff      time.Duration
	opened       bool // the session initialised its producer
	markerOff    int64
	tail         []*logrecord.Event
	replayed     map[string]*Conv // ReplayBeforeMarker: the state loaded before the marker

	convs map[string]*Conv
	queue []*Call
	// The batch in hand: its calls and their answers, the events it
	// commits (the first len(seqs) of them are conversation events; a
	// marker may follow), and the timing the group commit observes.
	batch      []*Call
	replies    []Answer
	events     []*logrecord.Event
	collecting bool
	collectAt  time.Time
	batchStart time.Time
	decideAt   time.Time
	prevStart  time.Time
	gc         groupcommit.Pacer
	share      float64

	unstored []unstoredEvent
	stored   map[string]*storedSeq
	lastTrim time.Time
	rates    map[string]*rate.Limiter
	// verdicts are the answers of keyed commands that wrote nothing,
	// remembered for RefusalMemory (at most MaxVerdicts), for the whole
	// epoch: a session that fails and opens again under the same owner
	// row keeps them, for nobody else wrote in between. batchVerdicts
	// are the ones decided in the batch in hand, in batchVerdictOrder,
	// remembered only once its answers are given.
	verdicts          verdictTable
	batchVerdicts     map[DedupeKey]Verdict
	batchVerdictOrder []DedupeKey

	// moves are the conversations the owner table routes elsewhere that
	// may be here: each is moved (a moved event committed) once this
	// writer's state says it is here. A look that finds it elsewhere
	// settles nothing — a move decided on an older route may still bring
	// it here — so it is looked at again, less and less often (moveWait),
	// while the override stands. batchMoves are the ones the batch in
	// hand looks at.
	//
	// A conversation released to this vshard (its hashed one) is looked
	// after the same way, in moves with this vshard as its target: each
	// look that finds it here reports it (Notice.Released) once its batch
	// is over; batchReleased are the ones the batch in hand found here.
	moves         map[string]int
	moveAt        time.Time
	moveWait      time.Duration
	batchMoves    []string
	batchReleased []string
	// unpin: a batch met a conversation that is not here and that events
	// persist may not have stored keep cached; persist's offset is read
	// at the next housekeeping pass even without a commit.
	unpin bool
	// inbound: conversations routed here (only AcceptBeforeMoved uses it).
	inbound map[string]bool
}

// WriterConfig is what a Writer is built with. Durations are of the
// caller's clock (the times passed with the inputs).
type WriterConfig struct {
	VShard int
	// VShards is the number of hashed vshards; Dedicated: VShard is one of
	// the dedicated vshards beyond them, which writes only the
	// conversations moved to it.
	VShards   int
	Dedicated bool
	Epoch     int64  // the ownership epoch of the owner row that started it
	Worker    string // written into its takeover markers
	Limits    Limits

	MaxBatch int           // commands per batch (≥ 1)
	Linger   time.Duration // fixed linger before each batch; 0: the adaptive group commit's
	// LingerMax is the adaptive group commit's latency budget (0: never
	// linger).
	LingerMax time.Duration

	ConvRate  float64 // new messages/s per conversation (0: no limit)
	ConvBurst int

	// RefusalMemory is how long the answer of a keyed command that wrote
	// nothing (a rejection, or a join of a current member) answers the
	// key's other attempts by the same sender for the same op.
	RefusalMemory time.Duration
	// MaxVerdicts bounds how many such answers are remembered (default
	// DefaultMaxVerdicts). When it is reached the oldest is forgotten
	// before its RefusalMemory is up (Notice.VerdictsDropped), and a late
	// attempt of its key is decided again against the state it finds, as
	// one past the memory is. They are kept apart from the cached
	// conversations: evicting a conversation forgets none of them.
	MaxVerdicts  int
	DedupeMemory time.Duration // dedupe results older than this may be dropped once stored
	DedupeKeep   int           // … and so may any beyond this many per conversation
	MaxConvs     int           // conversations cached before eviction (plus persist's lag)
	TrimInterval time.Duration // how often a committing writer trims its memory

	Backoff    time.Duration // first wait before re-checking ownership after a failure
	BackoffMax time.Duration
	// OwnerRetry is the wait before re-reading an owner row that could
	// not be read.
	OwnerRetry time.Duration
	// MoveRetry is how soon a conversation routed elsewhere is looked at
	// again after a look that found it not here (default 1 s); the wait
	// doubles with each such look, up to MoveRetryMax (default 30 s), and
	// starts again at MoveRetry when the route changes.
	MoveRetry    time.Duration
	MoveRetryMax time.Duration

	// NewID returns a fresh message id for an event decided at now.
	NewID func(now time.Time) (string, error)

	Faults WriterFaults
}

// WriterFaults are deliberate mistakes a Writer can be built with, so the
// tests show that the invariant checks catch them. The zero value is the
// correct writer; nothing outside tests sets them.
type WriterFaults struct {
	// AcceptBeforeMarker reverses the takeover order: replay the log as it
	// is now (To < 0), load every conversation of the vshard, accept, and
	// initialise the producer and write the marker only with the first
	// commit. The previous writer can commit in between and its seqs are
	// handed out again.
	AcceptBeforeMarker bool
	// AcceptedBeforeCommit answers a batch when its commit is sent instead
	// of when it succeeded.
	AcceptedBeforeCommit bool
	// MembershipOutsideMailbox checks membership against the members as
	// they were when the command arrived, not in arrival order with the
	// commands before it.
	MembershipOutsideMailbox bool
	// ReplayBeforeMarker replays the log as it is now (To < 0) first, and
	// only then opens the producer and commits the marker, accepting
	// without reading what was committed in between.
	ReplayBeforeMarker bool
	// NoEmptyBatchMarker answers a batch that writes nothing from the
	// writer's state without first committing a marker, so a writer fenced
	// without knowing it answers from a stale state.
	NoEmptyBatchMarker bool
	// AcceptBeforeMoved makes the writer a conversation is routed to take
	// it as its own at once, from its durable state, without waiting for
	// the moved record of the vshard it leaves: both may accept for it.
	AcceptBeforeMoved bool
	// ForgetNoopJoin answers a keyed join of a current member without
	// keeping the answer as the key's verdict (Decision.Keep is dropped
	// for it): another attempt of the key after the user left or was
	// kicked adds them again.
	ForgetNoopJoin bool
	// VerdictsPinConvs makes evict keep every conversation a remembered
	// verdict names: refused commands to many conversations grow the
	// cache past MaxConvs.
	VerdictsPinConvs bool
	// KnownForgetsTrimmed trims dedupe results without adding their keys
	// to the conversation's filter of known keys (Conv.Known): a retry of
	// a trimmed key is then taken for a new one and written again.
	KnownForgetsTrimmed bool
	// DropCarriedVerdicts commits moved records without the verdicts the
	// writer remembers for the conversation, so the writer it moves to
	// decides a refused key again.
	DropCarriedVerdicts bool
}

// Phase is where a Writer is.
type Phase int

// The phases of a Writer, in the order of a session.
const (
	PhaseOpen         Phase = iota // opening the producer (EffectOpenProducer)
	PhaseMarker                    // committing the takeover marker
	PhaseReplayOffset              // reading persist's offset of the partition
	PhaseReplayTail                // reading the log tail up to the marker
	PhaseReplayLoad                // loading the tail's conversations
	PhaseAccepting                 // idle, or collecting a batch
	PhaseLoading                   // loading the state the batch lacks
	PhaseCommitting                // committing the batch
	PhaseHousekeep                 // reading persist's offset to trim memory
	PhaseBackoff                   // waiting before re-reading the owner row
	PhaseRecheck                   // reading the owner row
	PhaseDone                      // ended: every command has been answered
)

var phaseNames = [...]string{"open", "marker", "replay-offset", "replay-tail", "replay-load", "accepting", "loading", "committing", "housekeep", "backoff", "recheck", "done"}

// String names the phase.
func (p Phase) String() string { return phaseNames[p] }

// Call is one command in a Writer's mailbox.
type Call struct {
	ReqID string
	Cmd   Command
	// Deadline (zero: none) is when the gateway stops waiting: a command
	// not decided by then is not decided at all, only answered
	// unavailable (nothing written).
	Deadline time.Time
	// Tag is the driver's own handle on the call.
	Tag any

	// members is the conversation's members when the call arrived (only
	// the MembershipOutsideMailbox fault uses it).
	members map[string]int64
}

func (c *Call) expired(now time.Time) bool { return !c.Deadline.IsZero() && now.After(c.Deadline) }

// Answer is the reply to one call.
type Answer struct {
	Call  *Call
	Reply *protocol.Reply
	// Retry: nothing was written and the command may go to whoever owns
	// the vshard now.
	Retry bool
	// Wrote: the reply accepts an event this writer committed for it.
	Wrote bool
}

// EffectKind is the round trip an Effect asks for.
type EffectKind int

// The effects of a Writer.
const (
	// EffectOpenProducer opens the vshard's transactional producer;
	// initialising it fences every older producer of the id. Result:
	// ProducerOpened.
	EffectOpenProducer EffectKind = iota + 1
	// EffectCommit produces Events in one transaction of the vshard's
	// partition and commits it (Open: initialise the producer first).
	// Any produce error aborts the whole transaction. Result: Committed.
	EffectCommit
	// EffectPersistOffset reads persist's committed offset of the
	// partition. Result: PersistOffset.
	EffectPersistOffset
	// EffectReadTail reads the partition read_committed from From (from
	// the start when FromStart) up to, not including, To (To < 0: up to
	// its current end), and returns the events of the vshard that are not
	// takeover markers. Result: TailRead.
	EffectReadTail
	// EffectLoadState loads the conversations in Convs from durable state
	// (every conversation of the vshard as well when AllOfVShard) and
	// looks up the keys in Keys. Result: StateLoaded.
	EffectLoadState
	// EffectReadOwner reads the vshard's owner row (a linearizable read)
	// and reports whether it still names this worker, its registration
	// and the writer's epoch. Result: OwnerRead.
	EffectReadOwner
)

var effectNames = [...]string{"", "open-producer", "commit", "persist-offset", "read-tail", "load-state", "read-owner"}

// String names the effect kind.
func (k EffectKind) String() string { return effectNames[k] }

// Effect is one round trip the driver makes for the Writer.
type Effect struct {
	Kind EffectKind
	// Abandon: when the writer is stopped the driver may give this round
	// trip up (cancel its context) and need not report its result. The
	// others run to their end and are reported.
	Abandon bool

	Events []*logrecord.Event // EffectCommit
	Open   bool               // EffectCommit: initialise the producer first
	Marker bool               // EffectCommit: Events is the takeover marker alone
	// Confirm (EffectCommit, a session's first marker): after the events
	// are produced — the transactional.id is initialised by then — read
	// the owner row, and commit only if it still names this writer; else
	// abort and report an error. A writer whose re-check passed just
	// before its row moved could otherwise initialise the id after the new
	// owner did and commit a marker of the older epoch after the newer
	// one's records.
	Confirm bool

	From      int64 // EffectReadTail
	FromStart bool
	To        int64

	Convs       []string    // EffectLoadState
	Keys        []DedupeKey // EffectLoadState
	AllOfVShard bool        // EffectLoadState
}

// DedupeKey names one client_message_id of one conversation.
type DedupeKey struct{ Conv, CMID string }

// Notice is what the last inputs changed that a driver counts or logs.
type Notice struct {
	// TookOver: the session is accepting; Replayed events of
	// Conversations were replayed after the marker at MarkerOffset, Took
	// after the session began.
	TookOver      bool
	Replayed      int
	Conversations int
	MarkerOffset  int64
	Took          time.Duration
	// Failed is why the session ended (it will re-check ownership).
	Failed error
	// StateErr is why a batch's state could not be loaded (its commands
	// were answered unavailable; the session goes on).
	StateErr error
	// Trimmed, Evicted and DedupeHeld (≥ 0 when it was counted) report a
	// housekeeping pass.
	Trimmed    int
	Evicted    int
	DedupeHeld int
	// VerdictsDropped is how many remembered answers of keyed commands
	// were forgotten before their RefusalMemory was up, MaxVerdicts being
	// held.
	VerdictsDropped int
	// Moved lists the conversations whose moved event was committed.
	Moved []string
	// Released lists the conversations whose override names this vshard,
	// their hashed one, and whose state here says they are here: their
	// override may be deleted (lease.ReleaseOverride). Reported after each
	// look that finds them here, until Unroute.
	Released []string
	// Arrived holds, for each conversation that was not here and is now
	// (loaded again after its moved record was stored), how long after
	// that record's created_at it arrived.
	Arrived []time.Duration
}

// Ready is what a Writer asks of its driver after the last inputs.
type Ready struct {
	Answers []Answer
	// Effect is the round trip to make now (nil: none); its result is the
	// next input. At most one is outstanding at a time.
	Effect *Effect
	// Wake (zero: none) is when to call Tick if no input came before.
	Wake   time.Time
	Notice Notice
	// Done: the writer has ended and answered everything it was given.
	Done bool
}

// NewWriter returns a writer about to open its first session at now.
func NewWriter(cfg WriterConfig, now time.Time) *Writer {
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 1
	}
	if cfg.MoveRetry <= 0 {
		cfg.MoveRetry = time.Second
	}
	if cfg.MaxVerdicts <= 0 {
		cfg.MaxVerdicts = DefaultMaxVerdicts
	}
	cfg.MoveRetryMax = max(cfg.MoveRetryMax, cfg.MoveRetry)
	if cfg.MoveRetryMax == cfg.MoveRetry && cfg.MoveRetry == time.Second {
		cfg.MoveRetryMax = 30 * time.Second
	}
	m := &Writer{cfg: cfg, backoff: cfg.Backoff, gc: groupcommit.Pacer{Max: max(cfg.LingerMax, 0)}, notice: Notice{DedupeHeld: -1}}
	m.open(now)
	return m
}

// Phase returns where the writer is.
func (m *Writer) Phase() Phase { return m.phase }

// Accepting reports whether the writer has taken over and takes commands.
func (m *Writer) Accepting() bool {
	switch m.phase {
	case PhaseAccepting, PhaseLoading, PhaseCommitting, PhaseHousekeep:
		return !m.cancelled
	}
	return false
}

// Cached is the number of conversations whose state the writer holds.
func (m *Writer) Cached() int { return len(m.convs) }

// Queued is the number of commands waiting for a batch.
func (m *Writer) Queued() int { return len(m.queue) }

// CanStart reports whether a Tick at now would start a batch.
func (m *Writer) CanStart(now time.Time) bool {
	if m.phase != PhaseAccepting || m.cancelled {
		return false
	}
	if len(m.queue) == 0 {
		return m.movesDue(now)
	}
	return !m.collecting || len(m.queue) >= m.cfg.MaxBatch || !now.Before(m.collectAt)
}

// SetShare sets the vshard's share of its worker's transaction budget
// (transactions/s), which the adaptive group commit lingers for.
func (m *Writer) SetShare(txnPerSec float64) { m.share = txnPerSec }

// Ready returns, and forgets, what the writer asks of its driver.
func (m *Writer) Ready() Ready {
	rd := Ready{Answers: m.answers, Effect: m.effect, Wake: m.wake, Notice: m.notice, Done: m.phase == PhaseDone}
	m.answers, m.effect, m.notice = nil, nil, Notice{DedupeHeld: -1}
	return rd
}

// Submit puts c in the mailbox. A writer that has ended answers it
// unavailable at once.
func (m *Writer) Submit(now time.Time, c *Call) {
	if m.phase == PhaseDone || m.cancelled {
		m.answer(c, Unavailable(c.ReqID, "vshard %d is moving to another worker", m.cfg.VShard), true, false)
		return
	}
	if m.cfg.Faults.MembershipOutsideMailbox {
		if conv := m.convs[c.Cmd.ConversationID]; conv != nil {
			c.members = maps.Clone(conv.Members)
		}
	}
	m.queue = append(m.queue, c)
}

// Tick tells the writer the time is now and that the driver has handed
// over every command it had: a due batch starts, a backoff that ran out
// re-reads the owner row.
func (m *Writer) Tick(now time.Time) {
	switch m.phase {
	case PhaseAccepting:
		if m.cancelled {
			return
		}
		if len(m.queue) == 0 {
			if m.movesDue(now) {
				m.startBatch(now)
			} else if !m.collecting {
				// Nothing to do now (a move it was woken for may have
				// been called off): wake for the next move, or not at all.
				m.idle(now)
			}
			return
		}
		if !m.collecting {
			m.collecting, m.batchStart = true, now
			wait := m.cfg.Linger
			if wait <= 0 {
				wait = m.gc.Linger(m.share)
			}
			m.collectAt = now.Add(wait)
		}
		if len(m.queue) < m.cfg.MaxBatch && now.Before(m.collectAt) {
			m.wake = m.collectAt
			return
		}
		m.startBatch(now)
	case PhaseBackoff:
		if !now.Before(m.wake) {
			m.readOwner()
		}
	}
}

// Route tells the writer that the owner table routes conversation cid to
// vshard to (its hashed vshard when the override was removed). A
// conversation routed elsewhere is moved by the writer that has it: this
// one commits its moved record if its state says it is here. Call it for
// every override of a conversation that may be here — at its hashed
// vshard and at every dedicated one — when the writer starts and whenever
// the override changes.
//
// An override that names this writer's vshard when that is the
// conversation's hashed vshard is a release in progress: once this
// writer's state holds the conversation it reports it in
// Notice.Released, and the driver deletes the override
// (lease.ReleaseOverride). It looks, like at a move, until Unroute.
func (m *Writer) Route(now time.Time, cid string, to int) {
	if to == m.cfg.VShard && !m.isHome(cid) {
		delete(m.moves, cid)
		if m.cfg.Faults.AcceptBeforeMoved {
			if m.inbound == nil {
				m.inbound = map[string]bool{}
			}
			m.inbound[cid] = true
		}
		return
	}
	delete(m.inbound, cid)
	if m.moves == nil {
		m.moves = map[string]int{}
	}
	m.moves[cid] = to
	m.moveAt, m.moveWait = now, 0
	if m.phase == PhaseAccepting && !m.collecting && m.wake.IsZero() {
		m.wake = now
	}
}

// isHome reports whether this writer's vshard is conversation cid's
// hashed vshard (with VShards 0: whether it is not dedicated).
func (m *Writer) isHome(cid string) bool {
	return !m.cfg.Dedicated && (m.cfg.VShards == 0 || logrecord.VShard(cid, m.cfg.VShards) == m.cfg.VShard)
}

// Unroute tells the writer that no override names conversation cid any
// more.
func (m *Writer) Unroute(cid string) {
	delete(m.moves, cid)
	delete(m.inbound, cid)
}

// Moving is the number of conversations routed elsewhere, or released
// to this vshard, that the writer still looks after.
func (m *Writer) Moving() int { return len(m.moves) }

func (m *Writer) movesDue(now time.Time) bool {
	return len(m.moves) > 0 && !now.Before(m.moveAt)
}

// Stop ends the writer: the owner row moved or the lease was lost. A
// round trip that must finish (the marker, a batch's load and commit,
// housekeeping) finishes first, and its batch is answered as usual; every
// queued command is answered unavailable.
func (m *Writer) Stop(now time.Time) {
	if m.phase == PhaseDone {
		return
	}
	m.cancelled = true
	switch m.phase {
	case PhaseMarker, PhaseLoading, PhaseCommitting, PhaseHousekeep:
		return // finish once its result is in
	}
	m.finish()
}

// ProducerOpened is the result of EffectOpenProducer.
func (m *Writer) ProducerOpened(now time.Time, err error) {
	if !m.expect(PhaseOpen) {
		return
	}
	if err != nil {
		m.fail(now, fmt.Errorf("shardcore: open producer: %w", err))
		return
	}
	if m.cancelled {
		m.finish()
		return
	}
	m.opened = true
	m.phase = PhaseMarker
	m.effect = &Effect{Kind: EffectCommit, Events: []*logrecord.Event{m.marker(now)}, Marker: true, Confirm: true}
}

// Committed is the result of EffectCommit: the log offset of each event
// on success. An error may still mean the transaction committed (its
// outcome is unknown): the writer answers nothing accepted and ends the
// session either way.
func (m *Writer) Committed(now time.Time, offsets []int64, err error) {
	switch m.phase {
	case PhaseMarker:
		if err != nil {
			m.fail(now, fmt.Errorf("shardcore: commit marker: %w", err))
			return
		}
		if m.cancelled {
			m.finish()
			return
		}
		m.markerOff = offsets[0]
		if m.cfg.Faults.ReplayBeforeMarker {
			convs := m.replayed
			m.replayed = nil
			m.accept(now, convs)
			return
		}
		m.replayOffset()
	case PhaseCommitting:
		m.commitDone(now, offsets, err)
	default:
		m.expect(PhaseCommitting)
	}
}

// PersistOffset is the result of EffectPersistOffset: persist's committed
// offset of the partition (ok false: it has none yet).
func (m *Writer) PersistOffset(now time.Time, off int64, ok bool, err error) {
	switch m.phase {
	case PhaseReplayOffset:
		if err != nil {
			m.fail(now, fmt.Errorf("shardcore: read persist's offset: %w", err))
			return
		}
		end := m.markerOff
		if m.cfg.Faults.AcceptBeforeMarker || m.cfg.Faults.ReplayBeforeMarker {
			end = -1
		}
		if ok && end >= 0 && off >= end {
			m.tail = nil
			m.accept(now, nil)
			return
		}
		m.phase = PhaseReplayTail
		m.effect = &Effect{Kind: EffectReadTail, Abandon: true, From: off, FromStart: !ok, To: end}
	case PhaseHousekeep:
		m.housekept(now, off, ok && err == nil)
	default:
		m.expect(PhaseReplayOffset)
	}
}

// TailRead is the result of EffectReadTail.
func (m *Writer) TailRead(now time.Time, events []*logrecord.Event, err error) {
	if !m.expect(PhaseReplayTail) {
		return
	}
	if err != nil {
		m.fail(now, fmt.Errorf("shardcore: replay: %w", err))
		return
	}
	m.tail = events
	var ids []string
	seen := map[string]bool{}
	for _, e := range events {
		if !seen[e.ConversationID] {
			seen[e.ConversationID] = true
			ids = append(ids, e.ConversationID)
		}
	}
	if len(ids) == 0 && !m.cfg.Faults.AcceptBeforeMarker {
		m.replayDone(now, map[string]*Conv{})
		return
	}
	m.phase = PhaseReplayLoad
	m.effect = &Effect{Kind: EffectLoadState, Abandon: true, Convs: ids, AllOfVShard: m.cfg.Faults.AcceptBeforeMarker}
}

// StateLoaded is the result of EffectLoadState: the conversations asked
// for (a new state for each, even one with no events) and the first
// result of each key durable state holds.
func (m *Writer) StateLoaded(now time.Time, convs map[string]*Conv, found map[DedupeKey]First, err error) {
	switch m.phase {
	case PhaseReplayLoad:
		if err != nil {
			m.fail(now, fmt.Errorf("shardcore: load replayed conversations: %w", err))
			return
		}
		m.replayDone(now, convs)
	case PhaseLoading:
		if err != nil {
			m.notice.StateErr = err
			for _, c := range m.batch {
				m.answer(c, Unavailable(c.ReqID, "conversation state is unavailable"), true, false)
			}
			m.endBatch()
			m.afterBatch(now)
			return
		}
		for cid, conv := range convs {
			if old := m.convs[cid]; old != nil {
				if !m.here(old, cid) && m.here(conv, cid) && conv.Moved {
					m.notice.Arrived = append(m.notice.Arrived, now.Sub(conv.MovedAt))
				}
			}
			m.convs[cid] = conv
			m.adoptIfHere(cid, conv, now)
		}
		for k, f := range found {
			if conv := m.convs[k.Conv]; conv != nil {
				Remember(conv, k.CMID, f)
			}
		}
		m.decide(now)
	default:
		m.expect(PhaseLoading)
	}
}

// OwnerRead is the result of EffectReadOwner: whether the owner row still
// names this writer (worker, registration, epoch); err: it could not be
// read, and is read again after OwnerRetry.
func (m *Writer) OwnerRead(now time.Time, still bool, err error) {
	if !m.expect(PhaseRecheck) {
		return
	}
	switch {
	case err != nil:
		m.phase = PhaseBackoff
		m.wake = now.Add(m.cfg.OwnerRetry)
		if m.cfg.OwnerRetry <= 0 {
			m.readOwner()
		}
	case still:
		m.open(now)
	default:
		m.finish()
	}
}

// expect reports whether the writer is in phase p. A result in another
// phase is a driver bug, except after Stop ended the writer (an abandoned
// round trip reported anyway).
func (m *Writer) expect(p Phase) bool {
	if m.phase == p {
		return true
	}
	if m.phase == PhaseDone {
		return false
	}
	panic(fmt.Sprintf("shardcore: vshard %d writer got a result for %s in phase %s", m.cfg.VShard, p, m.phase))
}

func (m *Writer) open(now time.Time) {
	m.phase = PhaseOpen
	m.sessionStart = now
	m.convs, m.tail, m.opened, m.replayed = nil, nil, false, nil
	if m.cfg.Faults.AcceptBeforeMarker || m.cfg.Faults.ReplayBeforeMarker {
		// The broken order: no producer, no marker; replay what is there.
		m.replayOffset()
		return
	}
	m.effect = &Effect{Kind: EffectOpenProducer, Abandon: true}
}

func (m *Writer) marker(now time.Time) *logrecord.Event {
	return &logrecord.Event{V: logrecord.VersionOf(logrecord.KindTakeover), Kind: logrecord.KindTakeover, VShard: m.cfg.VShard, Epoch: m.cfg.Epoch, Worker: m.cfg.Worker, CreatedAt: now.UTC()}
}

func (m *Writer) replayOffset() {
	m.phase = PhaseReplayOffset
	m.effect = &Effect{Kind: EffectPersistOffset, Abandon: true}
}

// replayDone ends the replay: the writer accepts, except in the order of
// ReplayBeforeMarker, which only now opens the producer and commits the
// marker.
func (m *Writer) replayDone(now time.Time, convs map[string]*Conv) {
	if !m.cfg.Faults.ReplayBeforeMarker {
		m.accept(now, convs)
		return
	}
	m.replayed = convs
	m.phase = PhaseOpen
	m.effect = &Effect{Kind: EffectOpenProducer, Abandon: true}
}

// accept applies the replayed tail to its conversations' durable state
// and starts accepting.
func (m *Writer) accept(now time.Time, convs map[string]*Conv) {
	if convs == nil {
		convs = map[string]*Conv{}
	}
	for _, e := range m.tail {
		c := convs[e.ConversationID]
		if c == nil {
			c = NewConv()
			convs[e.ConversationID] = c
		}
		Apply(c, e)
	}
	m.convs = convs
	for cid, conv := range convs {
		m.adoptIfHere(cid, conv, now)
	}
	m.unstored, m.stored = m.unstored[:0], map[string]*storedSeq{}
	for _, e := range m.tail {
		if m.stored[e.ConversationID] != nil {
			continue
		}
		// Replayed from the log tail: nothing of it is known stored until
		// persist passes the marker.
		m.stored[e.ConversationID] = &storedSeq{}
		m.markUnstored(e.ConversationID, convs[e.ConversationID].LastSeq, m.markerOff)
	}
	m.notice.TookOver, m.notice.Replayed, m.notice.Conversations = true, len(m.tail), len(m.stored)
	m.notice.MarkerOffset, m.notice.Took = m.markerOff, now.Sub(m.sessionStart)
	m.tail = nil
	m.idle(now)
}

// adoptIfHere adopts the verdicts conversation cid's last moved record
// carried, if that record brought it here.
func (m *Writer) adoptIfHere(cid string, conv *Conv, now time.Time) {
	if conv.Moved && len(conv.Verdicts) > 0 && m.here(conv, cid) {
		m.adopt(cid, conv.Verdicts, now)
	}
}

// idle is accepting with no batch in hand; commands that queued meanwhile
// make the writer ask for a Tick at once.
func (m *Writer) idle(now time.Time) {
	m.phase = PhaseAccepting
	m.collecting = false
	m.wake = time.Time{}
	if len(m.queue) > 0 {
		m.wake = now
	} else if len(m.moves) > 0 {
		m.wake = m.moveAt
		if m.wake.Before(now) {
			m.wake = now
		}
	}
}

// fail ends the session: the state is dropped; a stopped writer ends, any
// other re-reads the owner row after a backoff.
func (m *Writer) fail(now time.Time, err error) {
	m.notice.Failed = err
	m.convs, m.tail = nil, nil
	m.collecting = false
	if m.cancelled {
		m.finish()
		return
	}
	m.phase = PhaseBackoff
	m.wake = now.Add(m.backoff)
	m.backoff = min(max(m.backoff*2, m.cfg.Backoff), max(m.cfg.BackoffMax, m.cfg.Backoff))
	if m.cfg.Backoff <= 0 {
		m.readOwner()
	}
}

func (m *Writer) readOwner() {
	m.phase = PhaseRecheck
	m.wake = time.Time{}
	m.effect = &Effect{Kind: EffectReadOwner, Abandon: true}
}

// finish answers every queued command unavailable (the gateway may retry
// it elsewhere) and ends the writer.
func (m *Writer) finish() {
	for _, c := range m.queue {
		m.answer(c, Unavailable(c.ReqID, "vshard %d is moving to another worker", m.cfg.VShard), true, false)
	}
	m.queue, m.convs, m.tail, m.batch, m.replies, m.events, m.batchMoves, m.batchReleased = nil, nil, nil, nil, nil, nil, nil, nil
	m.verdicts, m.batchVerdicts, m.batchVerdictOrder = verdictTable{}, nil, nil
	m.effect, m.wake = nil, time.Time{}
	m.phase = PhaseDone
}

func (m *Writer) answer(c *Call, r *protocol.Reply, retry, wrote bool) {
	m.answers = append(m.answers, Answer{Call: c, Reply: r, Retry: retry, Wrote: wrote})
}

func acceptedReply(c *Call, seq int64, messageID string) *protocol.Reply {
	return &protocol.Reply{Op: protocol.OpAccepted, ID: c.ReqID, ConversationID: c.Cmd.ConversationID, Seq: seq, MessageID: messageID, ClientMessageID: c.Cmd.ClientMessageID}
}

// Unavailable is the writer's answer for a command it did not decide:
// retry with the same ids (after 200 ms).
func Unavailable(id, format string, args ...any) *protocol.Reply {
	e := protocol.Errorf(protocol.CodeUnavailable, format, args...)
	e.RetryAfterMS = 200
	return protocol.Rejected(id, e)
}
