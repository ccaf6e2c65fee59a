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
// the log is the source of truth — through persist's own write path (rows
// and offsets in one transaction, so `chatpipe persist` can take over from
// the rebuilt database afterwards). It reads cfg.Topic from its start,
// read_committed, until the log has yielded nothing for idle. It refuses a
// database that holds events.
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
	p, err := New(cfg)
	if err != nil {
		return res, err
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.ConsumeTopics(cfg.Topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, cfg.KafkaOpts...)...)
	if err != nil {
		return res, fmt.Errorf("persist: consumer: %w", err)
	}
	defer cl.Close()
	start := time.Now()
	for {
		pctx, cancel := context.WithTimeout(ctx, idle)
		fs := cl.PollRecords(pctx, 5000)
		cancel()
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		recs := fs.Records()
		if len(recs) == 0 {
			break
		}
		if err := p.Settle(ctx, recs); err != nil {
			return res, err
		}
		res.Records += len(recs)
	}
	res.Took = time.Since(start)
	if err := cfg.DB.QueryRow(ctx, `SELECT count(*), count(DISTINCT conversation_id) FROM events`).Scan(&res.Events, &res.Convs); err != nil {
		return res, fmt.Errorf("persist: count: %w", err)
	}
	res.Conflicts, res.DeadLetters = p.Stats().Conflicts.Load(), p.DeadLetters()
	return res, nil
}
