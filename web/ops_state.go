package web

import "time"

// The pipeline state GET /ops/state serves: owner rows, overrides,
// workers, rates and consumers.

// State is the pipeline at one instant, as GET /ops/state serves it.
type State struct {
	Time    time.Time `json:"time"`
	VShards int       `json:"vshards"` // hashed vshards: 0 … VShards-1
	// Dedicated vshards follow the hashed ones: VShards … VShards+Dedicated-1.
	Dedicated   int    `json:"dedicated"`
	Topic       string `json:"topic"`
	Coordinator string `json:"coordinator,omitempty"` // the elected coordinator's candidate id
	// Shards is indexed by vshard, the hashed ones then the dedicated ones.
	// Worker is empty for a vshard with no owner row yet.
	Shards []ShardState `json:"shards"`
	// Overrides are the conversations routed away from their hashed vshard
	// (routes/<conversation> in etcd), by conversation.
	Overrides []OverrideState `json:"overrides"`
	Workers   []WorkerState   `json:"workers"`
	Rates     Rates           `json:"rates"`
	Totals    Totals          `json:"totals"`
	// Gateway is this gateway's websocket side (from its own /metrics).
	Gateway map[string]float64 `json:"gateway,omitempty"`
	// Consumers are the log's Postgres consumers (persist) with
	// their offsets against the topic's end offsets.
	Consumers []ConsumerState `json:"consumers"`
	// PersistLagRecords is chatpipe_persist_lag_records summed over
	// partitions, when persist runs in this process.
	PersistLagRecords *float64 `json:"persist_lag_records,omitempty"`
	// Errors lists what could not be read; the rest of the state is still
	// good.
	Errors []string `json:"errors,omitempty"`
}

// ShardState is one owner row.
type ShardState struct {
	VShard int    `json:"vshard"`
	Worker string `json:"worker"`
	Gen    int64  `json:"gen"`
	Epoch  int64  `json:"epoch"`
	// Live: the row's worker is registered with the row's gen (its lease is
	// alive), so it is the vshard's writer.
	Live bool `json:"live"`
	// Dedicated: a dedicated vshard, writing only the conversations whose
	// override names it (Conversations, sorted).
	Dedicated     bool     `json:"dedicated,omitempty"`
	Conversations []string `json:"conversations,omitempty"`
}

// OverrideState is one conversation's override.
type OverrideState struct {
	Conversation string    `json:"conversation"`
	VShard       int       `json:"vshard"`
	Since        time.Time `json:"since"`
	// Isolated: VShard is a dedicated vshard. An override that names a
	// hashed vshard is a release in progress (the conversation is moving
	// home).
	Isolated bool `json:"isolated"`
}

// Worker states.
const (
	WorkerLive        = "live"        // registered in etcd; metrics readable
	WorkerUnreachable = "unreachable" // registered, but its admin address does not answer
	WorkerGone        = "gone"        // no longer registered (its lease ended)
)

// WorkerState is one worker: registered, or named by an owner row, or seen
// recently.
type WorkerState struct {
	ID    string `json:"id"`
	State string `json:"state"`
	Addr  string `json:"addr,omitempty"`
	Admin string `json:"admin,omitempty"`
	Gen   int64  `json:"gen,omitempty"`
	// LeaseTTL is the seconds left on the worker's lease (-1 unknown).
	LeaseTTL int64 `json:"lease_ttl_seconds"`
	// Owned counts the vshards whose row names this worker and its gen;
	// Rows those whose row names it at all (a dead worker keeps rows until
	// the coordinator moves them).
	Owned int `json:"owned"`
	Rows  int `json:"rows"`
	// Metrics are its chatpipe_worker_* values, the last ones read.
	Metrics         map[string]float64 `json:"metrics,omitempty"`
	EventsPerSecond float64            `json:"events_per_second"`
	MetricsAt       *time.Time         `json:"metrics_at,omitempty"`
	Error           string             `json:"error,omitempty"`
}

// Rates are per second over the last few seconds.
type Rates struct {
	// Events: events committed by every worker (each is an accepted
	// command that wrote; a dedupe hit writes nothing).
	Events float64 `json:"events_per_second"`
	// GatewayAccepted: `accepted` answers of this gateway.
	GatewayAccepted float64 `json:"gateway_accepted_per_second"`
	// PersistInserted: events persist inserted (when it runs in this process).
	PersistInserted float64 `json:"persist_inserted_per_second"`
}

// Totals are counters summed over the workers listed (a gone worker keeps
// its last values until forgotten; a restarted one starts from zero).
type Totals struct {
	Events         float64 `json:"events"`
	FencedWrites   float64 `json:"fenced_writes"`
	Takeovers      float64 `json:"takeovers"`
	UnknownCommits float64 `json:"unknown_commits"`
}

// ConsumerState is one consumer's progress.
type ConsumerState struct {
	Consumer string `json:"consumer"`
	// Behind sums PartitionState.Behind over the partitions; -1 when the
	// topic's end offsets are unknown (no brokers configured, or Kafka did
	// not answer).
	Behind     int64            `json:"behind"`
	Partitions []PartitionState `json:"partitions"`
	UpdatedAt  time.Time        `json:"updated_at"` // its latest offset write
}

// PartitionState is a consumer's offset in one partition.
type PartitionState struct {
	Partition  int32 `json:"partition"`
	NextOffset int64 `json:"next_offset"`
	EndOffset  int64 `json:"end_offset"` // the last stable offset; -1 unknown
	// Behind is EndOffset − NextOffset − 1, at least 0. Every transaction
	// ends with a commit marker that takes an offset but is no record, and
	// a consumer's next offset stops at the last marker, so a caught-up
	// consumer is one offset short of the end: Behind is 0 then. Behind
	// counts the markers of the transactions left too: an upper bound of
	// the records left. -1 when EndOffset is unknown.
	Behind int64 `json:"behind"`
}
