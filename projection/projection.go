// Package projection is the read model of the committed log in Postgres:
// membership periods, each conversation's last seq and activity time (a
// user's conversation list), read markers, and the delivery outbox that
// tells gateways which events to push.
//
// persist applies it: each batch's read-model changes go into the same
// Postgres transaction as the batch's events and its stored offsets, in one
// round trip. So a delivery row never names an event persist has not
// stored or dead-lettered (docs/architecture.md, rule 12), the read model is
// exactly as far along the log as events, and sync and history, which never
// read past a conversation's projected last_seq, agree with the membership
// periods they check. This package plans and queues those changes, and
// trims the outbox (Trim); it owns no consumer.
package projection

import (
	"context"
	"fmt"
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

// DefaultRetain is how long delivery rows are kept by default.
const DefaultRetain = time.Hour

// ReadModel queues the read model's changes for batches of the log and
// counts what it applied. Its zero value is not usable; New makes one.
type ReadModel struct {
	events, memberOps, reads atomic.Int64
	lastTrim                 time.Time
	// projected keeps what this read model's batches projected, so that a
	// batch checks for a hole (gapSQL) only the conversations that may
	// have one.
	projected readmodel.Projected
}

// New returns a ReadModel. (Its batches are persist's: they are counted
// and timed by persist's chatpipe_persist_batches_total and
// chatpipe_persist_batch_seconds.)
func New() *ReadModel { return &ReadModel{} }

// Collectors returns the read model's Prometheus metrics.
func (p *ReadModel) Collectors() []prometheus.Collector {
	counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	return []prometheus.Collector{
		counter("chatpipe_projection_events_total", "Events applied to the read model.", &p.events),
		counter("chatpipe_projection_membership_changes_total", "Membership periods opened or closed.", &p.memberOps),
		counter("chatpipe_projection_read_markers_total", "Read markers applied (one per conversation and user per batch; a lower one than stored changes nothing).", &p.reads),
	}
}

// Decode decodes a batch's records. A record this build cannot read is an
// error: a newer version stops the consumer until it is upgraded, a
// malformed record becomes a dead letter (logsink).
func Decode(recs []*kgo.Record) ([]*logrecord.Event, error) {
	events := make([]*logrecord.Event, 0, len(recs))
	for _, r := range recs {
		e, err := logrecord.Unmarshal(r.Value)
		if err != nil {
			return nil, fmt.Errorf("record at %d/%d: %w", r.Partition, r.Offset, err)
		}
		events = append(events, e)
	}
	return events, nil
}

// Handle queues the read-model changes of recs on b, alone: a
// logsink.Config.Handle (persist uses Queue within its own; this applies a
// dead-lettered record's read model, and tests apply batches with it).
func (p *ReadModel) Handle(_ context.Context, b *pgx.Batch, recs []*kgo.Record) (logsink.Queued, error) {
	events, err := Decode(recs)
	if err != nil {
		return logsink.Queued{}, fmt.Errorf("projection: %w", err)
	}
	return p.Queue(b, events), nil
}

// Trim deletes delivery rows older than retain, at most once a minute; it
// returns at once otherwise.
func (p *ReadModel) Trim(ctx context.Context, db *pgxpool.Pool, retain time.Duration) error {
	if time.Since(p.lastTrim) < time.Minute {
		return nil
	}
	p.lastTrim = time.Now()
	if _, err := db.Exec(ctx, `DELETE FROM delivery_outbox WHERE created_at < now() - $1::interval`,
		strconv.FormatInt(int64(retain/time.Second), 10)+" seconds"); err != nil {
		return fmt.Errorf("projection: trimming the delivery outbox: %w", err)
	}
	return nil
}

// Statements of a batch, in the order Queue queues them.
const (
	// gapSQL keeps the rule that a conversation's membership periods are
	// those of its events in seq order, through every seq up to its
	// projected last_seq, when a batch's seqs after a conversation's
	// projected last_seq leave a hole below the batch's highest seq (hi).
	// While persist runs, a move leaves none: the vshard a conversation
	// moved to decides nothing for it until Postgres holds its moved
	// record, and persist stores and projects each partition in log order
	// in one transaction, so the old partition's tail is projected before
	// the first event on the new one is written. A hole comes from a
	// rebuild, which projects a log whose events are all stored already
	// with the partitions' records interleaved as they are read, or from a
	// record dead-lettered whole. For each conversation of the batch
	// ($1/$2: one row per event with a seq, of the conversations that
	// readmodel.Projected cannot rule a hole out for) with a hole, it writes every
	// period from the events stored up to hi: the batch's own, queued
	// before it, and every earlier one persist stored. The batch's own
	// changes then apply over it (they are idempotent), and an older
	// partition's tail, applied later, changes nothing. The periods it
	// writes are readmodel.LogPeriods's, the one definition of the rule,
	// done here in SQL so that the fill stays in the batch's one round
	// trip; TestGapFillMatchesLogPeriods holds the two together.
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

// Queue queues one batch's read-model changes (events are its records
// decoded, in offset order per partition) and its delivery row on b, to be
// sent with the rest of the batch's transaction; the Queued reads their
// results, in order, and counts them once committed.
func (p *ReadModel) Queue(b *pgx.Batch, events []*logrecord.Event) logsink.Queued {
	plan := readmodel.PlanBatch(events)
	gapConvs, gapSeqs := p.projected.Unsure(plan.SeqConvs, plan.Seqs)
	gap := len(gapSeqs) > 0
	if gap {
		b.Queue(gapSQL, gapConvs, gapSeqs)
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
		p.projected.Commit(plan.SeqConvs, plan.Seqs)
		p.events.Add(int64(len(events)))
		p.reads.Add(int64(len(plan.Reads)))
		p.memberOps.Add(int64(len(plan.Members)))
	}
	return logsink.Queued{Read: read, Committed: committed}
}
