// Package persist copies the committed log into Postgres, exactly once.
//
// It is a read_committed consumer group member. Each poll's records are
// written in one Postgres transaction together with the next offset of
// every partition they came from; on (re)assignment it starts from the
// offsets stored in Postgres, never from Kafka's committed group offsets.
// Inserts skip rows that exist (a replay after a crash); a row whose
// (conversation_id, seq) or (conversation_id, client_message_id) is taken by
// a different message is a broken invariant: it is counted, logged loudly
// and recorded in seq_conflicts, never overwritten.
//
// A record it can never write (Postgres refuses a value, e.g. a NUL byte in
// a body, or the record is not a record of any version) goes to
// dead_letters and the partition moves on; a record of a newer schema
// version stops it until it is upgraded (logsink decides both).
package persist

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/logsink"
)

// DefaultConsumer is persist's name in consumer_offsets.
const DefaultConsumer = "persist"

// Config configures a Persister.
type Config struct {
	Brokers  []string
	Topic    string
	Group    string // consumer group (default chatpipe-persist)
	Consumer string // name in consumer_offsets (default persist)
	DB       *pgxpool.Pool
	MaxBatch int // records per Postgres transaction (default 5000)
	Log      *slog.Logger

	KafkaOpts []kgo.Opt // appended to the consumer's options (TLS, SASL)
}

func (c *Config) validate() error {
	if len(c.Brokers) == 0 || c.DB == nil {
		return errors.New("persist: Brokers and DB are required")
	}
	if c.Topic == "" {
		c.Topic = logrecord.DefaultTopic
	}
	if c.Group == "" {
		c.Group = "chatpipe-persist"
	}
	if c.Consumer == "" {
		c.Consumer = DefaultConsumer
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 5000
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return nil
}

// Stats are the persister's counters.
type Stats struct {
	Batches   atomic.Int64
	Inserted  atomic.Int64
	Skipped   atomic.Int64 // rows already there with the same message_id
	Conflicts atomic.Int64 // broken invariants
}

// Persister is one member of the persist consumer group.
type Persister struct {
	cfg   Config
	stats Stats

	batchSize    prometheus.Histogram
	batchSeconds prometheus.Histogram
	consumer     *logsink.Consumer
}

// New returns a Persister; Run starts it.
func New(cfg Config) (*Persister, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	p := &Persister{cfg: cfg,
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "chatpipe_persist_batch_records",
			Help: "Records per Postgres transaction.", Buckets: prometheus.ExponentialBuckets(1, 2, 14)}),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "chatpipe_persist_batch_seconds",
			Help: "Time to write one batch (one Postgres transaction).", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
	}
	p.consumer = logsink.New(logsink.Config{Brokers: cfg.Brokers, KafkaOpts: cfg.KafkaOpts, Topic: cfg.Topic, Group: cfg.Group, Consumer: cfg.Consumer,
		DB: cfg.DB, MaxBatch: cfg.MaxBatch, Log: cfg.Log, Handle: p.handle},
		"chatpipe_persist", "Records of a partition not yet in Postgres, as of the last fetch.")
	return p, nil
}

// Stats returns the counters.
func (p *Persister) Stats() *Stats { return &p.stats }

// Degraded describes persist's dead letters, "" if there are none.
func (p *Persister) Degraded(ctx context.Context) string { return p.consumer.Degraded(ctx) }

// CaughtUp reports whether the persister has joined its group and no
// partition lagged by more than maxLag records at its last fetch.
func (p *Persister) CaughtUp(maxLag int64) error { return p.consumer.CaughtUp(maxLag) }

// Collectors returns the persister's Prometheus metrics.
func (p *Persister) Collectors() []prometheus.Collector {
	counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	return append([]prometheus.Collector{
		counter("chatpipe_persist_batches_total", "Postgres transactions written.", &p.stats.Batches),
		counter("chatpipe_persist_inserted_total", "Events inserted.", &p.stats.Inserted),
		counter("chatpipe_persist_skipped_total", "Events already stored (replayed after a restart).", &p.stats.Skipped),
		counter("chatpipe_persist_seq_conflicts_total", "Events whose seq or client_message_id is held by another message: broken invariants.", &p.stats.Conflicts),
		p.batchSize, p.batchSeconds,
	}, p.consumer.Collectors()...)
}

// Run consumes until ctx ends. A batch in hand when ctx ends is finished or
// rolled back as a whole.
func (p *Persister) Run(ctx context.Context) error { return p.consumer.Run(ctx) }

// handle writes one poll's records, timing it.
func (p *Persister) handle(ctx context.Context, recs []*kgo.Record) error {
	start := time.Now()
	if err := p.write(ctx, recs); err != nil {
		return err
	}
	p.batchSeconds.Observe(time.Since(start).Seconds())
	p.batchSize.Observe(float64(len(recs)))
	return nil
}

// insertSQL inserts a batch in one statement and returns every row it did
// not insert, with the message_id of the row holding its seq (NULL if none).
//
// An input row is identified by its log position, not by its
// (conversation_id, seq): two records of one batch with the same seq are
// two rows, one inserted and one returned. The statement's own inserts are
// not visible to its join with events (one snapshot), so the holder of a seq
// taken inside the batch comes from ins.
const insertSQL = `
WITH input AS (
  SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
                       $8::text[], $9::text[], $10::timestamptz[], $11::int[], $12::bigint[], $13::int[], $14::bigint[])
    AS t(conversation_id, seq, kind, message_id, client_message_id, sender, body, user_id, members, created_at,
         vshard, epoch, log_partition, log_offset)
), ins AS (
  INSERT INTO events (conversation_id, seq, kind, message_id, client_message_id, sender, body, user_id, members,
                      created_at, vshard, epoch, log_partition, log_offset)
  SELECT conversation_id, seq, kind, message_id, NULLIF(client_message_id, ''), sender, NULLIF(body, ''),
         NULLIF(user_id, ''), CASE WHEN members = '' THEN NULL ELSE string_to_array(members, ',') END,
         created_at, vshard, epoch, log_partition, log_offset
  FROM input
  ON CONFLICT DO NOTHING
  RETURNING conversation_id, seq, message_id, log_partition, log_offset
)
SELECT i.conversation_id, i.seq,
       coalesce(e.message_id, (SELECT ins.message_id FROM ins WHERE ins.conversation_id = i.conversation_id AND ins.seq = i.seq)),
       i.message_id, i.log_partition, i.log_offset
FROM input i
LEFT JOIN events e ON e.conversation_id = i.conversation_id AND e.seq = i.seq
WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.log_partition = i.log_partition AND ins.log_offset = i.log_offset)`

// Write stores records (of one topic, any partitions, in offset order per
// partition) and their partitions' next offsets in one transaction, as the
// consumer does with a batch; an error leaves nothing written.
func (p *Persister) Write(ctx context.Context, recs []*kgo.Record) error { return p.write(ctx, recs) }

// Settle writes records as the consumer does: transient errors retried,
// records that can never be written dead-lettered; a record of a newer
// schema version is an error. `chatpipe admin rebuild` uses it to rebuild a
// database from the log alone.
func (p *Persister) Settle(ctx context.Context, recs []*kgo.Record) error {
	return p.consumer.Settle(ctx, recs)
}

// DeadLetters is the number of records dead-lettered by this Persister.
func (p *Persister) DeadLetters() int64 { return p.consumer.DeadLettered() }

// write stores one poll's records and the partitions' next offsets in one
// transaction.
//
// ON CONFLICT DO NOTHING has no target on purpose: events has two unique
// keys and a clash on either must neither abort the batch (which would stall
// the partition forever) nor go unnoticed, so every row not inserted is
// compared with the row holding its (conversation_id, seq) and any
// difference is reported as a conflict.
func (p *Persister) write(ctx context.Context, recs []*kgo.Record) error {
	var cols struct {
		conv, kind, mid, cmid, sender, body, user, members []string
		seq, epoch, offset                                 []int64
		created                                            []time.Time
		vshard, part                                       []int32
	}
	for _, r := range recs {
		e, err := logrecord.Unmarshal(r.Value)
		if err != nil {
			// Never skipped: a newer version stops persist until it is
			// upgraded, a malformed record becomes a dead letter (logsink).
			return fmt.Errorf("persist: record at %d/%d: %w", r.Partition, r.Offset, err)
		}
		if e.Kind == logrecord.KindTakeover {
			continue
		}
		cols.conv = append(cols.conv, e.ConversationID)
		cols.seq = append(cols.seq, e.Seq)
		cols.kind = append(cols.kind, e.Kind)
		cols.mid = append(cols.mid, e.MessageID)
		cols.cmid = append(cols.cmid, e.ClientMessageID)
		cols.sender = append(cols.sender, e.Sender)
		cols.body = append(cols.body, e.Body)
		cols.user = append(cols.user, e.UserID)
		cols.members = append(cols.members, strings.Join(e.Members, ","))
		cols.created = append(cols.created, e.CreatedAt)
		cols.vshard = append(cols.vshard, int32(e.VShard))
		cols.epoch = append(cols.epoch, e.Epoch)
		cols.part = append(cols.part, r.Partition)
		cols.offset = append(cols.offset, r.Offset)
	}
	var skipped, conflicts int64
	err := pgx.BeginFunc(ctx, p.cfg.DB, func(tx pgx.Tx) error {
		skipped, conflicts = 0, 0
		if len(cols.conv) > 0 {
			rows, err := tx.Query(ctx, insertSQL, cols.conv, cols.seq, cols.kind, cols.mid, cols.cmid, cols.sender, cols.body,
				cols.user, cols.members, cols.created, cols.vshard, cols.epoch, cols.part, cols.offset)
			if err != nil {
				return fmt.Errorf("persist: insert: %w", err)
			}
			type conflict struct {
				conv     string
				seq      int64
				existing *string
				incoming string
				part     int32
				offset   int64
			}
			var cs []conflict
			var c conflict
			_, err = pgx.ForEachRow(rows, []any{&c.conv, &c.seq, &c.existing, &c.incoming, &c.part, &c.offset}, func() error {
				if c.existing != nil && *c.existing == c.incoming {
					skipped++ // already stored: a replay after a crash
					return nil
				}
				cs = append(cs, c)
				return nil
			})
			if err != nil {
				return fmt.Errorf("persist: insert: %w", err)
			}
			for _, c := range cs {
				p.cfg.Log.Error("BROKEN INVARIANT: a different message holds this conversation's seq or client_message_id; not overwritten",
					"conversation", c.conv, "seq", c.seq, "existing_message_id", c.existing, "incoming_message_id", c.incoming,
					"partition", c.part, "offset", c.offset)
				if _, err := tx.Exec(ctx, `INSERT INTO seq_conflicts (conversation_id, seq, existing_message_id, incoming_message_id, log_partition, log_offset)
					VALUES ($1, $2, $3, $4, $5, $6)`, c.conv, c.seq, c.existing, c.incoming, c.part, c.offset); err != nil {
					return fmt.Errorf("persist: record conflict: %w", err)
				}
			}
			conflicts = int64(len(cs))
		}
		if err := logsink.StoreOffsets(ctx, tx, p.cfg.Consumer, p.cfg.Topic, recs); err != nil {
			return fmt.Errorf("persist: %w", err)
		}
		if faultSleepBeforeCommit > 0 {
			time.Sleep(faultSleepBeforeCommit)
		}
		return nil
	})
	if err != nil {
		return err
	}
	p.stats.Batches.Add(1)
	p.stats.Inserted.Add(int64(len(cols.conv)) - skipped - conflicts)
	p.stats.Skipped.Add(skipped)
	p.stats.Conflicts.Add(conflicts)
	return nil
}
