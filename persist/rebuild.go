package persist

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/logsink"
)

// Rebuilt is what Rebuild wrote.
type Rebuilt struct {
	Records                int   // committed records read
	Events, Convs          int64 // rows of events, and their conversations, after
	Conflicts, DeadLetters int64
	Took                   time.Duration
}

// rebuildConsumer is a rebuild's first pass's name in consumer_offsets and
// dead_letters; its rows are handed to persist before the second pass.
const rebuildConsumer = "rebuild"

// Rebuild fills an empty Postgres (cfg.DB) from the committed log alone —
// the log is the source of truth — through persist's own write path, so
// that `chatpipe persist` can take over from the rebuilt database
// afterwards. It reads cfg.Topic from its start, read_committed, until the
// log has yielded nothing for idle, and then reads it again up to where the
// first pass ended:
//
//   - The first pass stores the events (and dead-letters what it cannot),
//     under its own name in consumer_offsets.
//   - Then, in one transaction, its dead letters become persist's and its
//     offsets are dropped.
//   - The second pass applies the read model, with persist's offsets, as
//     persist does. Reading without a group, a pass gets the partitions'
//     records interleaved as they come, so a moved conversation's new
//     partition may be read before its old one's tail: with every event
//     stored first, the read model's gap fill writes such a conversation's
//     membership periods from all of them, in seq order.
//
// persist's offsets move only with the read model, so a rebuild stopped at
// any point leaves persist to go on from them: it skips the event rows that
// are there and applies the rest. A rebuild stopped in its first pass can
// also be run again: the first pass reads from the start once more and
// skips what it stored. It refuses any other database that holds events.
func Rebuild(ctx context.Context, cfg Config, idle time.Duration) (Rebuilt, error) {
	var res Rebuilt
	if err := cfg.validate(); err != nil {
		return res, err
	}
	var n, persisted, firstPass int64
	if err := cfg.DB.QueryRow(ctx, `SELECT (SELECT count(*) FROM events),
		(SELECT count(*) FROM consumer_offsets WHERE consumer = $1 AND topic = $3),
		(SELECT count(*) FROM consumer_offsets WHERE consumer = $2 AND topic = $3)`,
		cfg.Consumer, rebuildConsumer, cfg.Topic).Scan(&n, &persisted, &firstPass); err != nil {
		return res, fmt.Errorf("persist: count the target's events and offsets: %w", err)
	}
	if n > 0 && (persisted > 0 || firstPass == 0) {
		return res, fmt.Errorf("the target database holds %d events already; rebuild only into an empty one, or one a rebuild left in its first pass (`chatpipe persist` finishes one stopped later)", n)
	}
	start := time.Now()
	first := cfg
	first.Consumer = rebuildConsumer
	events := newPersister(first, cfg.DB, 0, writeEvents)
	recs, ends, err := rebuildPass(ctx, cfg, events, idle, nil)
	if err != nil {
		return res, err
	}
	res.Records = recs
	if err := pgx.BeginFunc(ctx, cfg.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO dead_letters (consumer, topic, log_partition, log_offset, conversation_id, seq, sqlstate, error, record_key, record_value, created_at)
			SELECT $1, topic, log_partition, log_offset, conversation_id, seq, sqlstate, error, record_key, record_value, created_at
			FROM dead_letters WHERE consumer = $2 AND topic = $3 ON CONFLICT DO NOTHING`, cfg.Consumer, rebuildConsumer, cfg.Topic); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM dead_letters WHERE consumer = $1 AND topic = $2`, rebuildConsumer, cfg.Topic); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM consumer_offsets WHERE consumer = $1 AND topic = $2`, rebuildConsumer, cfg.Topic)
		return err
	}); err != nil {
		return res, fmt.Errorf("persist: hand the first pass's dead letters to persist: %w", err)
	}
	if _, _, err := rebuildPass(ctx, cfg, newPersister(cfg, cfg.DB, 0, writeReadModel), idle, ends); err != nil {
		return res, err
	}
	res.Took = time.Since(start)
	if err := cfg.DB.QueryRow(ctx, `SELECT count(*), count(DISTINCT conversation_id) FROM events`).Scan(&res.Events, &res.Convs); err != nil {
		return res, fmt.Errorf("persist: count: %w", err)
	}
	res.Conflicts = events.Stats().Conflicts.Load()
	if res.DeadLetters, err = logsink.CountDeadLetters(ctx, cfg.DB, cfg.Consumer); err != nil {
		return res, err
	}
	return res, nil
}

// rebuildPass writes the log through p, from its start, until it has
// yielded nothing for idle — or, given until (each partition's next offset
// where the first pass ended), until it has read that far — and returns how
// many records it wrote and the next offset of each partition it read.
func rebuildPass(ctx context.Context, cfg Config, p *Persister, idle time.Duration, until map[int32]int64) (int, map[int32]int64, error) {
	ends := map[int32]int64{}
	reached := func() bool {
		for part, end := range until {
			if ends[part] < end {
				return false
			}
		}
		return true
	}
	if until != nil && reached() {
		return 0, ends, nil // the log was empty
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.ConsumeTopics(cfg.Topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, cfg.KafkaOpts...)...)
	if err != nil {
		return 0, nil, fmt.Errorf("persist: consumer: %w", err)
	}
	defer cl.Close()
	n := 0
	for {
		pctx, cancel := context.WithTimeout(ctx, idle)
		fs := cl.PollRecords(pctx, 5000)
		cancel()
		if ctx.Err() != nil {
			return n, ends, ctx.Err()
		}
		recs := fs.Records()
		if len(recs) == 0 {
			if until != nil {
				// The first pass read this far: the log is there, it did
				// not come within idle.
				return n, ends, fmt.Errorf("persist: the second pass read nothing for %v before reaching where the first ended (read %v of %v); `chatpipe persist` goes on from where it stopped", idle, ends, until)
			}
			return n, ends, nil
		}
		if until != nil {
			recs = slices.DeleteFunc(recs, func(r *kgo.Record) bool {
				end, ok := until[r.Partition]
				return !ok || r.Offset >= end
			})
		}
		if len(recs) > 0 {
			if err := p.Settle(ctx, recs); err != nil {
				return n, ends, err
			}
		}
		for _, r := range recs {
			ends[r.Partition] = max(ends[r.Partition], r.Offset+1)
		}
		n += len(recs)
		if until != nil && reached() {
			return n, ends, nil
		}
	}
}
