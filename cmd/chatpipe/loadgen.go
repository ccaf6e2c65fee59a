package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
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

// loadgenFlags are the flags of chatpipe loadgen.
type loadgenFlags struct {
	// the stack to drive, and the secret its tokens are minted with
	epPath, wsURL, kafka, topic, dbURL, secret, secretFile, dataDir *string
	// the load: a profile, what overrides it, and how long
	profile                                     *string
	scale, rate, groups, dup, churn, reconnects *float64
	devices, users, convs, body                 *int
	duration, drain                             *time.Duration
	plain                                       *bool
	// re-sends
	timeout, backoffBase, backoffMax *time.Duration
	budget                           *float64
	attempts                         *int
	// the run: where it goes, its name, seed and part
	out, run, shard *string
	seed            *uint64
	progress        *bool
	cpuProfile      *string
	level, format   *string
}

func addLoadgenFlags(fs *flagSet) *loadgenFlags {
	f := &loadgenFlags{}
	f.epPath = fs.String("endpoints", "chatpipe-data/endpoints.json", "endpoints.json of the stack to drive (not read with --ws unless given)")
	f.wsURL = fs.String("ws", "", "websocket URL of any gateway (e.g. wss://chat.example.com/v1/ws): drive a stack without an endpoints.json")
	f.kafka = fs.String("kafka", "", "Kafka brokers of the stack, comma-separated: recorded in run.json for 'check' (with --ws)")
	f.topic = fs.String("topic", "", "log topic, recorded for 'check' (default: the endpoints', else "+logrecord.DefaultTopic+")")
	f.dbURL = fs.String("database-url", "", "Postgres URL of the stack, recorded for 'check' (with --ws)")
	f.secret = fs.String("jwt-secret", "", "JWT HS256 secret (default: CHATPIPE_JWT_SECRET, else --jwt-secret-file, else the file in --data-dir)")
	f.secretFile = fs.String("jwt-secret-file", "", "file holding the JWT HS256 secret")
	f.dataDir = fs.String("data-dir", "", "data dir of 'chatpipe dev' holding the generated secret (default: the endpoints file's dir)")
	f.profile = fs.String("profile", "peak", "load profile: "+strings.Join(loadgen.ProfileNames(), ", ")+fmt.Sprintf(" (peak = %.0f msg/s)", loadgen.PeakRate))
	f.scale = fs.Float64("scale", 1, "multiply the profile's rate (e.g. 0.01)")
	f.rate = fs.Float64("rate", 0, "offered messages/s (overrides the profile and --scale)")
	f.duration = fs.Duration("duration", time.Minute, "length of the send phase")
	f.out = fs.String("out", "loadgen-runs", "directory of run directories and runs.ledger")
	f.run = fs.String("run", "", "run name: its directory under --out and the prefix of its ids (default: PROFILE-TIME)")
	f.devices = fs.Int("devices", 0, "websocket connections per user (default: the profile's)")
	f.users = fs.Int("users", 0, "users (default: enough to stay under the per-user rate limit)")
	f.convs = fs.Int("conversations", 0, "conversations (default: enough to stay under the per-conversation limit)")
	f.groups = fs.Float64("groups", -1, "share of conversations that are groups of 3-100 (default: the profile's)")
	f.dup = fs.Float64("dup", 0.01, "share of sends sent twice with the same ids from a second device")
	f.churn = fs.Float64("churn", 0, "membership changes per second (default: rate/500, at least 0.5; negative: none)")
	f.plain = fs.Bool("plain-frames", false, "one server frame per websocket message (default: ask for the batching subprotocol, several frames per message)")
	f.reconnects = fs.Float64("reconnects", 0, "deliberate reconnects per second: a random device closes its websocket and dials again (0: none)")
	f.body = fs.Int("body-bytes", 100, "message body size")
	f.timeout = fs.Duration("timeout", 10*time.Second, "send a command again, same ids, when unanswered this long (within the re-send budget)")
	f.budget = fs.Float64("resend-budget", 0.1, "re-sends allowed per first attempt of a command, on top of a reserve of 100 (0: never re-send)")
	f.attempts = fs.Int("max-attempts", 6, "attempts per command, the first included; then it is given up")
	f.backoffBase = fs.Duration("resend-backoff", 250*time.Millisecond, "backoff ceiling before the first re-send (full jitter, doubling per attempt, after retry_after_ms)")
	f.backoffMax = fs.Duration("resend-backoff-max", 30*time.Second, "largest backoff ceiling")
	f.drain = fs.Duration("drain", time.Minute, "wait this long at most for answers and deliveries after the send phase")
	f.seed = fs.Uint64("seed", 1, "seed of the plan and the schedule's choices")
	f.shard = fs.String("shard", "", "K/N: run part K of N of the plan (its own users and conversations, at rate/N) into the run directory NAME-KofN; then 'chatpipe loadgen merge'")
	f.progress = fs.Bool("progress", true, "show a live progress line on stderr")
	f.cpuProfile = fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	fs.check(positive("scale"), notNegative("rate"), positive("duration"), notNegative("devices"),
		notNegative("users"), notNegative("conversations"), inRange("groups", math.Inf(-1), 1, "at most 1 (negative: the profile's)"),
		inRange("dup", 0, 1, "a share, 0 to 1"), notNegative("reconnects"), atLeast("body-bytes", 1), positive("timeout"),
		notNegative("resend-budget"), atLeast("max-attempts", 1), positive("resend-backoff"),
		notBelowFlag("resend-backoff-max", "resend-backoff", 0, ""), notNegative("drain"))
	f.level, f.format = logFlags(fs)
	return f
}

// newLoadgenCommand makes chatpipe loadgen (its subcommands merge and
// report are added by newCommandTree).
func newLoadgenCommand() *command {
	fs := newFlagSet("loadgen")
	f := addLoadgenFlags(fs)
	return newCommand(fs, "drive a running stack at a profile's rate and record what it saw (then 'chatpipe check')", func(ctx context.Context, _ []string) error {
		return runLoadgen(ctx, fs.FlagSet, f)
	})
}

// runLoadgen drives the stack that f names at the load it asks for, prints
// the run's report and fails if the run failed or was interrupted.
func runLoadgen(ctx context.Context, fs *flag.FlagSet, f *loadgenFlags) error {
	log, err := newLogger(*f.level, *f.format)
	if err != nil {
		return err
	}
	p, rate, err := f.load()
	if err != nil {
		return err
	}
	stack, dir, err := f.target(fs)
	if err != nil {
		return err
	}
	key, err := auth.FindSecret(auth.SecretSources{Value: *f.secret, File: *f.secretFile, DataDir: dir})
	if err != nil {
		return err
	}
	cfg, err := f.config(p, rate, stack, key, log)
	if err != nil {
		return err
	}
	announceRun(cfg)
	if *f.cpuProfile != "" {
		stop, err := startCPUProfile(*f.cpuProfile)
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
		return fmt.Errorf("run %s: %w", cfg.Run, err)
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return ctx.Err()
	}
	return nil
}

// load returns the profile of --profile with the shape the flags give
// (--devices, --users, --conversations, --groups) and the offered rate:
// --rate, else the profile's rate times --scale.
func (f *loadgenFlags) load() (loadgen.Profile, float64, error) {
	p, ok := loadgen.Profiles[*f.profile]
	if !ok {
		return loadgen.Profile{}, 0, fmt.Errorf("unknown profile %q (have %s)", *f.profile, strings.Join(loadgen.ProfileNames(), ", "))
	}
	if *f.devices > 0 {
		p.Devices = *f.devices
	}
	if *f.users > 0 {
		p.Users = *f.users
	}
	if *f.convs > 0 {
		p.Conversations = *f.convs
	}
	if *f.groups >= 0 {
		p.GroupShare = *f.groups
	}
	r := p.Rate * *f.scale
	if *f.rate > 0 {
		r = *f.rate
	}
	return p, r, nil
}

// target returns the stack to drive, from the endpoints file (read unless
// --ws is given without --endpoints or CHATPIPE_ENDPOINTS) and the flags
// that override it, and the absolute data dir to find the JWT secret in
// ("" if none: --data-dir, else the endpoints file's dir). fs is the
// command's flag set, parsed.
func (f *loadgenFlags) target(fs *flag.FlagSet) (loadgen.Stack, string, error) {
	epGiven := os.Getenv("CHATPIPE_ENDPOINTS") != ""
	fs.Visit(func(f *flag.Flag) { epGiven = epGiven || f.Name == "endpoints" })
	ep := &Endpoints{}
	dir := *f.dataDir
	if *f.wsURL == "" || epGiven {
		var err error
		if ep, err = readEndpoints(*f.epPath); err != nil {
			return loadgen.Stack{}, "", err
		}
		if dir == "" {
			dir = filepath.Dir(*f.epPath)
		}
	}
	stack := loadgen.Stack{WebSocket: ep.WebSocket, Kafka: ep.Kafka, Topic: ep.Topic, Postgres: ep.Postgres, VShards: ep.VShards, Partitions: ep.Partitions}
	overrideStack(&stack, *f.wsURL, *f.kafka, *f.topic, *f.dbURL)
	if stack.Topic == "" {
		stack.Topic = logrecord.DefaultTopic
	}
	if dir != "" {
		dir, _ = filepath.Abs(dir)
	}
	return stack, dir, nil
}

// config is the run's configuration: profile p at rate against stack,
// tokens minted with key, and the run's name (--run, else PROFILE-TIME;
// every part of a --shard run needs --run), part, seed, re-sends and
// output.
func (f *loadgenFlags) config(p loadgen.Profile, rate float64, stack loadgen.Stack, key []byte, log *slog.Logger) (loadgen.Config, error) {
	sh, err := loadgen.ParseShard(*f.shard)
	if err != nil {
		return loadgen.Config{}, err
	}
	run := *f.run
	if run == "" {
		if !sh.Whole() {
			return loadgen.Config{}, errors.New("--shard needs --run: every shard must use the same run name")
		}
		run = p.Name + "-" + time.Now().UTC().Format("20060102-150405")
	}
	cfg := loadgen.Config{
		Run: run, Out: *f.out, Profile: p, Rate: rate, Shard: sh, Duration: *f.duration, Secret: key, Seed: *f.seed,
		Stack:    stack,
		DupShare: orNone(*f.dup), Churn: *f.churn, Reconnects: *f.reconnects, PlainFrames: *f.plain, BodyBytes: *f.body, Timeout: *f.timeout, Drain: *f.drain, Log: log,
		Resend: loadgen.ResendPolicy{Budget: orNone(*f.budget), MaxAttempts: *f.attempts, Base: *f.backoffBase, Cap: *f.backoffMax},
	}
	if *f.progress {
		cfg.Progress = os.Stderr
	}
	return cfg, nil
}

// announceRun says on stderr what the run is about to do, and where it
// writes.
func announceRun(cfg loadgen.Config) {
	dir := filepath.Join(cfg.Out, cfg.DirName())
	if sh := cfg.Shard; sh.Whole() {
		fmt.Fprintf(os.Stderr, "loadgen %s: profile %s at %.0f msg/s for %v → %s\n", cfg.Run, cfg.Profile.Name, cfg.Rate, cfg.Duration, dir)
	} else {
		fmt.Fprintf(os.Stderr, "loadgen %s shard %s: profile %s at %.0f of %.0f msg/s for %v → %s\n", cfg.Run, sh, cfg.Profile.Name, cfg.Rate/float64(sh.N), cfg.Rate, cfg.Duration, dir)
	}
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
