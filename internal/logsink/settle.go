package logsink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/jitter"
	"github.com/chatpipe/chatpipe/logrecord"
)

// Settling a batch: retrying what may pass later, halting on what never
// will, and dead-lettering the one record that cannot be written.

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
	cctx, cancel := context.WithTimeout(ctx, c.batchTimeout()+c.cfg.HoldBeforeCommit)
	defer cancel()
	err = commit(cctx, c.cfg.DB, &b, c.cfg.HoldBeforeCommit, func(br pgx.BatchResults) error {
		if err := execOffsets(br, c.cfg.Consumer); err != nil {
			return fmt.Errorf("%s: %w", c.cfg.Consumer, err)
		}
		if err := q.read(br, queued, c.cfg.Consumer); err != nil {
			return err
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
		if !jitter.Sleep(ctx, backoff) {
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

// deadLetter writes r to dead_letters and moves the consumer's stored offset
// past it, in one transaction, with the first of Config.Salvage that can be
// written with them, retrying until that works or ctx ends.
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
	salvage := c.cfg.Salvage
	backoff := 100 * time.Millisecond
	for {
		var part *Salvage
		if len(salvage) > 0 {
			part = &salvage[0]
		}
		committed, wrote, err := c.writeDeadLetter(ctx, r, part, conv, seq, state, text)
		if err == nil {
			if committed != nil {
				committed()
			}
			c.deadLetters.Inc()
			c.dead.Add(1)
			salvaged := "nothing"
			if wrote {
				salvaged = part.What
			}
			c.cfg.Log.Error("DEAD LETTER: a record this consumer can never write was moved to dead_letters; the partition moves on",
				"consumer", c.cfg.Consumer, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
				"sqlstate", sqlstate, "err", cause, "salvaged", salvaged)
			return
		}
		if ctx.Err() != nil {
			return
		}
		if part != nil {
			if class, _ := classify(err); class != transient {
				salvage = salvage[1:] // it cannot be written either: the next way
				continue
			}
		}
		c.cfg.Log.Warn("writing a dead letter failed; retrying", "consumer", c.cfg.Consumer,
			"partition", r.Partition, "offset", r.Offset, "err", err)
		if !jitter.Sleep(ctx, backoff) {
			return
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// writeDeadLetter is one try of deadLetter's transaction, with part (if not
// nil) of the record written too, bounded by BatchTimeout as a batch is (it
// may hold the locks a batch takes). It returns part's Committed, and
// whether part wrote anything.
func (c *Consumer) writeDeadLetter(ctx context.Context, r *kgo.Record, part *Salvage, conv *string, seq *int64, state *string, text string) (func(), bool, error) {
	ctx, cancel := context.WithTimeout(ctx, c.batchTimeout())
	defer cancel()
	var committed func()
	wrote := false
	err := pgx.BeginFunc(ctx, c.cfg.DB, func(tx pgx.Tx) error {
		if err := storeOffsets(ctx, tx, c.cfg.Consumer, c.cfg.Topic, []*kgo.Record{r}); err != nil {
			return err // first: see storeOffsetsSQL
		}
		if part != nil {
			var b pgx.Batch
			q, err := part.Handle(ctx, &b, []*kgo.Record{r})
			if err != nil {
				return err
			}
			n := b.Len()
			if err := readBatch(tx.SendBatch(ctx, &b), func(br pgx.BatchResults) error { return q.read(br, n, c.cfg.Consumer) }); err != nil {
				return fmt.Errorf("dead letter: %s: %w", part.What, err)
			}
			committed, wrote = q.Committed, n > 0
		}
		if _, err := tx.Exec(ctx, `INSERT INTO dead_letters (consumer, topic, log_partition, log_offset, conversation_id, seq,
			sqlstate, error, record_key, record_value) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
			ON CONFLICT DO NOTHING`,
			c.cfg.Consumer, r.Topic, r.Partition, r.Offset, conv, seq, state, text, r.Key, r.Value); err != nil {
			return fmt.Errorf("insert dead letter: %w", err)
		}
		if c.cfg.Announce != "" {
			// The offset moved: a listener waiting for it is told.
			if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, c.cfg.Announce, AnnouncePayload(c.cfg.Topic, []*kgo.Record{r})); err != nil {
				return fmt.Errorf("dead letter: notify: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return committed, wrote, nil
}

// sanitize makes s storable as Postgres text: valid UTF-8 without NUL.
func sanitize(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\ufffd"), "\x00", `\x00`)
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "") == s }
