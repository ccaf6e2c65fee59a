// Package projection maintains the read model of the committed log in
// Postgres, exactly once: membership periods, each conversation's last seq
// and activity time (a user's conversation list), and the delivery outbox
// that tells gateways which events to push.
//
// It is a read_committed consumer group member like persist, with its own
// group and its own rows in consumer_offsets, written in the same
// transaction as the read model. It never gets ahead of persist: a batch is
// applied only once persist has stored every record in it, so a delivery
// row always names events that are already in Postgres (docs/architecture.md,
// rule 12), and sync and history, which never read past a conversation's
// projected last_seq, agree with the membership periods they check.
package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/logsink"
	"github.com/chatpipe/chatpipe/internal/pglisten"
	"github.com/chatpipe/chatpipe/internal/readmodel"
	"github.com/chatpipe/chatpipe/logrecord"
)

// Config configures a Projector.
type Config struct {
	Brokers  []string
	Topic    string
	Group    string // consumer group (default chatpipe-projection)
	Consumer string // name in consumer_offsets (default projection)
	After    string // consumer whose stored offsets this one waits for (default persist)
	DB       *pgxpool.Pool
	MaxBatch int // records per transaction (default 5000)
	// Pace is the consumer's group commit (logsink.Pace; zero: defaults).
	Pace   logsink.Pace
	Retain time.Duration // how long delivery rows are kept (default 1 h)
	Log    *slog.Logger

	KafkaOpts []kgo.Opt // appended to the consumer's options (TLS, SASL)
	// NoListen: do not LISTEN for persist's commits (for connection
	// poolers that do not pass LISTEN through); waiting for persist then
	// only polls.
	NoListen bool
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
		c.After = logsink.PersistConsumer
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

	batches, events, memberOps, waits, reads atomic.Int64
	batchSeconds                             prometheus.Histogram
	waitSeconds                              prometheus.Histogram
	consumer                                 *logsink.Consumer
	lastTrim                                 time.Time
	offsetReads                              atomic.Int64

	// persisted holds persist's stored next offsets as far as the
	// projector knows them (from its announcements and its own reads of
	// consumer_offsets): a batch they cover needs no read.
	persisted *logsink.Announced
}

// New returns a Projector; Run starts it.
func New(cfg Config) (*Projector, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	p := &Projector{cfg: cfg, persisted: logsink.NewAnnounced(cfg.Topic),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "chatpipe_projection_batch_seconds",
			Help: "Time to apply one batch (one Postgres transaction), waiting for persist excluded.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		waitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "chatpipe_projection_persist_wait_seconds",
			Help: "Time a batch waited for persist to store its records.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
	}
	p.consumer = logsink.New(logsink.Config{Brokers: cfg.Brokers, KafkaOpts: cfg.KafkaOpts, Topic: cfg.Topic, Group: cfg.Group, Consumer: cfg.Consumer,
		DB: cfg.DB, MaxBatch: cfg.MaxBatch, Pace: cfg.Pace, Log: cfg.Log, Handle: p.handle, Tick: p.trim, HoldBeforeCommit: faultSleepBeforeCommit},
		"chatpipe_projection", "Records of a partition not yet projected, as of the last fetch.")
	return p, nil
}

// Collectors returns the projector's Prometheus metrics.
func (p *Projector) Collectors() []prometheus.Collector {
	counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	return append([]prometheus.Collector{
		counter("chatpipe_projection_batches_total", "Postgres transactions written.", &p.batches),
		counter("chatpipe_projection_events_total", "Events applied.", &p.events),
		counter("chatpipe_projection_membership_changes_total", "Membership periods opened or closed.", &p.memberOps),
		counter("chatpipe_projection_persist_waits_total", "Batches that had to wait for persist.", &p.waits),
		counter("chatpipe_projection_persist_offset_reads_total", "Reads of persist's stored offsets (a batch its announcements cover needs none).", &p.offsetReads),
		counter("chatpipe_projection_read_markers_total", "Read markers applied (one per conversation and user per batch; a lower one than stored changes nothing).", &p.reads),
		p.batchSeconds, p.waitSeconds,
	}, p.consumer.Collectors()...)
}

// CaughtUp reports whether the projector has joined its group and no
// partition lagged by more than maxLag records at its last fetch.
func (p *Projector) CaughtUp(maxLag int64) error { return p.consumer.CaughtUp(maxLag) }

// Degraded describes the projection's dead letters, "" if there are none.
func (p *Projector) Degraded(ctx context.Context) string { return p.consumer.Degraded(ctx) }

// Run consumes until ctx ends.
func (p *Projector) Run(ctx context.Context) error {
	if !p.cfg.NoListen && p.cfg.After == logsink.PersistConsumer {
		lctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); p.listen(lctx) }()
		defer func() { cancel(); <-done }()
	}
	return p.consumer.Run(ctx)
}

// listen follows persist's announcements until ctx ends. Without it (or
// while it reconnects) waitForPersist polls.
func (p *Projector) listen(ctx context.Context) {
	p.persisted.Listen(ctx, p.cfg.DB, pglisten.Persisted, p.cfg.Log,
		"projection: LISTEN connection lost; polling for persist until it is back")
}

// trim deletes delivery rows older than Retain, once a minute.
func (p *Projector) trim(ctx context.Context) {
	if time.Since(p.lastTrim) < time.Minute {
		return
	}
	p.lastTrim = time.Now()
	if _, err := p.cfg.DB.Exec(ctx, `DELETE FROM delivery_outbox WHERE created_at < now() - $1::interval`,
		strconv.FormatInt(int64(p.cfg.Retain/time.Second), 10)+" seconds"); err != nil && ctx.Err() == nil {
		p.cfg.Log.Warn("projection: trimming the delivery outbox failed", "err", err)
	}
}

// handle decodes the batch, waits until persist has stored it, then queues
// its changes on b (logsink adds the offsets and commits). Decoding comes
// first so that a record this build cannot read stops the projection itself
// (visibly), not only persist.
func (p *Projector) handle(ctx context.Context, b *pgx.Batch, recs []*kgo.Record) (logsink.Queued, error) {
	events := make([]*logrecord.Event, 0, len(recs))
	for _, r := range recs {
		e, err := logrecord.Unmarshal(r.Value)
		if err != nil {
			// Never skipped: a newer version stops the projection until it
			// is upgraded, a malformed record becomes a dead letter (logsink).
			return logsink.Queued{}, fmt.Errorf("projection: record at %d/%d: %w", r.Partition, r.Offset, err)
		}
		events = append(events, e)
	}
	if err := p.faultHold(ctx, recs); err != nil {
		return logsink.Queued{}, err
	}
	// A record persist dead-lettered is covered by its stored offset like
	// any other: the projection applies what it can read of it.
	if err := p.waitForPersist(ctx, logsink.NextOffsets(recs)); err != nil {
		return logsink.Queued{}, err
	}
	return p.queue(b, events), nil
}

// listenPoll is how long waitForPersist waits for an announcement while
// listening before it reads consumer_offsets anyway.
const listenPoll = time.Second

// waitForPersist returns once persist's stored offsets reach next for every
// partition of the batch. Persist's announcements usually say so already.
// consumer_offsets is read when they cannot: while not listening (then
// polling, backing off), once after each LISTEN or an announcement without
// offsets, and after listenPoll without one.
func (p *Projector) waitForPersist(ctx context.Context, next map[int32]int64) error {
	start := time.Now()
	waited, timedOut := false, false
	delay := 2 * time.Millisecond
	for {
		if !p.persisted.Covered(next) && (timedOut || p.persisted.Stale()) {
			have, err := logsink.Offsets(ctx, p.cfg.DB, p.cfg.After, p.cfg.Topic)
			if err != nil {
				p.persisted.MarkStale()
				return fmt.Errorf("projection: %w", err)
			}
			p.offsetReads.Add(1)
			p.persisted.Learn(have)
		}
		if p.persisted.Covered(next) {
			if waited {
				p.waits.Add(1)
				p.waitSeconds.Observe(time.Since(start).Seconds())
			}
			return nil
		}
		waited = true
		// Woken by persist's commit notification, or polling (backing off)
		// when none comes: a notification that came before the read above
		// is still queued, so none is missed.
		wait := delay
		if p.persisted.Listening() {
			wait = listenPoll
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-p.persisted.Woken():
			timedOut = false
		case <-timer.C:
			timedOut = true
		}
		timer.Stop()
		delay = min(delay*2, 50*time.Millisecond)
	}
}

// Statements of a batch, in the order apply queues them.
const (
	// gapSQL keeps the rule that a conversation's membership periods are
	// those of its events in seq order, through every seq up to its
	// projected last_seq, when a move spreads its events over two
	// partitions that the projection may apply in either order. For each
	// conversation of the batch ($1/$2: one row per event with a seq)
	// whose seqs after its projected last_seq leave a hole below the
	// batch's highest seq (hi) — a newer partition applied before the
	// older one's tail — it writes every period from the events persist
	// stored up to hi. Those are all there: the vshard a conversation
	// moved to decides nothing for it until Postgres holds its moved
	// record, and persist stores each partition in log order, so every
	// earlier seq was stored before the first one on the new partition
	// was written; and the projection applies a batch only once persist
	// stored it. The batch's own changes then apply over it (they are
	// idempotent), and the older partition's tail, applied later, changes
	// nothing. The periods it writes are readmodel.LogPeriods's, the one
	// definition of the rule, done here in SQL so that the fill stays in
	// the batch's one round trip; TestGapFillMatchesLogPeriods holds the
	// two together.
	gapSQL = `WITH b AS (
		  SELECT * FROM unnest($1::text[], $2::bigint[]) AS b(c, s)
		), per AS (
		  SELECT b.c, max(b.s) AS hi, coalesce(max(cv.last_seq), 0) AS lo,
		         count(DISTINCT b.s) FILTER (WHERE b.s > coalesce(cv.last_seq, 0)) AS n
		  FROM b LEFT JOIN conversations cv ON cv.conversation_id = b.c
		  GROUP BY b.c
		), gapped AS (
		  SELECT c, hi FROM per WHERE hi > lo AND n < hi - lo
		), ev AS (
		  SELECT e.conversation_id AS c, e.seq, e.kind, e.sender, e.user_id, e.members
		  FROM gapped g JOIN events e ON e.conversation_id = g.c AND e.seq <= g.hi
		  WHERE e.kind IN ('create', 'join', 'kick', 'leave')
		), joins AS (
		  SELECT c, seq, user_id AS u FROM ev WHERE kind = 'join'
		  UNION
		  SELECT ev.c, ev.seq, m.u FROM ev, unnest(array_prepend(ev.sender, coalesce(ev.members, '{}'))) AS m(u)
		  WHERE ev.kind = 'create' AND m.u <> ''
		)
		INSERT INTO memberships (conversation_id, user_id, joined_seq, left_seq)
		SELECT j.c, j.u, j.seq, (SELECT min(l.seq) FROM ev l
		  WHERE l.c = j.c AND l.user_id = j.u AND l.kind IN ('kick', 'leave') AND l.seq > j.seq)
		FROM joins j
		ON CONFLICT (conversation_id, user_id, joined_seq) DO UPDATE SET left_seq = EXCLUDED.left_seq`
	joinSQL = `INSERT INTO memberships (conversation_id, user_id, joined_seq) VALUES ($1, $2, $3)
		ON CONFLICT DO NOTHING`
	leaveSQL = `UPDATE memberships SET left_seq = $3
		WHERE conversation_id = $1 AND user_id = $2 AND left_seq IS NULL AND joined_seq < $3`
	conversationsSQL = `INSERT INTO conversations (conversation_id, last_seq, last_activity_at)
		SELECT * FROM unnest($1::text[], $2::bigint[], $3::timestamptz[])
		ON CONFLICT (conversation_id) DO UPDATE
		SET last_seq = GREATEST(conversations.last_seq, EXCLUDED.last_seq),
		    last_activity_at = GREATEST(conversations.last_activity_at, EXCLUDED.last_activity_at)`
	// deliverySQL takes the next delivery id, writes the delivery row under
	// it and announces it on pglisten.Delivery ($4), in one statement. The
	// counter row stays locked until commit: ids are gap-free and visible in
	// id order.
	deliverySQL = `WITH counter AS (
		  UPDATE delivery_counter SET last_id = last_id + 1 RETURNING last_id
		), outbox AS (
		  INSERT INTO delivery_outbox (id, conversation_ids, from_seqs, to_seqs)
		  SELECT last_id, $1::text[], $2::bigint[], $3::bigint[] FROM counter
		  RETURNING id
		)
		SELECT pg_notify($4, id::text) FROM outbox`
	// deliveryReadsSQL is deliverySQL for a batch with read markers: it
	// also keeps the batch's markers ($5–$7, one per conversation and
	// user) where they are higher than the stored ones, and names the
	// markers it moved forward in the same row, so that gateways push
	// them. (A batch without markers, the common case, skips that work.)
	deliveryReadsSQL = `WITH moved AS (
		  INSERT INTO read_markers (conversation_id, user_id, read_seq)
		  SELECT * FROM unnest($5::text[], $6::text[], $7::bigint[])
		  ON CONFLICT (user_id, conversation_id) DO UPDATE
		  SET read_seq = EXCLUDED.read_seq, updated_at = now()
		  WHERE read_markers.read_seq < EXCLUDED.read_seq
		  RETURNING conversation_id, user_id, read_seq
		), reads AS (
		  SELECT coalesce(array_agg(conversation_id ORDER BY conversation_id, user_id), '{}') AS c,
		         coalesce(array_agg(user_id ORDER BY conversation_id, user_id), '{}') AS u,
		         coalesce(array_agg(read_seq ORDER BY conversation_id, user_id), '{}') AS s
		  FROM moved
		), counter AS (
		  UPDATE delivery_counter SET last_id = last_id + 1 RETURNING last_id
		), outbox AS (
		  INSERT INTO delivery_outbox (id, conversation_ids, from_seqs, to_seqs, read_conversation_ids, read_user_ids, read_seqs)
		  SELECT last_id, $1::text[], $2::bigint[], $3::bigint[], reads.c, reads.u, reads.s FROM counter, reads
		  RETURNING id
		)
		SELECT pg_notify($4, id::text) FROM outbox`
)

// queue queues one batch's read-model changes (events are its records
// decoded) and its delivery row on b; logsink queues the partitions' next
// offsets after them and sends it all as one transaction, in one round
// trip.
func (p *Projector) queue(b *pgx.Batch, events []*logrecord.Event) logsink.Queued {
	start := time.Now()
	plan := readmodel.PlanBatch(events)
	gap := len(plan.Seqs) > 0
	if gap {
		b.Queue(gapSQL, plan.SeqConvs, plan.Seqs)
	}
	for _, m := range plan.Members {
		if m.Join {
			b.Queue(joinSQL, m.Conv, m.User, m.Seq)
		} else {
			b.Queue(leaveSQL, m.Conv, m.User, m.Seq)
		}
	}
	n := len(plan.Convs)
	convs, from, to, at := make([]string, n), make([]int64, n), make([]int64, n), make([]time.Time, n)
	for i, c := range plan.Convs {
		convs[i], from[i], to[i], at[i] = c.Conv, c.From, c.To, c.LastAt
	}
	if n > 0 {
		b.Queue(conversationsSQL, convs, to, at)
	}
	deliver := n > 0 || len(plan.Reads) > 0
	if deliver {
		rc, ru, rs := make([]string, len(plan.Reads)), make([]string, len(plan.Reads)), make([]int64, len(plan.Reads))
		for i, r := range plan.Reads {
			rc[i], ru[i], rs[i] = r.Conv, r.User, r.Seq
		}
		if len(plan.Reads) == 0 {
			b.Queue(deliverySQL, convs, from, to, pglisten.Delivery)
		} else {
			b.Queue(deliveryReadsSQL, convs, from, to, pglisten.Delivery, rc, ru, rs)
		}
	}
	read := func(br pgx.BatchResults) error {
		if gap {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("projection: memberships before the batch: %w", err)
			}
		}
		for range plan.Members {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("projection: memberships: %w", err)
			}
		}
		if len(plan.Convs) > 0 {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("projection: conversations: %w", err)
			}
		}
		if deliver {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("projection: delivery row: %w", err)
			}
		}
		return nil
	}
	committed := func() {
		p.batches.Add(1)
		p.events.Add(int64(len(events)))
		p.reads.Add(int64(len(plan.Reads)))
		p.memberOps.Add(int64(len(plan.Members)))
		p.batchSeconds.Observe(time.Since(start).Seconds())
	}
	return logsink.Queued{Read: read, Committed: committed}
}
