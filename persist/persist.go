// Package persist copies the committed log into Postgres, exactly once:
// its events, and the read model they make (package projection).
//
// It is a read_committed consumer group member. Each poll's records are
// written in one Postgres transaction together with their read-model
// changes and the next offset of every partition they came from; on
// (re)assignment it starts from the offsets stored in Postgres, never from
// Kafka's committed group offsets.
// Inserts skip rows that exist (a replay after a crash); a row whose
// (conversation_id, seq) or (conversation_id, client_message_id) is taken by
// a different message is a broken invariant: it is counted, logged loudly
// and recorded in seq_conflicts, never overwritten.
//
// A record it can never write (Postgres refuses a value, e.g. a NUL byte in
// a body, or the record is not a record of any version) goes to
// dead_letters and the partition moves on, with what can be written of it:
// its read-model changes (a kick whose row cannot be stored still ends the
// membership), else its event row. A record of a newer schema version stops
// it until it is upgraded (logsink decides both).
package persist

import (
	"context"
	"encoding/json"
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

	"github.com/chatpipe/chatpipe/internal/logsink"
	"github.com/chatpipe/chatpipe/internal/pglisten"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/projection"
)

// Config configures a Persister.
type Config struct {
	Brokers  []string
	Topic    string
	Group    string // consumer group (default chatpipe-persist)
	Consumer string // name in consumer_offsets (default persist)
	DB       *pgxpool.Pool
	MaxBatch int // records per Postgres transaction (default 5000)
	// Pace is the consumer's group commit (logsink.Pace; zero: defaults).
	Pace   logsink.Pace
	Retain time.Duration // how long delivery rows are kept (default projection.DefaultRetain)
	Log    *slog.Logger

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
		c.Consumer = logsink.PersistConsumer
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 5000
	}
	if c.Retain <= 0 {
		c.Retain = projection.DefaultRetain
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return nil
}

// writes is what a Persister writes of each batch.
type writes int

const (
	writeAll       writes = iota // event rows and read model (persist)
	writeEvents                  // event rows alone (a rebuild's first pass)
	writeReadModel               // the read model alone (a rebuild's second pass)
)

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
	readModel    *projection.ReadModel
	writes       writes // what a batch writes: everything, except in a rebuild's passes

	// analyzeAt are the counts of events stored at which the tables'
	// statistics are refreshed (analyzeAt, the default); analyzed, how
	// many of them have been reached (only the consumer's goroutine, in
	// its Tick, touches it). Each count reached is handed to Run's
	// analyzer on toAnalyze, so the consumer writes on meanwhile.
	analyzeAt []int64
	analyzed  int
	toAnalyze chan int64
}

// analyzeAt are the counts of events a Persister has stored since it
// started at which it ANALYZEs the tables it writes. A young database's
// tables grow from empty far faster than autovacuum, which looks once a
// minute by default, analyzes them: until it does, Postgres plans the
// writers' lookups, the delivery feed's reads and persist's own statements
// for empty tables (scanning what has grown since), and keeps a cached
// generic plan made then. Each ANALYZE also drops such plans. Past the last
// count a table holds enough rows that its plans no longer change as it
// grows, and autovacuum keeps its statistics. On an established database
// they are a few small samples once per start.
var analyzeAt = []int64{1000, 4000, 16000, 64000}

// analyzeSQL refreshes the statistics of the tables that grow with the log
// and that the writers, the delivery feed and persist query, from a small
// sample (statistics target 10, 3,000 rows a table, instead of 100): the
// plans of a young table need its size and its keys' spread, not fine
// histograms, and autovacuum's later ANALYZEs take the full sample.
const analyzeSQL = "SET LOCAL default_statistics_target = 10; ANALYZE events, memberships, conversations, delivery_outbox, read_markers"

// New returns a Persister; Run starts it.
func New(cfg Config) (*Persister, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return newPersister(cfg, cfg.DB, faultSleepBeforeCommit, writeAll), nil
}

// newPersister is New on a validated cfg, writing through db (cfg.DB, or a
// stand-in in tests) with each transaction held open hold before its
// commit (fault tests), writing w of each batch.
func newPersister(cfg Config, db logsink.DB, hold time.Duration, w writes) *Persister {
	p := &Persister{cfg: cfg, readModel: projection.New(), writes: w, analyzeAt: analyzeAt, toAnalyze: make(chan int64, 1),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "chatpipe_persist_batch_records",
			Help: "Records per Postgres transaction.", Buckets: prometheus.ExponentialBuckets(1, 2, 14)}),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "chatpipe_persist_batch_seconds",
			Help: "Time to write one batch (one Postgres transaction).", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
	}
	var salvage []logsink.Salvage // a rebuild's pass writes one part only: nothing else to salvage
	if w == writeAll {
		salvage = []logsink.Salvage{{What: "its read-model changes", Handle: p.readModel.Handle}, {What: "its event row", Handle: p.handleEvents}}
	}
	// Shard writers take what is announced on pglisten.Persisted for
	// persist's offsets: a consumer storing its own (a rebuild's first
	// pass) announces nothing.
	announce := pglisten.Persisted
	if cfg.Consumer != logsink.PersistConsumer {
		announce = ""
	}
	p.consumer = logsink.New(logsink.Config{Brokers: cfg.Brokers, KafkaOpts: cfg.KafkaOpts, Topic: cfg.Topic, Group: cfg.Group, Consumer: cfg.Consumer,
		DB: db, MaxBatch: cfg.MaxBatch, Pace: cfg.Pace, Log: cfg.Log, Handle: p.handle, Tick: p.tick,
		Salvage:  salvage,
		Announce: announce, HoldBeforeCommit: hold},
		"chatpipe_persist", "Records of a partition not yet in Postgres (events and read model), as of the last fetch.")
	return p
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
	}, append(p.consumer.Collectors(), p.readModel.Collectors()...)...)
}

// tick is the consumer's housekeeping after each poll: it deletes delivery
// rows older than Retain, once a minute (between batches, so it is bounded
// as a batch is: a Postgres that stops answering holds the consumer no
// longer than a batch would), and hands Run's analyzer the events stored
// when they pass the next of analyzeAt.
func (p *Persister) tick(ctx context.Context) {
	tctx, cancel := context.WithTimeout(ctx, logsink.DefaultBatchTimeout)
	defer cancel()
	if err := p.readModel.Trim(tctx, p.cfg.DB, p.cfg.Retain); err != nil && ctx.Err() == nil {
		p.cfg.Log.Warn("persist: trimming the delivery outbox failed", "err", err)
	}
	stored, reached := p.stats.Inserted.Load(), p.analyzed
	for p.analyzed < len(p.analyzeAt) && stored >= p.analyzeAt[p.analyzed] {
		p.analyzed++
	}
	if p.analyzed == reached {
		return
	}
	select {
	case p.toAnalyze <- stored:
	default: // one is waiting or under way: it serves this count too
	}
}

// analyze ANALYZEs the young tables (analyzeSQL) on a connection of its
// own, bounded as a batch is. A failure is logged and waits for the next
// count; a role that does not own the tables gets Postgres' warning, and
// autovacuum's statistics.
func (p *Persister) analyze(ctx context.Context, stored int64) {
	actx, cancel := context.WithTimeout(ctx, logsink.DefaultBatchTimeout)
	defer cancel()
	start := time.Now()
	// Two statements in one simple-protocol query run in one transaction,
	// which SET LOCAL needs.
	if _, err := p.cfg.DB.Exec(actx, analyzeSQL, pgx.QueryExecModeSimpleProtocol); err != nil {
		if ctx.Err() == nil {
			p.cfg.Log.Warn("persist: analyzing the young tables failed", "events_stored", stored, "err", err)
		}
		return
	}
	p.cfg.Log.Info("persist: analyzed the young tables", "events_stored", stored, "took", time.Since(start).Round(time.Millisecond))
}

// Run consumes until ctx ends. A batch in hand when ctx ends is finished or
// rolled back as a whole. Beside the consumer it runs the analyzer, which
// ANALYZEs the young tables (analyzeAt) while batches go on.
func (p *Persister) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	analyzed := make(chan struct{})
	go func() {
		defer close(analyzed)
		for {
			select {
			case <-ctx.Done():
				return
			case stored := <-p.toAnalyze:
				p.analyze(ctx, stored)
			}
		}
	}()
	err := p.consumer.Run(ctx)
	cancel()
	<-analyzed
	return err
}

// insertSQL inserts a batch in one statement, records in seq_conflicts
// every row it did not insert that a different message holds (once: a
// record stored again, after a crash, is not recorded again), and returns
// every row it did not insert with the message_id of the row holding its seq
// (NULL if none).
//
// An input row is identified by its log position, not by its
// (conversation_id, seq): two records of one batch with the same seq are
// two rows, one inserted and one returned. The statement's own inserts are
// not visible to its join with events (one snapshot), so the holder of a seq
// taken inside the batch comes from ins.
const insertSQL = `
WITH input AS (
  SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
                       $8::text[], $9::text[], $10::timestamptz[], $11::int[], $12::bigint[], $13::int[], $14::bigint[],
                       $15::int[], $16::text[])
    AS t(conversation_id, seq, kind, message_id, client_message_id, sender, body, user_id, members, created_at,
         vshard, epoch, log_partition, log_offset, to_vshard, verdicts)
), ins AS (
  INSERT INTO events (conversation_id, seq, kind, message_id, client_message_id, sender, body, user_id, members,
                      created_at, vshard, epoch, log_partition, log_offset, to_vshard, verdicts)
  SELECT conversation_id, seq, kind, message_id, NULLIF(client_message_id, ''), sender, NULLIF(body, ''),
         NULLIF(user_id, ''), CASE WHEN members = '' THEN NULL ELSE string_to_array(members, ',') END,
         created_at, vshard, epoch, log_partition, log_offset, NULLIF(to_vshard, -1), NULLIF(verdicts, '')::jsonb
  FROM input
  ON CONFLICT DO NOTHING
  RETURNING conversation_id, seq, message_id, log_partition, log_offset
), not_inserted AS (
  SELECT i.conversation_id, i.seq,
         coalesce(e.message_id, (SELECT ins.message_id FROM ins WHERE ins.conversation_id = i.conversation_id AND ins.seq = i.seq))
           AS existing_message_id,
         i.message_id AS incoming_message_id, i.log_partition, i.log_offset
  FROM input i
  LEFT JOIN events e ON e.conversation_id = i.conversation_id AND e.seq = i.seq
  WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.log_partition = i.log_partition AND ins.log_offset = i.log_offset)
), conflicts AS (
  INSERT INTO seq_conflicts (conversation_id, seq, existing_message_id, incoming_message_id, log_partition, log_offset)
  SELECT conversation_id, seq, existing_message_id, incoming_message_id, log_partition, log_offset
  FROM not_inserted n
  WHERE existing_message_id IS DISTINCT FROM incoming_message_id
    AND NOT EXISTS (SELECT 1 FROM seq_conflicts s WHERE s.log_partition = n.log_partition AND s.log_offset = n.log_offset)
)
SELECT conversation_id, seq, existing_message_id, incoming_message_id, log_partition, log_offset FROM not_inserted`

// Write stores records (of one topic, any partitions, in offset order per
// partition) and their partitions' next offsets in one transaction, as the
// consumer does with a batch; an error leaves nothing written.
func (p *Persister) Write(ctx context.Context, recs []*kgo.Record) error {
	return p.consumer.Write(ctx, recs)
}

// Settle writes records as the consumer does: transient errors retried,
// records that can never be written dead-lettered; a record of a newer
// schema version is an error. `chatpipe admin rebuild` uses it to rebuild a
// database from the log alone.
func (p *Persister) Settle(ctx context.Context, recs []*kgo.Record) error {
	return p.consumer.Settle(ctx, recs)
}

// handle queues one poll's rows and their read-model changes on b; logsink
// queues the partitions' next offsets before them and the announcement on
// pglisten.Persisted after them and sends it all as one transaction, in one
// round trip. Once it is committed, the rows are counted, the conflicts
// logged and the batch timed.
//
// ON CONFLICT DO NOTHING has no target on purpose: events has two unique
// keys and a clash on either must neither abort the batch (which would stall
// the partition forever) nor go unnoticed, so every row not inserted is
// compared with the row holding its (conversation_id, seq) and any
// difference is reported as a conflict.
func (p *Persister) handle(ctx context.Context, b *pgx.Batch, recs []*kgo.Record) (logsink.Queued, error) {
	switch p.writes {
	case writeEvents:
		return p.handleEvents(ctx, b, recs)
	case writeReadModel:
		return p.readModel.Handle(ctx, b, recs)
	}
	events, err := projection.Decode(recs)
	if err != nil {
		// Never skipped: a newer version stops persist until it is
		// upgraded, a malformed record becomes a dead letter (logsink).
		return logsink.Queued{}, fmt.Errorf("persist: %w", err)
	}
	rows, err := p.queueEvents(b, recs, events)
	if err != nil {
		return logsink.Queued{}, err
	}
	model := p.readModel.Queue(b, events)
	return logsink.Queued{
		Read: func(br pgx.BatchResults) error {
			if err := rows.Read(br); err != nil {
				return err
			}
			return model.Read(br)
		},
		Committed: func() { rows.Committed(); model.Committed() },
	}, nil
}

// handleEvents queues recs' event rows alone (a dead-lettered record's,
// when its read-model changes cannot be written).
func (p *Persister) handleEvents(_ context.Context, b *pgx.Batch, recs []*kgo.Record) (logsink.Queued, error) {
	events, err := projection.Decode(recs)
	if err != nil {
		return logsink.Queued{}, fmt.Errorf("persist: %w", err)
	}
	return p.queueEvents(b, recs, events)
}

// queueEvents queues the event rows of recs (decoded: events) on b.
func (p *Persister) queueEvents(b *pgx.Batch, recs []*kgo.Record, events []*logrecord.Event) (logsink.Queued, error) {
	start := time.Now()
	var cols columns
	if err := cols.decode(recs, events); err != nil {
		return logsink.Queued{}, err
	}
	if cols.len() > 0 {
		b.Queue(insertSQL, cols.conv, cols.seq, cols.kind, cols.mid, cols.cmid, cols.sender, cols.body,
			cols.user, cols.members, cols.created, cols.vshard, cols.epoch, cols.part, cols.offset, cols.to, cols.verdicts)
	}
	var skipped int64
	var cs []conflict
	read := func(br pgx.BatchResults) error {
		skipped, cs = 0, nil
		if cols.len() == 0 {
			return nil
		}
		rows, err := br.Query()
		if err != nil {
			return fmt.Errorf("persist: insert: %w", err)
		}
		var c conflict
		_, err = pgx.ForEachRow(rows, []any{&c.conv, &c.seq, &c.existing, &c.incoming, &c.part, &c.offset}, func() error {
			if c.replayed() {
				skipped++
				return nil
			}
			cs = append(cs, c)
			return nil
		})
		if err != nil {
			return fmt.Errorf("persist: insert: %w", err)
		}
		return nil
	}
	committed := func() {
		for _, c := range cs {
			p.cfg.Log.Error("BROKEN INVARIANT: a different message holds this conversation's seq or client_message_id; not overwritten (recorded in seq_conflicts)",
				"conversation", c.conv, "seq", c.seq, "existing_message_id", c.existing, "incoming_message_id", c.incoming,
				"partition", c.part, "offset", c.offset)
		}
		conflicts := int64(len(cs))
		p.stats.Batches.Add(1)
		p.stats.Inserted.Add(int64(cols.len()) - skipped - conflicts)
		p.stats.Skipped.Add(skipped)
		p.stats.Conflicts.Add(conflicts)
		p.batchSeconds.Observe(time.Since(start).Seconds())
		p.batchSize.Observe(float64(len(recs)))
	}
	return logsink.Queued{Read: read, Committed: committed}, nil
}

// conflict is a row insertSQL did not insert: replayed, or a conflict
// because a different message holds its seq or client_message_id.
type conflict struct {
	conv     string
	seq      int64
	existing *string // message_id of the row holding its seq, if any
	incoming string
	part     int32
	offset   int64
}

// replayed reports whether the row is already stored (the same message
// holds its seq: a replay after a crash) rather than a conflict. A row
// whose seq is free is a conflict: its client_message_id is taken.
func (c conflict) replayed() bool { return c.existing != nil && *c.existing == c.incoming }

// columns are a batch's events as the arrays insertSQL takes.
type columns struct {
	conv, kind, mid, cmid, sender, body, user, members []string
	verdicts                                           []string // a moved event's verdicts as JSON, else ""
	seq, epoch, offset                                 []int64
	created                                            []time.Time
	vshard, part, to                                   []int32 // to: a moved event's to_vshard, else -1
}

func (c *columns) len() int { return len(c.conv) }

// decode appends each record's event (events[i] is recs[i] decoded) to the
// columns; takeover and read markers are no rows.
func (c *columns) decode(recs []*kgo.Record, events []*logrecord.Event) error {
	// Three allocations, not fifteen: the columns of a type share one
	// array, each capped to its part of it.
	n := len(recs)
	strs, ints, int32s := make([]string, 9*n), make([]int64, 3*n), make([]int32, 3*n)
	str := func(i int) []string { return strs[i*n : i*n : (i+1)*n] }
	i64 := func(i int) []int64 { return ints[i*n : i*n : (i+1)*n] }
	i32 := func(i int) []int32 { return int32s[i*n : i*n : (i+1)*n] }
	*c = columns{
		conv: str(0), kind: str(1), mid: str(2), cmid: str(3), sender: str(4), body: str(5), user: str(6), members: str(7), verdicts: str(8),
		seq: i64(0), epoch: i64(1), offset: i64(2), created: make([]time.Time, 0, n), vshard: i32(0), part: i32(1), to: i32(2),
	}
	for i, r := range recs {
		e := events[i]
		if !e.HasSeq() {
			continue // a takeover or read marker: no event row (the read model keeps read markers)
		}
		c.conv = append(c.conv, e.ConversationID)
		c.seq = append(c.seq, e.Seq)
		c.kind = append(c.kind, e.Kind)
		c.mid = append(c.mid, e.MessageID)
		c.cmid = append(c.cmid, e.ClientMessageID)
		c.sender = append(c.sender, e.Sender)
		c.body = append(c.body, e.Body)
		c.user = append(c.user, e.UserID)
		c.members = append(c.members, strings.Join(e.Members, ","))
		c.created = append(c.created, e.CreatedAt)
		c.vshard = append(c.vshard, int32(e.VShard))
		c.epoch = append(c.epoch, e.Epoch)
		c.part = append(c.part, r.Partition)
		c.offset = append(c.offset, r.Offset)
		to := int32(-1)
		if e.ToVShard != nil {
			to = int32(*e.ToVShard)
		}
		c.to = append(c.to, to)
		var verdicts string
		if len(e.Verdicts) > 0 {
			b, err := json.Marshal(e.Verdicts)
			if err != nil {
				return fmt.Errorf("persist: record at %d/%d: encode its verdicts: %w", r.Partition, r.Offset, err)
			}
			verdicts = string(b)
		}
		c.verdicts = append(c.verdicts, verdicts)
	}
	return nil
}
