// Package projection maintains the read model of the committed log in
// Postgres, exactly once: membership periods, each conversation's last seq
// and activity time (a user's conversation list), and the delivery outbox
// that tells gateways which events to push.
//
// It is a read_committed consumer group member like persist, with its own
// group and its own rows in consumer_offsets, written in the same
// transaction as the read model. It never gets ahead of persist: a batch is
// applied only once persist has stored every record in it, so a delivery
// row always names events that are already in Postgres (DESIGN rule 7), and
// sync and history, which never read past a conversation's projected
// last_seq, agree with the membership periods they check.
package projection

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
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/logrecord"
)

// Channel is the Postgres NOTIFY channel that announces a delivery row; the
// payload is its id.
const Channel = "chatpipe_delivery"

// Config configures a Projector.
type Config struct {
	Brokers  []string
	Topic    string
	Group    string // consumer group (default chatpipe-projection)
	Consumer string // name in consumer_offsets (default projection)
	After    string // consumer whose stored offsets this one waits for (default persist)
	DB       *pgxpool.Pool
	MaxBatch int           // records per transaction (default 5000)
	Retain   time.Duration // how long delivery rows are kept (default 1 h)
	Log      *slog.Logger
}

func (c *Config) validate() error {
	if len(c.Brokers) == 0 || c.DB == nil {
		return errors.New("projection: Brokers and DB are required")
	}
	if c.Topic == "" {
		c.Topic = logrecord.DefaultTopic
	}
	if c.Group == "" {
		c.Group = "chatpipe-projection"
	}
	if c.Consumer == "" {
		c.Consumer = "projection"
	}
	if c.After == "" {
		c.After = "persist"
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 5000
	}
	if c.Retain <= 0 {
		c.Retain = time.Hour
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return nil
}

// Projector is one member of the projection consumer group.
type Projector struct {
	cfg Config

	batches, events, memberOps, waits atomic.Int64
	batchSeconds                      prometheus.Histogram
	waitSeconds                       prometheus.Histogram
	lag                               *prometheus.GaugeVec
	polled                            atomic.Bool
	lagMu                             sync.Mutex
	lags                              map[int32]int64
}

// New returns a Projector; Run starts it.
func New(cfg Config) (*Projector, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Projector{cfg: cfg,
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "chatpipe_projection_batch_seconds",
			Help: "Time to apply one batch (one Postgres transaction), waiting for persist excluded.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		waitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "chatpipe_projection_persist_wait_seconds",
			Help: "Time a batch waited for persist to store its records.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "chatpipe_projection_lag_records",
			Help: "Records of a partition not yet projected, as of the last fetch."}, []string{"partition"}),
	}, nil
}

// Collectors returns the projector's Prometheus metrics.
func (p *Projector) Collectors() []prometheus.Collector {
	counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	return []prometheus.Collector{
		counter("chatpipe_projection_batches_total", "Postgres transactions written.", &p.batches),
		counter("chatpipe_projection_events_total", "Events applied.", &p.events),
		counter("chatpipe_projection_membership_changes_total", "Membership periods opened or closed.", &p.memberOps),
		counter("chatpipe_projection_persist_waits_total", "Batches that had to wait for persist.", &p.waits),
		p.batchSeconds, p.waitSeconds, p.lag,
	}
}

// CaughtUp reports whether the projector has joined its group and no
// partition lagged by more than maxLag records at its last fetch.
func (p *Projector) CaughtUp(maxLag int64) error {
	if !p.polled.Load() {
		return errors.New("not in the consumer group yet")
	}
	p.lagMu.Lock()
	defer p.lagMu.Unlock()
	for part, lag := range p.lags {
		if lag > maxLag {
			return fmt.Errorf("partition %d lags by %d records", part, lag)
		}
	}
	return nil
}

// Run consumes until ctx ends.
func (p *Projector) Run(ctx context.Context) error {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(p.cfg.Brokers...),
		kgo.ConsumerGroup(p.cfg.Group),
		kgo.SessionTimeout(10*time.Second),
		kgo.ConsumeTopics(p.cfg.Topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.AdjustFetchOffsetsFn(p.startOffsets),
	)
	if err != nil {
		return fmt.Errorf("projection: consumer: %w", err)
	}
	defer cl.Close()
	defer cl.AllowRebalance()
	lastClean := time.Time{}
	for {
		fs := cl.PollRecords(ctx, p.cfg.MaxBatch)
		if ctx.Err() != nil {
			return nil
		}
		for _, e := range fs.Errors() {
			p.cfg.Log.Warn("projection fetch error", "topic", e.Topic, "partition", e.Partition, "err", e.Err)
		}
		if recs := fs.Records(); len(recs) > 0 {
			if err := p.applyRetrying(ctx, recs); err != nil {
				return err
			}
		}
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			if n := len(fp.Records); n > 0 {
				lag := fp.HighWatermark - fp.Records[n-1].Offset - 1
				p.lag.WithLabelValues(strconv.Itoa(int(fp.Partition))).Set(float64(lag))
				p.lagMu.Lock()
				if p.lags == nil {
					p.lags = map[int32]int64{}
				}
				p.lags[fp.Partition] = lag
				p.lagMu.Unlock()
			}
		})
		cl.AllowRebalance()
		if time.Since(lastClean) > time.Minute {
			lastClean = time.Now()
			if _, err := p.cfg.DB.Exec(ctx, `DELETE FROM delivery_outbox WHERE created_at < now() - $1::interval`,
				strconv.FormatInt(int64(p.cfg.Retain/time.Second), 10)+" seconds"); err != nil && ctx.Err() == nil {
				p.cfg.Log.Warn("projection: trimming the delivery outbox failed", "err", err)
			}
		}
	}
}

// startOffsets replaces the group's offsets with those stored in Postgres.
func (p *Projector) startOffsets(ctx context.Context, in map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	stored, err := p.offsets(ctx, p.cfg.DB, p.cfg.Consumer)
	if err != nil {
		return nil, err
	}
	p.polled.Store(true)
	out := map[string]map[int32]kgo.Offset{}
	for t, parts := range in {
		out[t] = map[int32]kgo.Offset{}
		for pt := range parts {
			if o, ok := stored[pt]; ok && t == p.cfg.Topic {
				out[t][pt] = kgo.NewOffset().At(o).WithEpoch(-1)
			} else {
				out[t][pt] = kgo.NewOffset().AtStart().WithEpoch(-1)
			}
		}
	}
	return out, nil
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// offsets reads a consumer's stored next offsets for the topic.
func (p *Projector) offsets(ctx context.Context, q querier, consumer string) (map[int32]int64, error) {
	rows, err := q.Query(ctx, `SELECT log_partition, next_offset FROM consumer_offsets WHERE consumer = $1 AND topic = $2`, consumer, p.cfg.Topic)
	if err != nil {
		return nil, fmt.Errorf("projection: read %s offsets: %w", consumer, err)
	}
	out := map[int32]int64{}
	var part int32
	var off int64
	if _, err := pgx.ForEachRow(rows, []any{&part, &off}, func() error { out[part] = off; return nil }); err != nil {
		return nil, fmt.Errorf("projection: read %s offsets: %w", consumer, err)
	}
	return out, nil
}

// applyRetrying waits for persist, then applies a batch, retrying while
// Postgres is unavailable.
func (p *Projector) applyRetrying(ctx context.Context, recs []*kgo.Record) error {
	next := map[int32]int64{}
	for _, r := range recs {
		next[r.Partition] = r.Offset + 1
	}
	backoff := 100 * time.Millisecond
	for {
		err := p.waitForPersist(ctx, next)
		if err == nil {
			start := time.Now()
			if err = p.apply(ctx, recs, next); err == nil {
				p.batchSeconds.Observe(time.Since(start).Seconds())
				return nil
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		p.cfg.Log.Warn("projection batch failed; retrying", "records", len(recs), "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// waitForPersist returns once persist's stored offsets reach next for every
// partition of the batch.
func (p *Projector) waitForPersist(ctx context.Context, next map[int32]int64) error {
	start := time.Now()
	waited := false
	delay := 2 * time.Millisecond
	for {
		have, err := p.offsets(ctx, p.cfg.DB, p.cfg.After)
		if err != nil {
			return err
		}
		behind := false
		for part, n := range next {
			if have[part] < n {
				behind = true
				break
			}
		}
		if !behind {
			if waited {
				p.waits.Add(1)
				p.waitSeconds.Observe(time.Since(start).Seconds())
			}
			return nil
		}
		waited = true
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(delay*2, 50*time.Millisecond)
	}
}

// apply writes one batch's read-model changes, its delivery row and the
// partitions' next offsets in one transaction.
func (p *Projector) apply(ctx context.Context, recs []*kgo.Record, next map[int32]int64) error {
	events := make([]*logrecord.Event, 0, len(recs))
	for _, r := range recs {
		e, err := logrecord.Unmarshal(r.Value)
		if err != nil {
			p.cfg.Log.Error("projection: skipping a record that does not decode", "partition", r.Partition, "offset", r.Offset, "err", err)
			continue
		}
		events = append(events, e)
	}
	plan := PlanBatch(events)
	parts, offs := make([]int32, 0, len(next)), make([]int64, 0, len(next))
	for pt, n := range next {
		parts, offs = append(parts, pt), append(offs, n)
	}
	err := pgx.BeginFunc(ctx, p.cfg.DB, func(tx pgx.Tx) error {
		if len(plan.Members) > 0 {
			var b pgx.Batch
			for _, m := range plan.Members {
				if m.Join {
					b.Queue(`INSERT INTO memberships (conversation_id, user_id, joined_seq) VALUES ($1, $2, $3)
						ON CONFLICT DO NOTHING`, m.Conv, m.User, m.Seq)
				} else {
					b.Queue(`UPDATE memberships SET left_seq = $3
						WHERE conversation_id = $1 AND user_id = $2 AND left_seq IS NULL AND joined_seq < $3`, m.Conv, m.User, m.Seq)
				}
			}
			if err := tx.SendBatch(ctx, &b).Close(); err != nil {
				return fmt.Errorf("projection: memberships: %w", err)
			}
		}
		if len(plan.Convs) > 0 {
			convs := make([]string, len(plan.Convs))
			from, to := make([]int64, len(plan.Convs)), make([]int64, len(plan.Convs))
			at := make([]time.Time, len(plan.Convs))
			for i, c := range plan.Convs {
				convs[i], from[i], to[i], at[i] = c.Conv, c.From, c.To, c.LastAt
			}
			if _, err := tx.Exec(ctx, `INSERT INTO conversations (conversation_id, last_seq, last_activity_at)
				SELECT * FROM unnest($1::text[], $2::bigint[], $3::timestamptz[])
				ON CONFLICT (conversation_id) DO UPDATE
				SET last_seq = GREATEST(conversations.last_seq, EXCLUDED.last_seq),
				    last_activity_at = GREATEST(conversations.last_activity_at, EXCLUDED.last_activity_at)`,
				convs, to, at); err != nil {
				return fmt.Errorf("projection: conversations: %w", err)
			}
			// The counter row stays locked until commit: ids are gap-free
			// and visible in id order.
			var id int64
			if err := tx.QueryRow(ctx, `UPDATE delivery_counter SET last_id = last_id + 1 RETURNING last_id`).Scan(&id); err != nil {
				return fmt.Errorf("projection: delivery counter: %w", err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO delivery_outbox (id, conversation_ids, from_seqs, to_seqs) VALUES ($1, $2, $3, $4)`,
				id, convs, from, to); err != nil {
				return fmt.Errorf("projection: delivery row: %w", err)
			}
			if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, Channel, strconv.FormatInt(id, 10)); err != nil {
				return fmt.Errorf("projection: notify: %w", err)
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO consumer_offsets (consumer, topic, log_partition, next_offset)
			SELECT $1, $2, p, o FROM unnest($3::int[], $4::bigint[]) AS t(p, o)
			ON CONFLICT (consumer, topic, log_partition) DO UPDATE
			SET next_offset = GREATEST(consumer_offsets.next_offset, EXCLUDED.next_offset), updated_at = now()`,
			p.cfg.Consumer, p.cfg.Topic, parts, offs); err != nil {
			return fmt.Errorf("projection: store offsets: %w", err)
		}
		if faultSleepBeforeCommit > 0 {
			time.Sleep(faultSleepBeforeCommit)
		}
		return nil
	})
	if err != nil {
		return err
	}
	p.batches.Add(1)
	p.events.Add(int64(len(events)))
	p.memberOps.Add(int64(len(plan.Members)))
	return nil
}
