package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/chatpipe/chatpipe/persist"
)

// newRebuildCommand makes chatpipe admin rebuild, which rebuilds an empty
// Postgres from the committed log alone (persist.Rebuild) and reports the
// counts.
func newRebuildCommand() *command {
	fs := newFlagSet("admin rebuild")
	inf := addInfraFlags(fs)
	idle := fs.Duration("idle", 3*time.Second, "stop once the log yielded nothing new for this long")
	fs.check(positive("idle"))
	level, format := logFlags(fs)
	return newCommand(fs, "rebuild an empty Postgres from the committed log alone and report the counts", func(ctx context.Context, _ []string) error {
		log, err := inf.setup(level, format)
		if err != nil {
			return err
		}
		if *inf.kafka == "" || *inf.dbURL == "" {
			return errors.New("need --kafka and --database-url (the database to rebuild: empty, or one a rebuild left in its first pass)")
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
		res, err := persist.Rebuild(ctx, persist.Config{Brokers: splitList(*inf.kafka), KafkaOpts: kopts, Topic: *inf.topic, DB: db, Log: log}, *idle)
		if err != nil {
			return err
		}
		fmt.Printf("rebuilt from %d committed records in %v: %d events in %d conversations (%d seq conflicts, %d dead letters)\n",
			res.Records, res.Took.Round(time.Millisecond), res.Events, res.Convs, res.Conflicts, res.DeadLetters)
		return nil
	})
}
