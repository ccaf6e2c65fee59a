package sim

// Bugs are deliberate mistakes the simulated writer can be built with, to
// show that the properties catch them. The zero value is the correct writer,
// which follows shardworker's order.
type Bugs struct {
	// AcceptBeforeMarker reverses the takeover order: replay the log as it
	// is now, accept commands, and initialise the producer (which fences
	// the previous writer) and write the takeover marker only with the
	// first commit.
	AcceptBeforeMarker bool
	// AcceptedBeforeCommit answers `accepted` as soon as a batch is
	// produced, before the transaction commit returned.
	AcceptedBeforeCommit bool
	// MembershipOutsideMailbox checks membership against the members the
	// writer knew when the command arrived (a snapshot taken outside the
	// mailbox), not against the state at seq assignment.
	MembershipOutsideMailbox bool
	// ReplayBeforeMarker replays the log as it is now, then opens the
	// producer and commits the marker, and accepts without reading what
	// the previous writer committed in between.
	ReplayBeforeMarker bool
	// AcceptBeforeMoved makes the writer a conversation is routed to
	// accept for it from its durable state at once, without waiting for
	// the moved record of the vshard it leaves.
	AcceptBeforeMoved bool
	// SharedLoadState makes the worker's loader hand every load of a
	// round trip that asked for the same conversation one and the same
	// state (*shardcore.Conv): the hashed vshard's writer and a dedicated
	// one's then decide from, and change, each other's state.
	SharedLoadState bool
	// ProjectionRecordOrder makes the projection apply a batch's
	// membership changes in record order, without filling a hole in a
	// conversation's seqs from the events persist stored (the order
	// before docs/architecture.md rule 25).
	ProjectionRecordOrder bool
	// ForgetNoopJoin makes the writer answer a keyed join of a current
	// member without remembering the answer for the key
	// (shardcore.WriterFaults.ForgetNoopJoin).
	ForgetNoopJoin bool
	// VerdictsPinConvs makes the writer keep every cached conversation
	// that a remembered verdict names (shardcore.WriterFaults.VerdictsPinConvs).
	VerdictsPinConvs bool
	// KnownForgetsTrimmed makes the writer trim dedupe results without
	// adding their keys to the conversation's filter of known keys
	// (shardcore.WriterFaults.KnownForgetsTrimmed).
	KnownForgetsTrimmed bool
	// ReleaseFromSink makes the operator, not the hashed vshard's writer,
	// delete a released conversation's override, as soon as the sink
	// (which lags the log) shows it at its hashed vshard.
	ReleaseFromSink bool
	// DropCarriedVerdicts makes moved records carry no verdicts
	// (shardcore.WriterFaults.DropCarriedVerdicts): the writer a
	// conversation moves to decides a key refused before the move again.
	DropCarriedVerdicts bool
}

// Any reports whether a bug is switched on.
func (b Bugs) Any() bool {
	return b != Bugs{}
}

// Config is the shape of one simulated deployment and the size of its
// schedule. Times are in ticks of the simulated clock.
type Config struct {
	VShards    int // virtual shards
	Partitions int // log partitions; vshard v is in partition v mod Partitions
	// Dedicated vshards beyond the hashed ones (each with a partition of
	// its own after them): the schedule isolates conversations into them
	// and releases them again (an override in the owner store).
	Dedicated     int
	Workers       int // worker processes
	Conversations int // conversation i lands on vshard i mod VShards
	// GhostConvs are conversations nobody creates (ghost i lands on
	// vshard i mod VShards): clients send to them and are refused, so
	// writers remember verdicts for many conversations.
	GhostConvs     int
	Users          int // u0 owns every conversation; u1, u2 are initial members
	DevicesPerUser int
	MaxBatch       int // commands per writer transaction (group commit)
	PersistBatch   int // records per sink transaction
	MaxMembers     int // shardcore.Limits.MaxMembers
	// WriterMaxConvs is the conversations a writer caches before it evicts
	// the ones persist has stored (shardcore.WriterConfig.MaxConvs).
	WriterMaxConvs int

	LeaseTTL      int64 // worker lease; a worker not renewing for this long loses it
	TxnTimeout    int64 // the log aborts (and fences) a transaction open this long
	ClientTimeout int64 // a client retries an attempt unanswered this long

	Steps      int // scheduled steps before the drain
	MaxOps     int // client operations issued by the schedule
	MaxFaults  int // pauses, crashes, dropped messages and lost commit replies
	DrainSteps int // bound of the drain (heal, then run to quiescence)

	Bugs   Bugs
	WhatIf WhatIf

	// StrictAnswers makes an answer from a fenced writer that the log
	// contradicts a violation (PropStaleAnswer); without it they are only
	// counted, in Stats.StaleAnswers. DefaultConfig turns it on: the real
	// writer gives no such answers (doc.go, "Answers that write nothing").
	StrictAnswers bool

	// Untraced keeps no trace (Result.Trace stays empty) and formats no
	// step's name, a large part of a run's cost. A seeded run is a pure
	// function of its config and seed (TestDeterministic), so RunSeed
	// replays a failing one with its trace.
	Untraced bool
}

// WhatIf are changes to the writer's order that the model can try, to
// measure what each step of the real order prevents (doc.go, "Answers that
// write nothing"). The zero value answers a batch that wrote nothing
// without a fence check; DefaultConfig has the real order.
type WhatIf struct {
	// RecheckAtOpen re-reads the owner row in the same step as
	// InitProducer, instead of only before the backoff that precedes a new
	// session.
	RecheckAtOpen bool
	// FenceCheckedAnswers answers a batch that wrote nothing only after
	// checking that the producer is still current (in Kafka: a
	// transactional round trip); a fenced writer answers unavailable and
	// takes over again.
	FenceCheckedAnswers bool
	// NoMarkerConfirm commits a session's first marker without reading the
	// owner row between its produce and its commit (what
	// docs/architecture.md rule 3 forbids): a writer whose re-check passed
	// just before its row moved can then commit a marker of the older epoch
	// after the newer owner's records.
	NoMarkerConfirm bool
}

// DefaultConfig is the shape the CI runs: few shards sharing partitions,
// three workers, a few conversations and users, short leases.
func DefaultConfig() Config {
	return Config{
		VShards:        3,
		Partitions:     2,
		Workers:        3,
		Conversations:  3,
		GhostConvs:     6,
		Users:          4,
		DevicesPerUser: 2,
		MaxBatch:       3,
		PersistBatch:   4,
		MaxMembers:     100,
		WriterMaxConvs: 2,
		LeaseTTL:       10,
		TxnTimeout:     15,
		ClientTimeout:  6,
		Steps:          250,
		MaxOps:         40,
		MaxFaults:      8,
		DrainSteps:     20000,
		// the real writer's order (shardworker.process): answers of a batch
		// that wrote nothing wait for a commit, so a stale answer is a bug
		WhatIf:        WhatIf{FenceCheckedAnswers: true},
		StrictAnswers: true,
	}
}
