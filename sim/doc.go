// Package sim is a deterministic simulation of the chatpipe write path,
// checked by property-based tests against the invariants I1–I7 below
// (check.go names each property).
//
// It runs the project's real code — the writer state machine
// shardcore.Writer (takeover order, replay, batching, the empty-batch
// marker, dedupe and its trimming, remembered verdicts, eviction, moves,
// every reply) with shardcore's Decide and Apply, ownership.Plan for
// ownership, readmodel.PlanBatch for the read model's membership changes
// and delivery's periods for what a device may see — against in-memory
// stand-ins with the semantics of the real parts:
//
//	log.go      Kafka: per-transactional-id producer epochs; InitProducer bumps
//	            the epoch and aborts the id's open transaction; produce and
//	            commit from an older epoch are fenced; a transaction open past
//	            the timeout is aborted and its producer fenced; read_committed
//	            reads stop at the last stable offset.
//	owners.go   etcd: worker leases expiring on the simulated clock, a gen per
//	            registration, owner rows changed by compare-and-swap (epoch+1).
//	sink.go     persist + Postgres: one transaction per poll, ON CONFLICT DO
//	            NOTHING on (conversation_id, seq) and (conversation_id,
//	            client_message_id), conflicts recorded, offsets in the same
//	            transaction; the writer's two queries (shardworker/pgstate.go).
//	writer.go   the driver of shardcore.Writer, as shardworker's shard is:
//	            it performs each effect the writer asks for (open the
//	            producer, produce, commit, read persist's offset, read the
//	            log tail, load state, read the owner row) against the
//	            stand-ins, one scheduling point each (a batch's produce and
//	            its commit are two), and feeds the result back. It decides
//	            nothing itself.
//	loader.go   the worker's state loader (shardworker/loader.go): the batch
//	            loads of all its writers queue and one round trip answers
//	            every load queued, from one snapshot, each with states of
//	            its own — the hashed vshard's writer and a dedicated one's
//	            may both ask for an overridden conversation in one trip.
//	worker.go   a worker process: lease, manage (start/stop writers from the
//	            owner rows), pause, crash, restart with a new gen.
//	operator.go the operator isolating and releasing conversations (an
//	            override in the owner store) and the route feed that tells
//	            the writers.
//	network.go  the gateway (routes by a possibly stale view) and messages in
//	            flight, delivered in any order or lost.
//	client.go   clients retrying with the same ids on unavailable, timeouts
//	            and lost replies; sends, the same command again (a send, a
//	            keyed join, kick or leave — also a join after its user left
//	            or was kicked), kicks, joins and leaves (keyed three times in
//	            four), and sends to conversations nobody created (refused:
//	            writers remember verdicts for many conversations).
//	projection.go the read model (projection/projection.go): one
//	            transaction per batch of one partition or several, taken
//	            only from what persist stored, each partition lagging on its
//	            own (persist applies it with the events, never behind them;
//	            lagging covers that and a rebuild's order); PlanBatch's changes by conversation and seq, the gap
//	            fill of docs/architecture.md rule 25 (gapSQL), joinSQL,
//	            leaveSQL and the projected last seqs.
//	device.go   devices syncing as delivery.Store.Sync answers: membership
//	            periods and last seqs from the projection, events from the
//	            sink, a cursor per conversation.
//
// Dedicated vshards (Config.Dedicated) sit after the hashed ones, each with
// a partition of its own. The operator isolates a conversation into one,
// or releases it, at any step (an override in the owner store; a released
// conversation keeps an override naming its hashed vshard until that
// vshard's writer finds it here and deletes it, as lease.ReleaseOverride
// does: on the revision it was told of and its own owner row); the
// gateway and each worker read the overrides with a delay of their own,
// and every writer that may hold the conversation is told, also of a
// deletion. The writer that has it commits a moved record, carrying the
// verdicts it remembers for the conversation's keys; the one it moves to
// answers retry until its state — loaded from the sink — says the
// conversation is there. The checker orders a conversation's events by
// commit across partitions, and liveness asks for every conversation to
// end where its override says (its hashed vshard without one), every
// release to end with its override deleted.
// After a move a conversation's events are on two partitions, which the
// projection applies in any order.
//
// # Schedules
//
// Nothing runs concurrently and nothing reads a clock: a run is a sequence of
// steps, and a Chooser picks each one among what can happen now (schedule.go):
// a writer's next round trip, a loader's round trip, delivering or
// dropping a message, a client op or retry, a persist transaction, a
// projection transaction or a partition's projection lagging for a few
// ticks, the clock, a manage or coordinator round, a gateway view
// refresh, a device sync, the operator, and faults — a Postgres or etcd
// outage of a few ticks, a pause longer than the lease (the worker later
// resumes where it was, e.g. with a batch produced and not committed), a
// crash (possibly between produce and commit), a commit whose reply is
// lost (it committed; the writer sees an error), a lost message.
// Takeovers and rebalances follow from leases running out, restarts and
// ownership.Plan. After Config.Steps steps the drain
// heals every fault and runs the world to quiescence (the projection and
// the devices interleaved with the clock at the chooser's pick, so the
// projection's partitions still lag one another); then check.go checks
// (the property named in check.go, then what it protects):
//
//	I1  accepted-but-lost, accepted-but-not-persisted: every accepted
//	    answer's event is in the committed log and in the sink
//	I2  producer-epoch-order, ownership-epoch-order: a vshard's committed
//	    records never go back to an older producer epoch, nor to an older
//	    ownership epoch; written-before-arrival: one writer per
//	    conversation across a move — every event is written by the vshard
//	    the committed log places the conversation at, and the vshard a
//	    moved record sends it to produces nothing for it before persist
//	    stored that record (rule 25 relies on it)
//	I3  seq-collision, seq-regression, accepted-before-sent-order,
//	    sink-conflict: no seq collision, no seq regression in log order;
//	    an op accepted before another was sent has the smaller seq; no
//	    sink conflicts
//	I4  duplicate-client_message_id: no key twice per conversation, in
//	    events of any kind; retry-not-first-result: every answer to a
//	    keyed send, join, kick or leave (first try, retry, the same
//	    command again) is its first result; keyed-command-two-effects:
//	    one keyed command, at most one effect, and none once told no — a
//	    join answered accepted without a write (its user was a member), or
//	    a final rejection, is not followed within RefusalMemory by a commit
//	    of the sender's op for the key from the same writer, nor from the
//	    vshard that writer's moved record carried the answer to
//	    (docs/protocol.md)
//	I5  message-from-non-member: no message from a user who is not a
//	    member at its seq; projected-membership: the read model's
//	    membership periods of every conversation are those of its events
//	    in seq order up to its projected last seq after every projection
//	    batch, and all of them at the end — a kicked or left user is not a
//	    member there (rule 25)
//	I6  devices-diverge: every device's list — synced through the
//	    projection's periods, as delivery does — is the log's,
//	    seq-ordered, as its user may see it
//	I7  accepted-before-commit: no `accepted` leaves a writer before its
//	    event is committed; stale-answer: no answer is contradicted by
//	    every state of the log during its attempt (below), unless it
//	    repeats the key's first answer the writer keeps
//
// plus bounded-writer-cache (a writer's state is bounded:
// docs/operations.md, "Memory bounds"): after every housekeeping pass a
// writer caches at most MaxConvs conversations, or the ones with events
// persist had not stored if they are more
// (internal/shardcore/writer_memory.go), however many conversations
// clients are refused in; and liveness: the healed world answers every
// op, persists and projects everything and syncs every device.
//
// # Running
//
//	go test ./sim/
//
// runs, in CI, 10,000 seeded schedules of the correct writer
// (TestSchedules; the shape — 1–4 vshards over 1–2 partitions, 0–2
// dedicated vshards, 2–3 workers, 1–3 cached conversations per writer —
// drawn from each seed, the seeds moving with the day; 1,000 under
// -race), the seeds of the regression corpus testdata/schedules.txt
// (TestScheduleCorpus), 8 rapid rounds of 100 random schedules
// (TestProperties), 300 seeded schedules per bug switch and the same 300
// of the correct writer in each bug's shape, 500 schedules of moves
// (TestMovesUnderFaults), and the fixed schedules: on a shared 2-core
// machine about 65 s (51 s of CPU), with -race 2½ to 4 minutes (about
// 115 s of CPU). A failing TestSchedules
// seed is printed with the command that replays it and appended to the
// corpus:
//
//	CHATPIPE_SIM_SCHEDULE=<seed> go test ./sim/ -run 'TestSchedules$' -v
//
// (CHATPIPE_SIM_SCHEDULES=N runs N schedules, CHATPIPE_SIM_BASE=S starts
// them at seed S). A failing TestProperties prints the violations, the end
// of the trace and rapid's seed; rapid also writes a fail file under
// testdata/rapid/. Reproduce with
//
//	go test ./sim/ -run 'TestProperties$' -rapid.seed=<seed>
//
// (-rapid.failfile=<file> works too). Seeded schedules (the bug tests)
// replay with their full trace:
//
//	CHATPIPE_SIM_SEED=<seed> [CHATPIPE_SIM_BUG=<name>] go test ./sim/ -run TestReplay -v
//
// A soak runs 1,000,000 seeded schedules, longer rapid schedules with more
// faults round after round for the given time, and 25 times as many seeded
// bug schedules:
//
//	CHATPIPE_SIM_SOAK=1 go test ./sim/ -timeout 0          # 10 minutes
//	CHATPIPE_SIM_SOAK=2h go test ./sim/ -run TestProperties -timeout 0
//
// -rapid.checks=N sets the schedules per round (in CI and in a soak).
//
// # Bug switches
//
// Config.Bugs switches on a planted bug: one of the real writer's test-only
// faults (shardcore.WriterFaults), or a fault of a model of a real part
// (the loader, the projection). TestBugsAreCaught runs each on CI's 300
// seeds in its shape (bugs_test.go: DefaultConfig, with fewer faults or
// conversations where that makes the bug's path likelier), asserts that
// the property meant for it is among those that catch it, and logs which
// did; TestCorrectWriterOnBugSeeds runs the correct writer on the same
// seeds and shapes. In 300 schedules:
//
//	AcceptBeforeMarker        replay, accept, fence+marker only at the first
//	                          commit: I3 seq-collision in 22 (with sink
//	                          conflicts and I1 not-persisted), caught in 37
//	AcceptedBeforeCommit      answer before the commit returns: I7
//	                          accepted-before-commit in all 300, I1
//	                          accepted-but-lost (86) when the commit then fails
//	MembershipOutsideMailbox  members checked against a snapshot taken at
//	                          arrival: I5 message-from-non-member in 28, I6
//	                          in 41, caught in 66
//	ReplayBeforeMarker        replay the log as it is, then open the producer
//	                          and commit the marker: I3 seq-collision when the
//	                          old writer commits in between, in 1 (caught in 2)
//	AcceptBeforeMoved         the writer a conversation is routed to decides
//	                          for it at once (one dedicated vshard): I2
//	                          written-before-arrival in 208, I3 seq-collision
//	                          in 209, caught in 223
//	SharedLoadState           the loader hands every load of a round trip
//	                          that asked for one conversation the same state
//	                          (shardworker's loader gives each load its own):
//	                          the dedicated vshard's writer decides from
//	                          the moved record the hashed one applied before
//	                          persist stored it, or the other way round —
//	                          I2 written-before-arrival in 34 (one dedicated
//	                          vshard; I3 seq-regression in 5)
//	ProjectionRecordOrder     the projection applies a batch's membership
//	                          changes in record order and fills no hole (what
//	                          rule 25 forbids): I5 projected-membership
//	                          in 42 (one dedicated vshard, two conversations,
//	                          two faults)
//	ForgetNoopJoin            a keyed join of a current member answered
//	                          without keeping its verdict (shardcore keeps
//	                          it): I4 keyed-command-two-effects in 40
//	                          (three users, all members at first; two faults,
//	                          so fewer takeovers: the writer that answered is
//	                          the one the same join reaches again)
//	VerdictsPinConvs          eviction keeps every conversation a remembered
//	                          verdict names (refusals kept in the cached
//	                          state instead of the writer-level table):
//	                          bounded-writer-cache in 82
//	KnownForgetsTrimmed       a trimmed dedupe result's key is not added to
//	                          the conversation's filter of known keys: I4
//	                          retry-not-first-result in 76, I4
//	                          duplicate-client_message_id in 48: a retry
//	                          after the trim is written as a new send
//	ReleaseFromSink           the operator deletes a released conversation's
//	                          override once the sink shows it home (admin
//	                          unisolate deciding from Postgres): liveness in
//	                          13 (two conversations, one dedicated vshard):
//	                          a move decided before, not yet stored, strands
//	                          the conversation where nothing routes to
//	DropCarriedVerdicts       moved records without the writer's verdicts:
//	                          I4 keyed-command-two-effects in 29 (one
//	                          dedicated vshard): a send refused before the
//	                          move is accepted after it
//
// The counts are of today's schedules; a change to the model moves them.
//
// # Answers that write nothing
//
// A writer answers a command whose decision writes nothing — a rejection
// (forbidden, not_found, conflict), a retried send found by dedupe, a join
// of a member — from its state. Without a commit there is no fence, so a
// writer that has been fenced and does not know it yet would answer from
// stale state. Two interleavings of the real order make such a writer:
//
//  1. Re-open after the re-check. After a failed commit (e.g. a lost commit
//     reply) the writer reads its owner row, then starts a session whose
//     InitProducerID that read does not guard. A worker frozen between the
//     two, longer than its lease, re-opens the producer after the new owner
//     committed its marker: it fences the rightful owner and, without the
//     marker's confirming read (Effect.Confirm, docs/architecture.md rule
//     3), commits events of the old ownership epoch after the new epoch's
//     marker (Stats.EpochRegressions), while the owner answers from a state
//     that misses them until its next write fails.
//  2. Old owner still serving. A writer whose row moved (rebalance, lost
//     lease) keeps taking commands until its worker's watch delivers the
//     change, and once stopped still takes what queued (collect selects
//     between the queue and the cancelled context); it answers them from
//     its state after the new owner committed.
//
// With persist lagging, the retry of a send committed by the other writer
// then gets a definitive `forbidden` (the conversation or the membership is
// not in the stale state, the dedupe lookup misses in Postgres): I4 broken,
// against docs/protocol.md ("returns the first accepted again ... whatever
// happened to the servers in between"). TestKnownIssueFencedWriterAnswers
// replays interleaving 1 step by step.
//
// So the writer answers a batch that wrote nothing only once it has
// committed a takeover marker, which proves its producer current
// (WhatIf.FenceCheckedAnswers), and shardworker reads the owner row again
// right before it re-opens the producer. The model's default follows that
// order (WhatIf.FenceCheckedAnswers on) and makes a contradicted answer a
// violation (Config.StrictAnswers on). Such answers come only from fenced
// writers (an answer from an unfenced writer that the log contradicts is
// always a violation); without StrictAnswers they are counted in
// Stats.StaleAnswers and not reported. WhatIf.RecheckAtOpen (re-read the
// row in the same step as InitProducer) stays off, because a pause
// between that read and the re-open is possible in the real order; epoch
// regressions are counted, not reported (the log contract says epoch is
// informational).
//
// Over 20,000 seeded CI-shaped schedules with StrictAnswers, without
// FenceCheckedAnswers and without the marker's confirming read: 24
// schedules with such an answer, 8 of them breaking I4, and 448 schedules
// with epoch regressions. RecheckAtOpen removes the epoch regressions but
// leaves 6 schedules (I4, interleaving 2); FenceCheckedAnswers leaves none.
// As with the bug switches, a change to the model moves these counts.
//
// # Not modelled
//
// etcd outages as the leases see them (an outage only fails the writers'
// owner-row reads; leases run on the simulated clock), the gateway's own
// retries, the dedupe window's expiry by time (trimming by count is
// modelled: one result kept per conversation), the per-conversation rate
// limit (off), the group commit's linger (none), and produce errors other
// than fencing. Postgres outages fail the writers' state loads and offset
// reads and stop persist and the projection; writers cache one to three
// conversations, so eviction and reloading run all the time. The loader
// has no bound on the round trips in flight (every load queued goes in
// the next one). The projection's delivery outbox, the feed's pushes and
// read markers are not modelled: devices sync.
package sim
