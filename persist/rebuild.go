package persist

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Rebuilt is what Rebuild wrote.
type Rebuilt struct {
	Records                int   // committed records read
	Events, Convs          int64 // rows of events, and their conversations, after
	Conflicts, DeadLetters int64
	Took                   time.Duration
}

// Rebuild fills an empty Postgres (cfg.DB) from the committed log alone —
// the log is the source of truth — through persist's own write path (rows,
// read model and offsets in one transaction, so `chatpipe persist` can take
// over from the rebuilt database afterwards). It reads cfg.Topic from its
// start, read_committed, until the log has yielded nothing for idle, twice:
// the first pass stores the events, the second applies the read model as
// persist does (its event rows are there already). Reading without a group,
// it gets the partitions' records interleaved as they come, so a moved
// conversation's new partition may be read before its old one's tail: with
// every event stored first, the read model's gap fill writes such a
// conversation's membership periods from all of them, in seq order. It
// refuses a database that holds events.
func Rebuild(ctx context.Context, cfg Config, idle time.Duration) (Rebuilt, error) {
	var res Rebuilt
	if err := cfg.validate(); err != nil {
		return res, err
	}
	var n int64
	if err := cfg.DB.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&n); err != nil {
		return res, fmt.Errorf("persist: count events: %w", err)
	}
	if n > 0 {
		return res, fmt.Errorf("the target database holds %d events already; rebuild only into an empty one", n)
	}
	start := time.Now()
	events := newPersister(cfg, cfg.DB, 0, true)
	recs, err := rebuildPass(ctx, cfg, events, idle)
	if err != nil {
		return res, err
	}
	res.Records = recs
	if _, err := rebuildPass(ctx, cfg, newPersister(cfg, cfg.DB, 0, false), idle); err != nil {
		return res, err
	}
	res.Took = time.Since(start)
	if err := cfg.DB.QueryRow(ctx, `SELECT count(*), count(DISTINCT conversation_id) FROM events`).Scan(&res.Events, &res.Convs); err != nil {
		return res, fmt.Errorf("persist: count: %w", err)
	}
	res.Conflicts, res.DeadLetters = events.Stats().Conflicts.Load(), events.DeadLetters()
	return res, nil
}

// rebuildPass writes the log, from its start, through p until it has
// yielded nothing for idle, and returns how many records it read.
func rebuildPass(ctx context.Context, cfg Config, p *Persister, idle time.Duration) (int, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.ConsumeTopics(cfg.Topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, cfg.KafkaOpts...)...)
	if err != nil {
		return 0, fmt.Errorf("persist: consumer: %w", err)
	}
	defer cl.Close()
	n := 0
	for {
		pctx, cancel := context.WithTimeout(ctx, idle)
		fs := cl.PollRecords(pctx, 5000)
		cancel()
		if ctx.Err() != nil {
			return n, ctx.Err()
		}
		recs := fs.Records()
		if len(recs) == 0 {
			return n, nil
		}
		if err := p.Settle(ctx, recs); err != nil {
			return n, err
		}
		n += len(recs)
	}
}
