package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/chatpipe/chatpipe/internal/auth"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/tools/loadgen"
)

// newLoadgenCommand makes chatpipe loadgen (its subcommands merge and
// report are added by newCommandTree).
func newLoadgenCommand() *command {
	fs := newFlagSet("loadgen")
	epPath := fs.String("endpoints", "chatpipe-data/endpoints.json", "endpoints.json of the stack to drive (not read with --ws unless given)")
	wsURL := fs.String("ws", "", "websocket URL of any gateway (e.g. wss://chat.example.com/v1/ws): drive a stack without an endpoints.json")
	kafka := fs.String("kafka", "", "Kafka brokers of the stack, comma-separated: recorded in run.json for 'check' (with --ws)")
	topic := fs.String("topic", "", "log topic, recorded for 'check' (default: the endpoints', else "+logrecord.DefaultTopic+")")
	dbURL := fs.String("database-url", "", "Postgres URL of the stack, recorded for 'check' (with --ws)")
	secret := fs.String("jwt-secret", "", "JWT HS256 secret (default: CHATPIPE_JWT_SECRET, else --jwt-secret-file, else the file in --data-dir)")
	secretFile := fs.String("jwt-secret-file", "", "file holding the JWT HS256 secret")
	dataDir := fs.String("data-dir", "", "data dir of 'chatpipe dev' holding the generated secret (default: the endpoints file's dir)")
	profile := fs.String("profile", "peak", "load profile: "+strings.Join(loadgen.ProfileNames(), ", ")+fmt.Sprintf(" (peak = %.0f msg/s)", loadgen.PeakRate))
	scale := fs.Float64("scale", 1, "multiply the profile's rate (e.g. 0.01)")
	rate := fs.Float64("rate", 0, "offered messages/s (overrides the profile and --scale)")
	duration := fs.Duration("duration", time.Minute, "length of the send phase")
	out := fs.String("out", "loadgen-runs", "directory of run directories and runs.ledger")
	run := fs.String("run", "", "run name: its directory under --out and the prefix of its ids (default: PROFILE-TIME)")
	devices := fs.Int("devices", 0, "websocket connections per user (default: the profile's)")
	users := fs.Int("users", 0, "users (default: enough to stay under the per-user rate limit)")
	convs := fs.Int("conversations", 0, "conversations (default: enough to stay under the per-conversation limit)")
	groups := fs.Float64("groups", -1, "share of conversations that are groups of 3-100 (default: the profile's)")
	dup := fs.Float64("dup", 0.01, "share of sends sent twice with the same ids from a second device")
	churn := fs.Float64("churn", 0, "membership changes per second (default: rate/500, at least 0.5; negative: none)")
	plain := fs.Bool("plain-frames", false, "one server frame per websocket message (default: ask for the batching subprotocol, several frames per message)")
	reconnects := fs.Float64("reconnects", 0, "deliberate reconnects per second: a random device closes its websocket and dials again (0: none)")
	body := fs.Int("body-bytes", 100, "message body size")
	timeout := fs.Duration("timeout", 10*time.Second, "send a command again, same ids, when unanswered this long (within the re-send budget)")
	budget := fs.Float64("resend-budget", 0.1, "re-sends allowed per first attempt of a command, on top of a reserve of 100 (0: never re-send)")
	attempts := fs.Int("max-attempts", 6, "attempts per command, the first included; then it is given up")
	backoffBase := fs.Duration("resend-backoff", 250*time.Millisecond, "backoff ceiling before the first re-send (full jitter, doubling per attempt, after retry_after_ms)")
	backoffMax := fs.Duration("resend-backoff-max", 30*time.Second, "largest backoff ceiling")
	drain := fs.Duration("drain", time.Minute, "wait this long at most for answers and deliveries after the send phase")
	seed := fs.Uint64("seed", 1, "seed of the plan and the schedule's choices")
	shard := fs.String("shard", "", "K/N: run part K of N of the plan (its own users and conversations, at rate/N) into the run directory NAME-KofN; then 'chatpipe loadgen merge'")
	progress := fs.Bool("progress", true, "show a live progress line on stderr")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	fs.check(positive("scale"), notNegative("rate"), positive("duration"), notNegative("devices"),
		notNegative("users"), notNegative("conversations"), inRange("groups", math.Inf(-1), 1, "at most 1 (negative: the profile's)"),
		inRange("dup", 0, 1, "a share, 0 to 1"), notNegative("reconnects"), atLeast("body-bytes", 1), positive("timeout"),
		notNegative("resend-budget"), atLeast("max-attempts", 1), positive("resend-backoff"),
		notBelowFlag("resend-backoff-max", "resend-backoff", 0, ""), notNegative("drain"))
	level, format := logFlags(fs)
	return newCommand(fs, "drive a running stack at a profile's rate and record what it saw (then 'chatpipe check')", func(ctx context.Context, _ []string) error {
		log, err := newLogger(*level, *format)
		if err != nil {
			return err
		}
		p, ok := loadgen.Profiles[*profile]
		if !ok {
			return fmt.Errorf("unknown profile %q (have %s)", *profile, strings.Join(loadgen.ProfileNames(), ", "))
		}
		if *devices > 0 {
			p.Devices = *devices
		}
		if *users > 0 {
			p.Users = *users
		}
		if *convs > 0 {
			p.Conversations = *convs
		}
		if *groups >= 0 {
			p.GroupShare = *groups
		}
		r := p.Rate * *scale
		if *rate > 0 {
			r = *rate
		}
		epGiven := os.Getenv("CHATPIPE_ENDPOINTS") != ""
		fs.Visit(func(f *flag.Flag) { epGiven = epGiven || f.Name == "endpoints" })
		ep := &Endpoints{}
		dir := *dataDir
		if *wsURL == "" || epGiven {
			if ep, err = readEndpoints(*epPath); err != nil {
				return err
			}
			if dir == "" {
				dir = filepath.Dir(*epPath)
			}
		}
		stack := loadgen.Stack{WebSocket: ep.WebSocket, Kafka: ep.Kafka, Topic: ep.Topic, Postgres: ep.Postgres, VShards: ep.VShards, Partitions: ep.Partitions}
		overrideStack(&stack, *wsURL, *kafka, *topic, *dbURL)
		if stack.Topic == "" {
			stack.Topic = logrecord.DefaultTopic
		}
		if dir != "" {
			dir, _ = filepath.Abs(dir)
		}
		key, err := auth.FindSecret(auth.SecretSources{Value: *secret, File: *secretFile, DataDir: dir})
		if err != nil {
			return err
		}
		sh, err := loadgen.ParseShard(*shard)
		if err != nil {
			return err
		}
		if *run == "" {
			if !sh.Whole() {
				return errors.New("--shard needs --run: every shard must use the same run name")
			}
			*run = p.Name + "-" + time.Now().UTC().Format("20060102-150405")
		}
		cfg := loadgen.Config{
			Run: *run, Out: *out, Profile: p, Rate: r, Shard: sh, Duration: *duration, Secret: key, Seed: *seed,
			Stack:    stack,
			DupShare: orNone(*dup), Churn: *churn, Reconnects: *reconnects, PlainFrames: *plain, BodyBytes: *body, Timeout: *timeout, Drain: *drain, Log: log,
			Resend: loadgen.ResendPolicy{Budget: orNone(*budget), MaxAttempts: *attempts, Base: *backoffBase, Cap: *backoffMax},
		}
		if *progress {
			cfg.Progress = os.Stderr
		}
		if sh.Whole() {
			fmt.Fprintf(os.Stderr, "loadgen %s: profile %s at %.0f msg/s for %v → %s\n", *run, p.Name, r, *duration, filepath.Join(*out, cfg.DirName()))
		} else {
			fmt.Fprintf(os.Stderr, "loadgen %s shard %s: profile %s at %.0f of %.0f msg/s for %v → %s\n", *run, sh, p.Name, r/float64(sh.N), r, *duration, filepath.Join(*out, cfg.DirName()))
		}
		if *cpuProfile != "" {
			stop, err := startCPUProfile(*cpuProfile)
			if err != nil {
				return err
			}
			defer stop()
		}
		rep, err := loadgen.Run(ctx, cfg)
		if rep != nil {
			fmt.Print(rep.Markdown())
		}
		if err != nil {
			return fmt.Errorf("run %s: %w", *run, err)
		}
		if errors.Is(ctx.Err(), context.Canceled) {
			return ctx.Err()
		}
		return nil
	})
}

// overrideStack sets the stack's fields that flags give.
func overrideStack(st *loadgen.Stack, ws, kafka, topic, db string) {
	if ws != "" {
		st.WebSocket = ws
	}
	if kafka != "" {
		st.Kafka = splitList(kafka)
	}
	if topic != "" {
		st.Topic = topic
	}
	if db != "" {
		st.Postgres = db
	}
}

// orNone maps a flag's 0 ("none") to the config's negative "none".
func orNone(v float64) float64 {
	if v == 0 {
		return -1
	}
	return v
}

// newLoadgenMergeCommand makes chatpipe loadgen merge, which merges the
// run directories of a --shard run's parts into one.
func newLoadgenMergeCommand() *command {
	fs := newFlagSet("loadgen merge")
	out := fs.String("out", "", "the merged run directory to write (new or empty; required)")
	return newCommand(fs, "merge the run directories of a --shard run's parts", func(_ context.Context, args []string) error {
		if *out == "" || len(args) == 0 {
			fs.Usage()
			return errors.New("merge needs --out and at least one run directory")
		}
		rep, err := loadgen.Merge(*out, args)
		if err != nil {
			return err
		}
		fmt.Print(rep.Markdown())
		fmt.Fprintf(os.Stderr, "merged %d runs into %s (check it with: chatpipe check --run %s)\n", len(args), *out, *out)
		return nil
	}).withUsage("usage: chatpipe loadgen merge --out DIR RUN-DIR RUN-DIR…\n")
}

// newLoadgenReportCommand makes chatpipe loadgen report, which rebuilds a
// run's report from its files.
func newLoadgenReportCommand() *command {
	fs := newFlagSet("loadgen report")
	dir := fs.String("run", "", "run directory whose report to rebuild from its files (required)")
	return newCommand(fs, "rebuild a run's report from its files", func(_ context.Context, _ []string) error {
		if *dir == "" {
			return errors.New("--run is required")
		}
		rep, err := loadgen.Rebuild(*dir)
		if err != nil {
			return err
		}
		fmt.Print(rep.Markdown())
		return nil
	})
}

// startCPUProfile profiles the process into path until the returned stop.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
