// Package logsink is the skeleton of chatpipe's exactly-once consumers of
// the log (persist, projection): a read_committed consumer group member
// that keeps its offsets in Postgres, written in the same transaction as
// what it derives from the records, and starts from them — never from
// Kafka's committed group offsets.
package logsink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Querier is what reading offsets needs: a pool, a connection or a tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

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

// StoreOffsets records, inside tx, the next offset of each partition the
// records came from. Offsets only move forward.
func StoreOffsets(ctx context.Context, tx pgx.Tx, consumer, topic string, recs []*kgo.Record) error {
	next := NextOffsets(recs)
	parts, offs := make([]int32, 0, len(next)), make([]int64, 0, len(next))
	for p, n := range next {
		parts, offs = append(parts, p), append(offs, n)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO consumer_offsets (consumer, topic, log_partition, next_offset)
		SELECT $1, $2, p, o FROM unnest($3::int[], $4::bigint[]) AS t(p, o)
		ON CONFLICT (consumer, topic, log_partition) DO UPDATE
		SET next_offset = GREATEST(consumer_offsets.next_offset, EXCLUDED.next_offset), updated_at = now()`,
		consumer, topic, parts, offs); err != nil {
		return fmt.Errorf("store %s offsets: %w", consumer, err)
	}
	return nil
}

// NextOffsets is, per partition, the offset after the last of recs.
func NextOffsets(recs []*kgo.Record) map[int32]int64 {
	next := map[int32]int64{}
	for _, r := range recs {
		next[r.Partition] = r.Offset + 1
	}
	return next
}

// Config configures a Consumer.
type Config struct {
	Brokers  []string
	Topic    string
	Group    string
	Consumer string // its name in consumer_offsets
	DB       Querier
	MaxBatch int
	Log      *slog.Logger
	// Handle applies one poll's records (of Topic, in offset order per
	// partition) and stores their offsets, in one Postgres transaction. An
	// error is retried with backoff until ctx ends.
	Handle func(ctx context.Context, recs []*kgo.Record) error
	// Tick, if set, runs after every poll (housekeeping).
	Tick func(ctx context.Context)
}

// Consumer runs Config.Handle over the log and tracks its lag.
type Consumer struct {
	cfg    Config
	lag    *prometheus.GaugeVec
	joined atomic.Bool
	mu     sync.Mutex
	lags   map[int32]int64
}

// New returns a consumer whose lag gauge is named lagMetric.
func New(cfg Config, lagMetric, lagHelp string) *Consumer {
	return &Consumer{cfg: cfg, lags: map[int32]int64{},
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: lagMetric, Help: lagHelp}, []string{"partition"})}
}

// LagGauge is the lag metric.
func (c *Consumer) LagGauge() prometheus.Collector { return c.lag }

// CaughtUp reports whether the consumer has joined its group and no
// partition lagged by more than maxLag records at its last fetch.
func (c *Consumer) CaughtUp(maxLag int64) error {
	if !c.joined.Load() {
		return errors.New("not in the consumer group yet")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for part, lag := range c.lags {
		if lag > maxLag {
			return fmt.Errorf("partition %d lags by %d records", part, lag)
		}
	}
	return nil
}

// Run consumes until ctx ends. A batch in hand when ctx ends is finished or
// rolled back as a whole.
func (c *Consumer) Run(ctx context.Context) error {
	cl, err := kgo.NewClient(
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
	)
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

func (c *Consumer) handleRetrying(ctx context.Context, recs []*kgo.Record) {
	backoff := 100 * time.Millisecond
	for {
		err := c.cfg.Handle(ctx, recs)
		if err == nil || ctx.Err() != nil {
			return
		}
		c.cfg.Log.Warn("batch failed; retrying", "consumer", c.cfg.Consumer, "records", len(recs), "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
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
