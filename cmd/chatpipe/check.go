package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/chatpipe/chatpipe/internal/atomicfile"
	"github.com/chatpipe/chatpipe/internal/worldcheck"
	"github.com/chatpipe/chatpipe/tools/loadcheck"
	"github.com/chatpipe/chatpipe/tools/loadgen"
)

// newCheckCommand makes chatpipe check.
func newCheckCommand() *command {
	fs := newFlagSet("check")
	runDir := fs.String("run", "", "run directory written by 'chatpipe loadgen' (required)")
	epPath := fs.String("endpoints", "", "endpoints.json of the stack (default: the stack recorded in the run)")
	wait := fs.Duration("persist-wait", time.Minute, "wait this long at most for persist to copy the log into Postgres")
	kafka := fs.String("kafka", "", "Kafka brokers, comma-separated (default: the run's stack)")
	topic := fs.String("topic", "", "log topic (default: the run's stack)")
	dbURL := fs.String("database-url", "", "Postgres URL (default: the run's stack)")
	sec := addSecFlags(fs)
	fs.check(notNegative("persist-wait"))
	return newCommand(fs, "verify a loadgen run directory against the committed log and Postgres", func(ctx context.Context, _ []string) error {
		if *runDir == "" {
			return errors.New("--run is required")
		}
		run, err := loadgen.ReadRun(*runDir)
		if err != nil {
			return err
		}
		stack, dedicated := run.Info.Stack, 0
		if *epPath != "" {
			ep, err := readEndpoints(*epPath)
			if err != nil {
				return err
			}
			stack = loadgen.Stack{WebSocket: ep.WebSocket, Kafka: ep.Kafka, Topic: ep.Topic, Postgres: ep.Postgres, VShards: ep.VShards, Partitions: ep.Partitions}
			dedicated = ep.Dedicated
		}
		if *kafka != "" || *topic != "" {
			// Another log than the one recorded: its layout is not known.
			stack.VShards, stack.Partitions = 0, 0
		}
		overrideStack(&stack, "", *kafka, *topic, *dbURL)
		if len(stack.Kafka) == 0 || stack.Postgres == "" || stack.Topic == "" {
			return fmt.Errorf("run %s records no Kafka, topic or Postgres of its stack: give --kafka, --topic, --database-url (or --endpoints)", *runDir)
		}
		kopts, err := sec.kafkaOpts(ctx, stack.Kafka)
		if err != nil {
			return err
		}
		cfg := loadcheck.Config(run, stack, dedicated)
		cfg.PersistWait, cfg.KafkaOpts = *wait, kopts
		world, err := worldcheck.ReadWorld(ctx, cfg)
		if err != nil {
			return fmt.Errorf("run %s: %w", run.Info.Run, err)
		}
		res := loadcheck.Check(run, world)
		fmt.Print(res.Text())
		if err := atomicfile.WriteJSON(filepath.Join(*runDir, "check.json"), res, 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "chatpipe check: %v\n", err)
		}
		if !res.OK() {
			return fmt.Errorf("run %s: %d violations", run.Info.Run, len(res.Violations)+sum(res.Truncated))
		}
		return nil
	})
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
