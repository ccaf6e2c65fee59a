package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/persist"
)

// adminRebuild rebuilds an empty Postgres from the committed log alone — the
// log is the source of truth — and reports the counts. It reads the topic
// from its start, read_committed, through persist's own write path (rows and
// offsets in one transaction, so `chatpipe persist` can take over from the
// rebuilt database afterwards), until the log has been idle for --idle.
func adminRebuild(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("admin rebuild", flag.ContinueOnError)
	inf := addInfraFlags(fs)
	idle := fs.Duration("idle", 3*time.Second, "stop once the log yielded nothing new for this long")
	checkFlags(fs, positive("idle"))
	level, format := logFlags(fs)
	log, err := inf.setup(fs, args, level, format)
	if err != nil {
		return err
	}
	if *inf.kafka == "" || *inf.dbURL == "" {
		return errors.New("need --kafka and --database-url (the database to rebuild; it must hold no events)")
	}
	kopts, err := inf.kafkaOpts(ctx)
	if err != nil {
		return err
	}
	db, err := openMigratedDB(ctx, *inf.dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	var n int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&n); err != nil {
		return fmt.Errorf("count events: %w", err)
	}
	if n > 0 {
		return fmt.Errorf("the target database holds %d events already; rebuild only into an empty one", n)
	}
	p, err := persist.New(persist.Config{Brokers: splitList(*inf.kafka), KafkaOpts: kopts, Topic: *inf.topic, DB: db, Log: log})
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(splitList(*inf.kafka)...), kgo.ConsumeTopics(*inf.topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, kopts...)...)
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	defer cl.Close()
	start := time.Now()
	records := 0
	for {
		pctx, cancel := context.WithTimeout(ctx, *idle)
		fs := cl.PollRecords(pctx, 5000)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		recs := fs.Records()
		if len(recs) == 0 {
			break
		}
		if err := p.Settle(ctx, recs); err != nil {
			return err
		}
		records += len(recs)
	}
	st := p.Stats()
	var events, convs int64
	if err := db.QueryRow(ctx, `SELECT count(*), count(DISTINCT conversation_id) FROM events`).Scan(&events, &convs); err != nil {
		return fmt.Errorf("count: %w", err)
	}
	fmt.Printf("rebuilt from %d committed records in %v: %d events in %d conversations (%d seq conflicts, %d dead letters)\n",
		records, time.Since(start).Round(time.Millisecond), events, convs, st.Conflicts.Load(), p.DeadLetters())
	return nil
}
