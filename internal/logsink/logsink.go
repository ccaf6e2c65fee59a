// Package logsink is the skeleton of chatpipe's exactly-once consumers of
// the log (persist, projection): a read_committed consumer group member
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
//     offset moving past it. The partition moves on;
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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/logrecord"
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

// PersistConsumer is persist's name in consumer_offsets and dead_letters:
// the projection waits for its offsets, a shard writer reads them and its
// dead letters, and the run checks wait for it.
const PersistConsumer = "persist"

// Offsets reads a consumer's stored next offset of each partition of topic.
func Offsets(ctx context.Context, q Querier, consumer, topic string) (map[int32]int64, error) {
	rows, err := q.Query(ctx, `SELECT log_partition, next_offset FROM consumer_offsets WHERE consumer = $1 AND topic = $2`, consumer, topic)
	if err != nil {
		return nil, fmt.Errorf("read %s offsets: %w", consumer, err)
	}
	out := map[int32]int64{}
	var part int32
	var off int64
	if _, err := pgx.ForEachRow(rows, []any{&part, &off}, func() error { out[part] = off; return nil }); err != nil {
		return nil, fmt.Errorf("read %s offsets: %w", consumer, err)
	}
	return out, nil
}

// Offset reads a consumer's stored next offset of one partition of topic;
// ok is false when the consumer has stored none there yet.
func Offset(ctx context.Context, q Querier, consumer, topic string, part int32) (off int64, ok bool, err error) {
	rows, err := q.Query(ctx, `SELECT next_offset FROM consumer_offsets WHERE consumer = $1 AND topic = $2 AND log_partition = $3`, consumer, topic, part)
	if err != nil {
		return 0, false, fmt.Errorf("read %s offset: %w", consumer, err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&off}, func() error { ok = true; return nil }); err != nil {
		return 0, false, fmt.Errorf("read %s offset: %w", consumer, err)
	}
	return off, ok, nil
}

// StoredOffset is one row of consumer_offsets.
type StoredOffset struct {
	Consumer   string
	Partition  int32
	NextOffset int64
	UpdatedAt  time.Time
}

// AllOffsets reads every consumer's stored offsets of topic, ordered by
// consumer and partition.
func AllOffsets(ctx context.Context, q Querier, topic string) ([]StoredOffset, error) {
	rows, err := q.Query(ctx, `SELECT consumer, log_partition, next_offset, updated_at FROM consumer_offsets WHERE topic = $1 ORDER BY consumer, log_partition`, topic)
	if err != nil {
		return nil, fmt.Errorf("read consumer offsets: %w", err)
	}
	var out []StoredOffset
	var o StoredOffset
	if _, err := pgx.ForEachRow(rows, []any{&o.Consumer, &o.Partition, &o.NextOffset, &o.UpdatedAt}, func() error { out = append(out, o); return nil }); err != nil {
		return nil, fmt.Errorf("read consumer offsets: %w", err)
	}
	return out, nil
}

// storeOffsetsSQL moves a consumer's stored next offsets forward, never
// back: $3 and $4 are the partitions and their next offsets.
//
// It is the first statement of every transaction that writes a
// consumer's records (a batch, a dead letter), and it locks the rows it
// upserts, in partition order, until the commit: an existing row by its
// update, a missing one by its insert, which another transaction's
// uncommitted insert of the same key makes wait for that transaction. Two
// members of a group can write one partition at once for a while (one was
// dropped from the group for a slow batch and is still writing it).
// Without the lock the second one's statements would run on a snapshot
// that misses the first one's rows while its inserts wait for them, and
// persist would record its replay as a seq conflict. With it, the second
// batch waits for the first to commit and then sees its rows, whether or
// not the partition had a stored offset before (a SELECT … FOR UPDATE
// would lock only rows that exist, and so not a partition's first batch).
const storeOffsetsSQL = `INSERT INTO consumer_offsets (consumer, topic, log_partition, next_offset)
		SELECT $1, $2, p, o FROM unnest($3::int[], $4::bigint[]) AS t(p, o) ORDER BY p
		ON CONFLICT (consumer, topic, log_partition) DO UPDATE
		SET next_offset = GREATEST(consumer_offsets.next_offset, EXCLUDED.next_offset), updated_at = now()`

// storeOffsets records, inside tx, the next offset of each partition the
// records came from. Offsets only move forward.
func storeOffsets(ctx context.Context, tx pgx.Tx, consumer, topic string, recs []*kgo.Record) error {
	parts, offs := nextOffsetArrays(recs)
	if _, err := tx.Exec(ctx, storeOffsetsSQL, consumer, topic, parts, offs); err != nil {
		return fmt.Errorf("store %s offsets: %w", consumer, err)
	}
	return nil
}

// queueOffsets queues on b the statement storeOffsets runs, so that it goes
// to Postgres with the rest of a batch (see commit), ahead of the batch's
// other statements (see storeOffsetsSQL); read its result with execOffsets.
// parts and offs are nextOffsetArrays of the batch's records.
func queueOffsets(b *pgx.Batch, consumer, topic string, parts []int32, offs []int64) {
	b.Queue(storeOffsetsSQL, consumer, topic, parts, offs)
}

// execOffsets reads the result of the statement queueOffsets queued, which
// must be the next result of br.
func execOffsets(br pgx.BatchResults, consumer string) error {
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("store %s offsets: %w", consumer, err)
	}
	return nil
}

// nextOffsetArrays is NextOffsets as the two arrays storeOffsetsSQL takes.
// recs are in offset order per partition, usually of one partition or few,
// so a short scan finds a partition's slot without a map.
func nextOffsetArrays(recs []*kgo.Record) ([]int32, []int64) {
	var parts []int32
	var offs []int64
	for _, r := range recs {
		i := len(parts) - 1
		for i >= 0 && parts[i] != r.Partition {
			i--
		}
		if i < 0 {
			parts, offs = append(parts, r.Partition), append(offs, 0)
			i = len(parts) - 1
		}
		offs[i] = r.Offset + 1
	}
	return parts, offs
}

// commit runs the statements queued on b as one Postgres transaction, in
// one round trip, and gives their results to read, which must read them in
// order and return the first error. Nothing of b is written unless all of
// it is.
//
// pgx sends a batch as one pipeline ended by a single Sync, and Postgres
// runs the statements of a pipeline up to its Sync as one implicit
// transaction: committed at the Sync if every statement succeeded, rolled
// back (and the statements after a failed one skipped) otherwise. So b must
// not hold BEGIN, COMMIT or a statement that cannot run in a transaction.
// The server commits whatever the client does with the results, so read
// must not fail on results that are fine: an error it makes up is returned
// after the commit (a replay of the records must then be harmless, as it
// must be for a lost connection during a commit anyway).
//
// hold > 0 (fault tests only) runs b in an explicit transaction instead and
// holds it open that long before its commit, so that a kill lands inside it.
func commit(ctx context.Context, db DB, b *pgx.Batch, hold time.Duration, read func(br pgx.BatchResults) error) error {
	if hold > 0 {
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if err := readBatch(tx.SendBatch(ctx, b), read); err != nil {
				return err
			}
			time.Sleep(hold)
			return nil
		})
	}
	return readBatch(db.SendBatch(ctx, b), read)
}

// readBatch reads br with read and closes it; the first error wins.
func readBatch(br pgx.BatchResults, read func(br pgx.BatchResults) error) error {
	err := read(br)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("batch: %w", cerr)
	}
	return err
}

// NextOffsets is, per partition, the offset after the last of recs.
func NextOffsets(recs []*kgo.Record) map[int32]int64 {
	next := map[int32]int64{}
	for _, r := range recs {
		next[r.Partition] = r.Offset + 1
	}
	return next
}

// maxPayload keeps an announcement under Postgres's 8000-byte NOTIFY
// payload limit: a larger one is sent empty.
const maxPayload = 7000

// AnnouncePayload is the payload a batch of recs (of topic) is announced
// with: "topic p:o,p:o…", the next offset it stored for each partition of
// the batch ("" when it would not fit a notification). A listener may
// take those offsets as stored: the notification is delivered only once
// the transaction that stored them committed.
func AnnouncePayload(topic string, recs []*kgo.Record) string {
	parts, offs := nextOffsetArrays(recs)
	b := make([]byte, 0, len(topic)+1+len(parts)*12)
	b = append(b, topic...)
	b = append(b, ' ')
	for i, p := range parts {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(p), 10)
		b = append(b, ':')
		b = strconv.AppendInt(b, offs[i], 10)
	}
	if len(b) > maxPayload {
		return ""
	}
	return string(b)
}

// ParseAnnounce reads an AnnouncePayload of topic: the stored next offset
// of each partition it names (nil for another topic, an empty or an
// unreadable payload).
func ParseAnnounce(topic, payload string) map[int32]int64 {
	t, rest, ok := strings.Cut(payload, " ")
	if !ok || t != topic || rest == "" {
		return nil
	}
	out := map[int32]int64{}
	for _, kv := range strings.Split(rest, ",") {
		k, v, ok := strings.Cut(kv, ":")
		p, err1 := strconv.ParseInt(k, 10, 32)
		o, err2 := strconv.ParseInt(v, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			return nil
		}
		out[int32(p)] = max(out[int32(p)], o)
	}
	return out
}

// Config configures a Consumer.
type Config struct {
	Brokers  []string
	Topic    string
	Group    string
	Consumer string // its name in consumer_offsets and dead_letters
	DB       DB
	MaxBatch int
	Log      *slog.Logger
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
	// offsets stored as its payload: AnnouncePayload). A dead letter's
	// transaction is not announced.
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
	// MaxDeadLetters caps the records dead-lettered in any minute (default
	// 100; negative: no cap). Past it the fault is taken for systemic (a
	// writer or schema bug, not one bad record): the consumer stops at the
	// record, as for a newer version, rather than set the log aside.
	MaxDeadLetters int

	// KafkaOpts are appended to the consumer's options (TLS, SASL).
	KafkaOpts []kgo.Opt
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

// CountDeadLetters counts consumer's rows in dead_letters.
func CountDeadLetters(ctx context.Context, q Querier, consumer string) (int64, error) {
	rows, err := q.Query(ctx, `SELECT count(*) FROM dead_letters WHERE consumer = $1`, consumer)
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
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.AdjustFetchOffsetsFn(c.startOffsets),
	)...)
	if err != nil {
		return fmt.Errorf("%s: consumer: %w", c.cfg.Consumer, err)
	}
	defer cl.Close()
	defer cl.AllowRebalance() // Close leaves the group, which a blocked rebalance would stall
	for {
		fs := cl.PollRecords(ctx, c.cfg.MaxBatch)
		if ctx.Err() != nil {
			return nil
		}
		for _, e := range fs.Errors() {
			c.cfg.Log.Warn("fetch error", "consumer", c.cfg.Consumer, "topic", e.Topic, "partition", e.Partition, "err", e.Err)
		}
		if recs := fs.Records(); len(recs) > 0 {
			c.handleRetrying(ctx, recs)
			if ctx.Err() != nil {
				return nil
			}
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

// errClass is what a failed batch leads to.
type errClass int

const (
	transient errClass = iota // retry until it works
	permanent                 // isolate the culprits, dead-letter them
	halt                      // stop here until this build is upgraded
)

func (k errClass) String() string {
	return [...]string{"transient", "permanent", "halt"}[k]
}

// classify tells what err, returned by Write (by Handle or by reading the
// batch's results), leads to, and its SQLSTATE if Postgres raised it.
//
// Permanent are the errors the same records will always cause again: class
// 22 (data exception: invalid byte sequence, value out of range, bad
// datetime, …) and class 54 (program limit exceeded: an index row or array
// too large, too many arguments — bisecting also cures a batch that was
// merely too big), and records no version reads (logrecord.ErrMalformed).
// Everything else — lost connections, serialization failures and deadlocks
// (class 40), resource shortages (53), operator intervention (57), constraint
// violations (23, which the sinks' statements avoid by design, so one is a
// bug to fix, not data to drop) — is retried: stopping is safe, dropping is
// not.
func classify(err error) (errClass, string) {
	if errors.Is(err, logrecord.ErrUnsupportedVersion) {
		return halt, ""
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case strings.HasPrefix(pe.Code, "22"), strings.HasPrefix(pe.Code, "54"):
			return permanent, pe.Code
		}
		return transient, pe.Code
	}
	if errors.Is(err, logrecord.ErrMalformed) {
		return permanent, ""
	}
	return transient, ""
}

// permanentTries is how often a whole poll is tried with a permanent error
// before it is bisected (a part of it is split at its first).
const permanentTries = 3

func (c *Consumer) handleRetrying(ctx context.Context, recs []*kgo.Record) {
	_ = c.settle(ctx, recs, permanentTries, false)
}

// Settle writes recs (of Topic, in offset order per partition) through
// Handle as Run does — retrying transient errors, dead-lettering the records
// that can never be written — but returns an error at a record of a newer
// schema version instead of waiting there, and ctx's error if it ends.
// `chatpipe admin rebuild` uses it.
func (c *Consumer) Settle(ctx context.Context, recs []*kgo.Record) error {
	if len(recs) == 0 {
		return nil
	}
	if err := c.settle(ctx, recs, permanentTries, true); err != nil {
		return fmt.Errorf("%s: %w", c.cfg.Consumer, err)
	}
	return ctx.Err()
}

// Write runs Handle on recs once and commits what it queued together with
// the records' offsets, in one transaction and one round trip: an error
// leaves nothing written, and is neither retried nor dead-lettered (Settle
// does that).
func (c *Consumer) Write(ctx context.Context, recs []*kgo.Record) error {
	var b pgx.Batch
	parts, offs := nextOffsetArrays(recs)
	queueOffsets(&b, c.cfg.Consumer, c.cfg.Topic, parts, offs)
	q, err := c.cfg.Handle(ctx, &b, recs)
	if err != nil {
		return err
	}
	queued := b.Len() - 1
	if c.cfg.Announce != "" {
		b.Queue(`SELECT pg_notify($1, $2)`, c.cfg.Announce, AnnouncePayload(c.cfg.Topic, recs)) // delivered at commit
	}
	timeout := c.cfg.BatchTimeout
	if timeout <= 0 {
		timeout = DefaultBatchTimeout
	}
	cctx, cancel := context.WithTimeout(ctx, timeout+c.cfg.HoldBeforeCommit)
	defer cancel()
	err = commit(cctx, c.cfg.DB, &b, c.cfg.HoldBeforeCommit, func(br pgx.BatchResults) error {
		if err := execOffsets(br, c.cfg.Consumer); err != nil {
			return fmt.Errorf("%s: %w", c.cfg.Consumer, err)
		}
		if q.Read != nil {
			if err := q.Read(br); err != nil {
				return err
			}
		} else {
			for range queued {
				if _, err := br.Exec(); err != nil {
					return fmt.Errorf("%s: %w", c.cfg.Consumer, err)
				}
			}
		}
		if c.cfg.Announce != "" {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("%s: notify: %w", c.cfg.Consumer, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if q.Committed != nil {
		q.Committed()
	}
	return nil
}

// settle writes recs (Write) until they are all written or dead-lettered,
// or ctx ends. After tries permanent failures it splits recs in two halves
// and settles each in turn (order per partition is kept); a single record
// that fails permanently is dead-lettered. A halt is retried forever, or
// returned if haltReturns.
func (c *Consumer) settle(ctx context.Context, recs []*kgo.Record, tries int, haltReturns bool) error {
	backoff := 100 * time.Millisecond
	fails := 0
	for {
		err := c.Write(ctx, recs)
		if err == nil {
			c.setHalted(nil)
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		class, state := classify(err)
		first, last := recs[0], recs[len(recs)-1]
		switch class {
		case halt:
			if haltReturns {
				return err
			}
			c.setHalted(err)
			c.cfg.Log.Error("consumer stopped: a record of a newer schema version; upgrade this consumer (the record is not skipped)",
				"consumer", c.cfg.Consumer, "records", len(recs), "err", err)
		case permanent:
			if fails++; fails >= tries {
				if len(recs) == 1 {
					if now := time.Now(); c.deadLetterBudget(now) {
						c.recentDead = append(c.recentDead, now)
						c.deadLetter(ctx, recs[0], err, state)
						return nil
					}
					c.setHalted(fmt.Errorf("%w (record %d/%d: %w)", errTooManyDeadLetters, recs[0].Partition, recs[0].Offset, err))
					c.cfg.Log.Error("consumer stopped: too many records failed for good within a minute; fix the cause and restart it (nothing is skipped)",
						"consumer", c.cfg.Consumer, "partition", recs[0].Partition, "offset", recs[0].Offset, "sqlstate", state, "err", err)
					fails = 0 // retry the record, with backoff, until the cause is fixed
					break
				}
				c.cfg.Log.Warn("batch failed permanently; isolating the records that cannot be written",
					"consumer", c.cfg.Consumer, "records", len(recs), "sqlstate", state, "err", err)
				mid := len(recs) / 2
				if err := c.settle(ctx, recs[:mid], 1, haltReturns); err != nil || ctx.Err() != nil {
					return err
				}
				return c.settle(ctx, recs[mid:], 1, haltReturns)
			}
			c.cfg.Log.Warn("batch failed with a permanent error; retrying before isolating", "consumer", c.cfg.Consumer,
				"records", len(recs), "first", fmt.Sprintf("%d/%d", first.Partition, first.Offset),
				"last", fmt.Sprintf("%d/%d", last.Partition, last.Offset), "sqlstate", state, "err", err)
		default:
			c.cfg.Log.Warn("batch failed; retrying", "consumer", c.cfg.Consumer, "records", len(recs), "sqlstate", state, "err", err)
		}
		if !sleep(ctx, backoff) {
			return nil
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (c *Consumer) setHalted(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil && c.halted == nil {
		return
	}
	c.halted = err
	if err != nil {
		c.haltedGauge.Set(1)
	} else {
		c.haltedGauge.Set(0)
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// deadLetter writes r to dead_letters and moves the consumer's stored offset
// past it, in one transaction, retrying until that works or ctx ends.
func (c *Consumer) deadLetter(ctx context.Context, r *kgo.Record, cause error, sqlstate string) {
	var conv *string
	var seq *int64
	if e, err := logrecord.Unmarshal(r.Value); err == nil && e.HasSeq() {
		conv, seq = &e.ConversationID, &e.Seq
		if strings.ContainsRune(e.ConversationID, 0) || !utf8Valid(e.ConversationID) {
			conv = nil // not storable as text either
		}
	}
	var state *string
	if sqlstate != "" {
		state = &sqlstate
	}
	text := sanitize(cause.Error())
	backoff := 100 * time.Millisecond
	for {
		err := pgx.BeginFunc(ctx, c.cfg.DB, func(tx pgx.Tx) error {
			if err := storeOffsets(ctx, tx, c.cfg.Consumer, c.cfg.Topic, []*kgo.Record{r}); err != nil {
				return err // first: see storeOffsetsSQL
			}
			if _, err := tx.Exec(ctx, `INSERT INTO dead_letters (consumer, topic, log_partition, log_offset, conversation_id, seq,
				sqlstate, error, record_key, record_value) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
				ON CONFLICT DO NOTHING`,
				c.cfg.Consumer, r.Topic, r.Partition, r.Offset, conv, seq, state, text, r.Key, r.Value); err != nil {
				return fmt.Errorf("insert dead letter: %w", err)
			}
			return nil
		})
		if err == nil {
			c.deadLetters.Inc()
			c.dead.Add(1)
			c.cfg.Log.Error("DEAD LETTER: a record this consumer can never write was moved to dead_letters; the partition moves on",
				"consumer", c.cfg.Consumer, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
				"sqlstate", sqlstate, "err", cause)
			return
		}
		if ctx.Err() != nil {
			return
		}
		c.cfg.Log.Warn("writing a dead letter failed; retrying", "consumer", c.cfg.Consumer,
			"partition", r.Partition, "offset", r.Offset, "err", err)
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// sanitize makes s storable as Postgres text: valid UTF-8 without NUL.
func sanitize(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\ufffd"), "\x00", `\x00`)
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "") == s }

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
