package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/chatpipe/chatpipe/internal/export"
)

// newExportCommand makes chatpipe export, the nightly export of one day's
// committed events (docs/operations.md, "Nightly export").
func newExportCommand() *command {
	fs := newFlagSet("export")
	inf := addInfraFlags(fs)
	day := fs.String("day", "", "UTC day to export, YYYY-MM-DD (default: yesterday)")
	out := fs.String("out", "chatpipe-export", "output directory (chunks under DAY/, runs.ledger, daily.ledger)")
	run := fs.String("run", "", "run name; a run started again with the same name resumes (default export-DAY)")
	chunk := fs.Int("chunk-size", 1000, "events per chunk file")
	fs.check(atLeast("chunk-size", 1))
	level, format := logFlags(fs)
	return newCommand(fs, "write one day's committed events to chunk files, crash-safe and resumable", func(ctx context.Context, _ []string) error {
		log, err := inf.setup(level, format)
		if err != nil {
			return err
		}
		if *inf.dbURL == "" {
			return errors.New("need --database-url or --endpoints")
		}
		d := time.Now().UTC().Add(-24 * time.Hour)
		if *day != "" {
			if d, err = time.Parse("2006-01-02", *day); err != nil {
				return fmt.Errorf("--day: %w", err)
			}
		}
		db, err := openDB(ctx, *inf.dbURL)
		if err != nil {
			return err
		}
		defer db.Close()
		t, err := export.Run(ctx, export.Config{DB: db, Day: d, Out: *out, Run: *run, ChunkSize: *chunk, BeforeRename: exportBeforeRename})
		if err != nil {
			return err
		}
		log.Info("export finished", "day", t.Day, "chunks", t.Chunks, "events", t.Events, "messages", t.Messages, "conversations", t.Conversations)
		fmt.Printf("%s: %d events (%d messages) in %d conversations, %d chunks\n", t.Day, t.Events, t.Messages, t.Conversations, t.Chunks)
		return nil
	})
}
