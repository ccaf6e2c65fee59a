// Package shardworker runs the writers of the virtual shards a worker owns.
//
// Every decision of a writer is made by the pure state machine
// shardcore.Writer (docs/architecture.md, "The writer's state machine");
// this package is its driver: it performs the effects the machine asks for
// against franz-go, etcd and Postgres and feeds the results back.
//
// For each owned vshard the writer follows the takeover order of
// docs/architecture.md rule 1, "Marker before replay, replay before
// accept": the
// owner row names this worker (lease package) → open the transactional
// producer chatpipe-vshard-<n> and commit a takeover marker, which fences
// the previous writer and aborts its open transaction → replay the log from
// persist's committed offset up to the marker (read_committed) over the
// durable state in Postgres → only then accept commands.
//
// Commands of a vshard are handled by one loop, in arrival order: for every
// conversation that is its mailbox. The loop takes whatever commands have
// queued (group commit), resolves state it lacks from Postgres in one round
// trip per batch, decides each command with the pure shardcore, produces
// the resulting events in one Kafka transaction and answers only after the
// commit returned success. Any failure of a commit — fenced, aborted or of
// unknown outcome — answers `unavailable`, throws the state away, re-checks
// ownership in etcd and, if still the owner, takes over again (marker,
// replay): the log is the truth, and the client's retry finds it through
// dedupe.
//
// The writer writes only to Kafka; every other effect is made by consumers
// of the committed log.
package shardworker
