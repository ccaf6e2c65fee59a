// Package logsink is the skeleton of chatpipe's exactly-once consumers of
// the log (persist): a read_committed consumer group member
// that keeps its offsets in Postgres, written in the same transaction as
// what it derives from the records, and starts from them — never from
// Kafka's committed group offsets.
//
// A batch that fails is retried. What happens next depends on the error
// (classify):
//
//   - transient (connection lost, serialization failure, anything not
//     listed below): retried with backoff until it succeeds;
//   - permanent (a record this consumer can never write: a Postgres data
//     exception, SQLSTATE class 22, e.g. a NUL byte in a text value; a
//     program limit, class 54, e.g. an index row too large; or a record that
//     is not a readable record of any version, logrecord.ErrMalformed):
//     retried a few times, then the batch is bisected until the records
//     that fail alone are found; the others are written as usual and each
//     culprit goes to dead_letters in the same transaction as the stored
//     offset moving past it, with what Config.Salvage can still write of
//     it. The partition moves on;
//   - halt (a record of a newer schema version, logrecord.ErrUnsupportedVersion):
//     never dead-lettered, since upgrading this consumer makes it readable.
//     The consumer stops there, logs an error at every retry (every 5 s),
//     reports itself not ready and sets its halted gauge.
//
// The Consumer owns each batch's transaction: Config.Handle only queues the
// statements that apply the records on a pgx.Batch, after the statement
// the Consumer queues first to store their offsets, and the Consumer sends
// it all as one transaction, in one round trip (Write). So no consumer can
// write records without their offsets, nor offsets without the records.
package logsink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/groupcommit"
)

// Querier is what reading offsets needs: a pool, a connection or a tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// DB is what a Consumer needs of Postgres: queries, pipelines for its
// batches, and transactions for its dead letters. A *pgxpool.Pool is one.
type DB interface {
	Querier
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Pace is a consumer's group commit. TxnBudget is the Postgres
// transactions per second it aims to stay under: once records arrive
// faster, it lingers after a poll (up to LingerMax) for its batch to fill
// (internal/groupcommit), as a vshard's writer does for its Kafka
// transactions. Zero values take DefaultTxnBudget and DefaultLingerMax; a
// negative LingerMax never waits.
type Pace struct {
	TxnBudget float64
	LingerMax time.Duration
}

// Defaults of a consumer's group commit (Pace).
const (
	DefaultTxnBudget = 100
	DefaultLingerMax = 5 * time.Millisecond
)

// PersistConsumer is persist's name in consumer_offsets and dead_letters:
// a shard writer reads its offsets and its dead letters, and the run
// checks wait for it.
const PersistConsumer = "persist"

// Config configures a Consumer.
type Config struct {
	Brokers  []string
	Topic    string
	Group    string
	Consumer string // its name in consumer_offsets and dead_letters
	DB       DB
	MaxBatch int
	Pace
	Log *slog.Logger
	// Handle queues on b the statements that apply one poll's records (of
	// Topic, in offset order per partition) and returns how to read their
	// results. It may be given any part of a poll, in order. b already
	// holds the statement storing the records' offsets (first, so that an
	// overlapping batch of the same partitions waits: storeOffsetsSQL);
	// the Consumer queues Announce after Handle's statements and sends b
	// as one pipeline, which Postgres runs as one implicit transaction, in
	// one round trip: so b must not hold BEGIN, COMMIT or a statement that
	// cannot run in a transaction. Handle may read Postgres or wait before
	// it queues (round trips of its own), but writes only through b. An
	// error, from Handle or from reading the results, is retried or leads
	// to dead letters as the package documentation says.
	Handle func(ctx context.Context, b *pgx.Batch, recs []*kgo.Record) (Queued, error)
	// Announce, if set, is a channel every batch Handle wrote is announced
	// on (pg_notify queued last, so delivered at the commit, with the
	// offsets stored as its payload: AnnouncePayload), and so is each dead
	// letter's transaction.
	Announce string
	// HoldBeforeCommit (fault tests only) runs every batch in an explicit
	// transaction held open that long before its commit, so that a kill
	// lands inside it.
	HoldBeforeCommit time.Duration
	// BatchTimeout bounds a batch's round trip to Postgres (default 30 s):
	// past it the attempt is abandoned (its connection closed, the
	// transaction rolled back) and retried, so a link that stops
	// answering without closing (a black hole) does not stall the
	// consumer for as long as the kernel keeps retransmitting.
	BatchTimeout time.Duration
	// Tick, if set, runs after every poll (housekeeping).
	Tick func(ctx context.Context)
	// Salvage are the ways to write part of a record that is dead-lettered,
	// tried in order in the dead letter's transaction: the first whose
	// transaction commits is kept; when each fails for good, the dead
	// letter is written alone.
	Salvage []Salvage
	// MaxDeadLetters caps the records dead-lettered in any minute (default
	// 100; negative: no cap). Past it the fault is taken for systemic (a
	// writer or schema bug, not one bad record): the consumer stops at the
	// record, as for a newer version, rather than set the log aside.
	MaxDeadLetters int

	// KafkaOpts are appended to the consumer's options (TLS, SASL).
	KafkaOpts []kgo.Opt
}

// Salvage is one way to write part of a record that is dead-lettered.
type Salvage struct {
	What string // what it writes, for the log: "its event row"
	// Handle queues it, as Config.Handle does, for the one record.
	Handle func(ctx context.Context, b *pgx.Batch, recs []*kgo.Record) (Queued, error)
}

// Queued is what Config.Handle queued on a batch.
type Queued struct {
	// Read reads the results of the statements Handle queued, in order,
	// and returns the first error; nil reads each of them with Exec. It
	// must not fail on results that are fine: Postgres commits whatever
	// the client makes of them, so an error Read makes up comes after the
	// commit, and the records are written again (which must be harmless,
	// as after a connection lost during a commit).
	Read func(br pgx.BatchResults) error
	// Committed, if set, runs once the batch is committed (counters, logs).
	Committed func()
}

// DefaultBatchTimeout is Config.BatchTimeout's default.
const DefaultBatchTimeout = 30 * time.Second

// batchTimeout is Config.BatchTimeout, or its default.
func (c *Consumer) batchTimeout() time.Duration {
	if c.cfg.BatchTimeout <= 0 {
		return DefaultBatchTimeout
	}
	return c.cfg.BatchTimeout
}

// read reads the results of the n statements q's Handle queued: with
// q.Read, or each with Exec (its error prefixed with consumer) when it is
// nil.
func (q Queued) read(br pgx.BatchResults, n int, consumer string) error {
	if q.Read != nil {
		return q.Read(br)
	}
	for range n {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("%s: %w", consumer, err)
		}
	}
	return nil
}

// Consumer runs Config.Handle over the log and tracks its lag.
type Consumer struct {
	cfg         Config
	lag         *prometheus.GaugeVec
	deadLetters prometheus.Counter
	haltedGauge prometheus.Gauge
	dead        atomic.Int64 // records dead-lettered by this Consumer
	joined      atomic.Bool
	mu          sync.Mutex
	lags        map[int32]int64
	halted      error       // the error the consumer is stopped at, under mu
	recentDead  []time.Time // when the last MaxDeadLetters dead letters were written
	tripped     bool        // over MaxDeadLetters once: no more dead letters until a restart
}

// errTooManyDeadLetters stops a consumer that would dead-letter more than
// Config.MaxDeadLetters records in a minute.
var errTooManyDeadLetters = errors.New("too many dead letters in a minute: a systemic fault, not a bad record")

// deadLetterBudget reports whether one more dead letter stays within
// MaxDeadLetters a minute.
func (c *Consumer) deadLetterBudget(now time.Time) bool {
	limit := c.cfg.MaxDeadLetters
	if limit == 0 {
		limit = 100
	}
	if limit < 0 {
		return true
	}
	if c.tripped {
		return false
	}
	for len(c.recentDead) > 0 && now.Sub(c.recentDead[0]) >= time.Minute {
		c.recentDead = c.recentDead[1:]
	}
	if len(c.recentDead) >= limit {
		c.tripped = true
		return false
	}
	return true
}

// New returns a consumer whose metrics are named prefix_lag_records (with
// lagHelp), prefix_dead_letters_total and prefix_halted.
func New(cfg Config, prefix, lagHelp string) *Consumer {
	if cfg.TxnBudget <= 0 {
		cfg.TxnBudget = DefaultTxnBudget
	}
	if cfg.LingerMax == 0 {
		cfg.LingerMax = DefaultLingerMax
	}
	return &Consumer{cfg: cfg, lags: map[int32]int64{},
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: prefix + "_lag_records", Help: lagHelp}, []string{"partition"}),
		deadLetters: prometheus.NewCounter(prometheus.CounterOpts{Name: prefix + "_dead_letters_total",
			Help: "Records this consumer could never write, kept in dead_letters (chatpipe admin dead-letters); the partition moved on."}),
		haltedGauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: prefix + "_halted",
			Help: "1 while the consumer is stopped at a record: of a newer schema version (upgrade it), or after too many dead letters in a minute (fix the cause); else 0."}),
	}
}

// Collectors returns the consumer's metrics: lag, dead letters, halted.
func (c *Consumer) Collectors() []prometheus.Collector {
	return []prometheus.Collector{c.lag, c.deadLetters, c.haltedGauge}
}

// CaughtUp reports whether the consumer has joined its group, is not
// stopped at a record it cannot read, and no partition lagged by more than
// maxLag records at its last fetch.
func (c *Consumer) CaughtUp(maxLag int64) error {
	if !c.joined.Load() {
		return errors.New("not in the consumer group yet")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.halted != nil {
		if errors.Is(c.halted, errTooManyDeadLetters) {
			return fmt.Errorf("stopped (fix the cause, then restart it): %w", c.halted)
		}
		return fmt.Errorf("stopped at a record this build cannot read (upgrade it): %w", c.halted)
	}
	for part, lag := range c.lags {
		if lag > maxLag {
			return fmt.Errorf("partition %d lags by %d records", part, lag)
		}
	}
	return nil
}

// DeadLettered is the number of records this Consumer has dead-lettered.
func (c *Consumer) DeadLettered() int64 { return c.dead.Load() }

// Degraded describes the consumer's dead letters ("" if it has none): the
// rows of dead_letters under its name, however old. It asks Postgres.
func (c *Consumer) Degraded(ctx context.Context) string {
	n, err := CountDeadLetters(ctx, c.cfg.DB, c.cfg.Consumer)
	if err != nil {
		return fmt.Sprintf("cannot count dead letters: %v", err)
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%d dead letters (chatpipe admin dead-letters --consumer %s)", n, c.cfg.Consumer)
}

// CountDeadLetters counts consumer's rows in dead_letters ("": everyone's).
func CountDeadLetters(ctx context.Context, q Querier, consumer string) (int64, error) {
	rows, err := q.Query(ctx, `SELECT count(*) FROM dead_letters WHERE $1 = '' OR consumer = $1`, consumer)
	if err != nil {
		return 0, fmt.Errorf("count %s dead letters: %w", consumer, err)
	}
	n, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, fmt.Errorf("count %s dead letters: %w", consumer, err)
	}
	return n, nil
}

// Run consumes until ctx ends. A batch in hand when ctx ends is finished or
// rolled back as a whole.
func (c *Consumer) Run(ctx context.Context) error {
	cl, err := kgo.NewClient(append(slices.Clip(c.cfg.KafkaOpts),
		kgo.SeedBrokers(c.cfg.Brokers...),
		kgo.ConsumerGroup(c.cfg.Group),
		// A crashed member's partitions move after 10 s, not the default 45 s.
		kgo.SessionTimeout(10*time.Second),
		kgo.ConsumeTopics(c.cfg.Topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		// How long the broker holds a fetch that finds nothing: a commit
		// answers it at once, so this only paces an idle consumer's
		// fetches (one a second instead of ten).
		kgo.FetchMaxWait(time.Second),
		kgo.AdjustFetchOffsetsFn(c.startOffsets),
	)...)
	if err != nil {
		return fmt.Errorf("%s: consumer: %w", c.cfg.Consumer, err)
	}
	defer cl.Close()
	defer cl.AllowRebalance() // Close leaves the group, which a blocked rebalance would stall
	pace := groupcommit.Pacer{Max: max(c.cfg.LingerMax, 0)}
	var last time.Time // when the last batch started
	for {
		fs := cl.PollRecords(ctx, c.cfg.MaxBatch)
		if ctx.Err() != nil {
			return nil
		}
		if n := fs.NumRecords(); n > 0 && n < c.cfg.MaxBatch {
			if d := pace.Linger(c.cfg.TxnBudget); d > 0 {
				fs = c.linger(ctx, cl, fs, d)
			}
		}
		for _, e := range fs.Errors() {
			c.cfg.Log.Warn("fetch error", "consumer", c.cfg.Consumer, "topic", e.Topic, "partition", e.Partition, "err", e.Err)
		}
		if recs := fs.Records(); len(recs) > 0 {
			start := time.Now()
			c.handleRetrying(ctx, recs)
			if ctx.Err() != nil {
				return nil
			}
			var cycle time.Duration
			if !last.IsZero() {
				cycle = start.Sub(last)
			}
			pace.Observe(len(recs), cycle, time.Since(start))
			last = start
		}
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			if n := len(fp.Records); n > 0 {
				lag := fp.HighWatermark - fp.Records[n-1].Offset - 1
				c.lag.WithLabelValues(strconv.Itoa(int(fp.Partition))).Set(float64(lag))
				c.mu.Lock()
				c.lags[fp.Partition] = lag
				c.mu.Unlock()
			}
		})
		cl.AllowRebalance()
		if c.cfg.Tick != nil {
			c.cfg.Tick(ctx)
		}
	}
}

// lingerStep is how often a lingering consumer looks for what arrived, and
// promptFetch how long it waits for the answer to the fetch that looks.
const (
	lingerStep  = 5 * time.Millisecond
	promptFetch = 2 * time.Millisecond
)

// linger takes more records after fs until the batch holds MaxBatch or d
// has passed, whichever comes first.
//
// It does not poll all the while: a poll returns with the first record
// committed, so polling through the wait would cost the broker and the
// consumer a fetch per record, and at light load a record is about a
// transaction. It sleeps instead, every lingerStep, while the records
// gather at the broker (the client holds one fetch's answer meanwhile,
// the records committed first), then takes that answer and the one of the
// next fetch, which the broker gives at once with what gathered: a few
// fetches per batch, whatever it holds.
func (c *Consumer) linger(ctx context.Context, cl *kgo.Client, fs kgo.Fetches, d time.Duration) kgo.Fetches {
	end := time.Now().Add(d)
	for fs.NumRecords() < c.cfg.MaxBatch {
		wait := min(time.Until(end), lingerStep)
		if wait <= 0 {
			break
		}
		select {
		case <-ctx.Done():
			return fs
		case <-time.After(wait):
		}
		if cl.BufferedFetchRecords() == 0 {
			continue // nothing committed since the last poll
		}
		for i := 0; i < 2; i++ { // what is held, then what gathered since
			n := fs.NumRecords()
			if n >= c.cfg.MaxBatch {
				break
			}
			pctx, cancel := context.WithTimeout(ctx, min(promptFetch, d))
			more := cl.PollRecords(pctx, c.cfg.MaxBatch-n)
			late := pctx.Err() != nil
			cancel()
			if more.NumRecords() == 0 && late {
				break // the wait is over: its context's error is no fetch error
			}
			fs = append(fs, more...)
		}
	}
	return fs
}

// startOffsets replaces the group's offsets with those stored in Postgres.
func (c *Consumer) startOffsets(ctx context.Context, in map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	stored, err := Offsets(ctx, c.cfg.DB, c.cfg.Consumer, c.cfg.Topic)
	if err != nil {
		return nil, err
	}
	c.joined.Store(true)
	out := map[string]map[int32]kgo.Offset{}
	for t, parts := range in {
		out[t] = map[int32]kgo.Offset{}
		for p := range parts {
			if o, ok := stored[p]; ok && t == c.cfg.Topic {
				out[t][p] = kgo.NewOffset().At(o).WithEpoch(-1)
			} else {
				out[t][p] = kgo.NewOffset().AtStart().WithEpoch(-1)
			}
		}
	}
	return out, nil
}
