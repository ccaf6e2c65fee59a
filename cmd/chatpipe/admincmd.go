package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/internal/logsink"
	"github.com/chatpipe/chatpipe/internal/schema"
	"github.com/chatpipe/chatpipe/lease"
)

// newShardsCommand makes chatpipe admin shards, which prints the ownership
// table from etcd.
func newShardsCommand() *command {
	fs := newFlagSet("admin shards")
	inf := addInfraFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	level, format := logFlags(fs)
	return newCommand(fs, "every vshard's owner, worker gen and epoch, and each worker's lease TTL left", func(ctx context.Context, _ []string) error {
		if _, err := inf.setup(level, format); err != nil {
			return err
		}
		if *inf.etcd == "" {
			return errors.New("need --endpoints or --etcd")
		}
		cli, cfg, err := etcdConfig(ctx, *inf.etcd, inf.sec, lease.Config{})
		if err != nil {
			return err
		}
		defer cli.Close()
		resp, err := cli.Get(ctx, lease.DefaultPrefix+"workers/", clientv3.WithPrefix())
		if err != nil {
			return fmt.Errorf("read workers: %w", err)
		}
		type worker struct {
			ID     string `json:"id"`
			Addr   string `json:"addr"`
			Gen    int64  `json:"gen"`
			TTL    int64  `json:"lease_ttl_seconds"`
			Shards int    `json:"shards"`
		}
		workers := map[string]*worker{}
		for _, kv := range resp.Kvs {
			var info lease.WorkerInfo
			if json.Unmarshal(kv.Value, &info) != nil {
				continue
			}
			id := strings.TrimPrefix(string(kv.Key), lease.DefaultPrefix+"workers/")
			w := &worker{ID: id, Addr: info.Addr, Gen: info.Gen, TTL: -1}
			if ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease)); err == nil {
				w.TTL = ttl.TTL
			}
			workers[id] = w
		}
		type shard struct {
			VShard int    `json:"vshard"`
			Worker string `json:"worker"`
			Gen    int64  `json:"gen"`
			Epoch  int64  `json:"epoch"`
			Live   bool   `json:"live"`
		}
		var shards []shard
		for v := 0; v < cfg.Layout().AllVShards(); v++ {
			o, ok, err := lease.ReadOwner(ctx, cli, lease.DefaultPrefix, v)
			if err != nil {
				return err
			}
			s := shard{VShard: v}
			if ok {
				s.Worker, s.Gen, s.Epoch = o.Worker, o.Gen, o.Epoch
				if w := workers[o.Worker]; w != nil && w.Gen == o.Gen {
					s.Live = true
					w.Shards++
				}
			}
			shards = append(shards, s)
		}
		ids := make([]string, 0, len(workers))
		for id := range workers {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		if *asJSON {
			out := struct {
				Config  lease.Config `json:"config"`
				Workers []*worker    `json:"workers"`
				Shards  []shard      `json:"shards"`
			}{Config: cfg, Shards: shards}
			for _, id := range ids {
				out.Workers = append(out.Workers, workers[id])
			}
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(out)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "WORKER\tADDR\tGEN\tLEASE TTL\tSHARDS")
		for _, id := range ids {
			w := workers[id]
			fmt.Fprintf(tw, "%s\t%s\t%d\t%ds\t%d\n", w.ID, w.Addr, w.Gen, w.TTL, w.Shards)
		}
		fmt.Fprintln(tw, "\nVSHARD\tOWNER\tGEN\tEPOCH\tLIVE")
		for _, s := range shards {
			fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%v\n", s.VShard, s.Worker, s.Gen, s.Epoch, s.Live)
		}
		return tw.Flush()
	})
}

// splitRole splits check-config's arguments at --role ROLE (or
// --role=ROLE): what comes before is check-config's, what comes after is the
// role's.
func splitRole(args []string) (own []string, role string, roleArgs []string, ok bool, err error) {
	for i, a := range args {
		if a == "--" {
			break
		}
		switch {
		case a == "--role" || a == "-role":
			if i+1 >= len(args) {
				return nil, "", nil, false, errors.New("--role needs a command name (e.g. --role worker)")
			}
			return args[:i], args[i+1], args[i+2:], true, nil
		case strings.HasPrefix(a, "--role=") || strings.HasPrefix(a, "-role="):
			_, r, _ := strings.Cut(a, "=")
			return args[:i], r, args[i+1:], true, nil
		}
	}
	return args, "", nil, false, nil
}

// newCheckConfigCommand makes chatpipe admin check-config, which compares
// what this process was given with what the deployment holds, and lists
// every disagreement. With --role ROLE [flags] it first checks ROLE's own
// flags, environment and config file as ROLE would at start, and then checks
// the deployment with the role's etcd, Kafka and Postgres settings (unless
// --role-only).
func newCheckConfigCommand() *command {
	fs := newFlagSet("admin check-config")
	inf := addInfraFlags(fs)
	vshards := fs.Int("vshards", 0, "expected virtual shards (0: don't check)")
	partitions := fs.Int("partitions", 0, "expected partitions (0: don't check)")
	minRF := fs.Int("min-replication", 3, "smallest replication factor of the log topic allowed (a dev broker has 1: pass 1)")
	roleOnly := fs.Bool("role-only", false, "with --role: check the role's configuration only, not the deployment")
	fs.check(notNegative("vshards"), notNegative("partitions"), atLeast("min-replication", 1))
	level, format := logFlags(fs)
	var role string       // --role ROLE
	var roleArgs []string // the arguments after it
	var hasRole bool
	c := newCommand(fs, "check that flags/env, etcd's deployment config, the Kafka topic and Postgres agree\n"+
		"(--role ROLE [flags]: check that role's flags, env and config file first)", func(ctx context.Context, _ []string) error {
		if _, err := inf.setup(level, format); err != nil {
			return err
		}
		if hasRole {
			if err := checkRoleConfig(fs.FlagSet, role, roleArgs); err != nil {
				if errors.Is(err, flag.ErrHelp) {
					return nil // -h among the role's flags: the role's usage is printed
				}
				return err
			}
			if *roleOnly {
				return nil
			}
			if err := inf.resolve(); err != nil {
				return err
			}
		}
		var problems []string
		var cfg lease.Config
		if *inf.etcd == "" {
			problems = append(problems, "no etcd endpoints (--etcd or --endpoints)")
		} else if cli, err := dialEtcd(ctx, splitList(*inf.etcd), inf.sec); err != nil {
			problems = append(problems, err.Error())
		} else {
			defer cli.Close()
			cfg, err = lease.EnsureConfig(ctx, cli, lease.DefaultPrefix, lease.Config{VShards: *vshards, Partitions: *partitions, Topic: *inf.topic})
			if err != nil && !errors.Is(err, lease.ErrConfigMismatch) {
				problems = append(problems, err.Error())
			} else if err != nil {
				problems = append(problems, fmt.Sprintf("etcd holds vshards=%d partitions=%d topic=%s, this process was given vshards=%d partitions=%d topic=%s",
					cfg.VShards, cfg.Partitions, cfg.Topic, *vshards, *partitions, *inf.topic))
			}
		}
		if *inf.kafka == "" {
			problems = append(problems, "no Kafka brokers (--kafka or --endpoints)")
		} else if kopts, err := inf.kafkaOpts(ctx); err != nil {
			problems = append(problems, err.Error())
		} else if cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(splitList(*inf.kafka)...)}, kopts...)...); err != nil {
			problems = append(problems, err.Error())
		} else {
			defer cl.Close()
			topics, err := kadm.NewClient(cl).ListTopics(ctx, *inf.topic)
			switch {
			case err != nil:
				problems = append(problems, fmt.Sprintf("kafka: %v", err))
			case !topics.Has(*inf.topic):
				problems = append(problems, fmt.Sprintf("kafka has no topic %s", *inf.topic))
			case cfg.Partitions > 0 && len(topics[*inf.topic].Partitions) != cfg.Layout().TopicPartitions():
				problems = append(problems, fmt.Sprintf("topic %s has %d partitions, the deployment %d (%d hashed, %d dedicated)", *inf.topic, len(topics[*inf.topic].Partitions), cfg.Layout().TopicPartitions(), cfg.Partitions, cfg.Dedicated))
			default:
				problems = append(problems, topicProblems(ctx, splitList(*inf.kafka), *inf.topic, *minRF, kopts...)...)
			}
		}
		if *inf.dbURL == "" {
			problems = append(problems, "no Postgres URL (--database-url or --endpoints)")
		} else if db, err := openDB(ctx, *inf.dbURL); err != nil {
			problems = append(problems, err.Error())
		} else {
			defer db.Close()
			if n, err := schema.Applied(ctx, db); err != nil || n == 0 {
				problems = append(problems, "postgres has no chatpipe schema (run 'chatpipe init')")
			}
		}
		if len(problems) > 0 {
			for _, p := range problems {
				fmt.Println("✗", p)
			}
			return fmt.Errorf("%d configuration problem(s)", len(problems))
		}
		fmt.Printf("✓ etcd, Kafka and Postgres agree: vshards=%d partitions=%d topic=%s\n", cfg.VShards, cfg.Partitions, cfg.Topic)
		return nil
	}).withUsage("Usage: chatpipe admin check-config [flags] [--role ROLE [ROLE's flags]]\n\n" +
		"--role ROLE checks the flags, CHATPIPE_* variables and config file of 'chatpipe ROLE'\n" +
		"as it would at start (without starting it); every argument after it is ROLE's.\n\nFlags:\n")
	c.splitArgs = func(args []string) (own []string, err error) {
		own, role, roleArgs, hasRole, err = splitRole(args)
		return own, err
	}
	return c
}

// checkRoleConfig validates the configuration of chatpipe role (its args,
// the environment and its config file) and copies the settings it shares
// with check-config's flag set fs (etcd, Kafka, Postgres, TLS) into fs.
func checkRoleConfig(fs *flag.FlagSet, role string, args []string) error {
	switch role {
	case "", "admin", "version", "help":
		return fmt.Errorf("--role %q: name a command with flags (e.g. worker, gateway, persist)", role)
	}
	rfs, notes, err := newCommandTree().validate(append([]string{role}, args...))
	if err != nil {
		fmt.Printf("✗ chatpipe %s: %v\n", role, err)
		return fmt.Errorf("chatpipe %s would not start: %w", role, err)
	}
	for _, n := range notes {
		fmt.Println("·", n)
	}
	fmt.Printf("✓ chatpipe %s: flags, environment and config file are valid\n", role)
	var copyErr error
	rfs.Visit(func(f *flag.Flag) {
		if f.Name == "config" || fs.Lookup(f.Name) == nil || copyErr != nil {
			return
		}
		copyErr = fs.Set(f.Name, f.Value.String())
	})
	if copyErr != nil {
		return fmt.Errorf("copy the settings of chatpipe %s: %w", role, copyErr)
	}
	return nil
}

// newHandoffCommand makes chatpipe admin handoff, which asks the coordinator
// to move a vshard and waits until the owner row names the new worker.
func newHandoffCommand() *command {
	fs := newFlagSet("admin handoff")
	inf := addInfraFlags(fs)
	v := fs.Int("vshard", -1, "the vshard to move")
	to := fs.String("to", "", "the live worker to move it to")
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for the move")
	fs.check(positive("wait"))
	level, format := logFlags(fs)
	return newCommand(fs, "move one vshard to a worker through the coordinator (epoch+1, normal takeover)", func(ctx context.Context, _ []string) error {
		if _, err := inf.setup(level, format); err != nil {
			return err
		}
		if *inf.etcd == "" || *v < 0 || *to == "" {
			return errors.New("need --etcd (or --endpoints), --vshard and --to")
		}
		cli, err := dialEtcd(ctx, splitList(*inf.etcd), inf.sec)
		if err != nil {
			return err
		}
		defer cli.Close()
		before, _, err := lease.ReadOwner(ctx, cli, lease.DefaultPrefix, *v)
		if err != nil {
			return err
		}
		if err := lease.RequestHandoff(ctx, cli, lease.DefaultPrefix, *v, *to); err != nil {
			return err
		}
		deadline := time.Now().Add(*wait)
		for time.Now().Before(deadline) {
			o, ok, err := lease.ReadOwner(ctx, cli, lease.DefaultPrefix, *v)
			if err != nil {
				return err
			}
			if ok && o.Worker == *to && o.Epoch > before.Epoch {
				fmt.Printf("vshard %d: %s (epoch %d) → %s (epoch %d)\n", *v, before.Worker, before.Epoch, o.Worker, o.Epoch)
				return nil
			}
			time.Sleep(100 * time.Millisecond)
		}
		return fmt.Errorf("vshard %d did not move to %s within %v (is it a live worker?)", *v, *to, *wait)
	})
}

// topicProblems checks that the log topic is kept: no retention by time or
// size (a replay or rebuild from a deleted offset would silently start at
// the new log start) and replicated at least minRF ways.
func topicProblems(ctx context.Context, brokers []string, topic string, minRF int, kopts ...kgo.Opt) []string {
	st, err := devstack.DescribeTopic(ctx, brokers, topic, kopts...)
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	if v, ok := st.Configs["retention.ms"]; !ok || v != "-1" {
		out = append(out, fmt.Sprintf("topic %s has retention.ms=%s: the log must be kept forever (retention.ms=-1); it is what writers replay and rebuild reads", topic, v))
	}
	if v, ok := st.Configs["retention.bytes"]; ok && v != "-1" && v != "" {
		out = append(out, fmt.Sprintf("topic %s has retention.bytes=%s: the log must be kept whole (retention.bytes=-1)", topic, v))
	}
	if st.Replication < minRF {
		out = append(out, fmt.Sprintf("topic %s is replicated %d ways, fewer than %d (--min-replication)", topic, st.Replication, minRF))
	}
	return out
}

// newDeadLettersCommand makes chatpipe admin dead-letters, which lists the
// rows of dead_letters as a table.
func newDeadLettersCommand() *command {
	fs := newFlagSet("admin dead-letters")
	inf := addInfraFlags(fs)
	consumer := fs.String("consumer", "", "only this consumer's (persist; a database upgraded from an older version may hold projection's too); default all")
	limit := fs.Int("limit", 100, "at most this many rows, oldest first")
	width := fs.Int("value-width", 60, "bytes of each record value shown (quoted)")
	fs.check(atLeast("limit", 1), notNegative("value-width"))
	level, format := logFlags(fs)
	return newCommand(fs, "records persist could never write (dead_letters), oldest first", func(ctx context.Context, _ []string) error {
		if _, err := inf.setup(level, format); err != nil {
			return err
		}
		if *inf.dbURL == "" {
			return errors.New("need --endpoints or --database-url")
		}
		db, err := openDB(ctx, *inf.dbURL)
		if err != nil {
			return err
		}
		defer db.Close()
		letters, total, err := logsink.ListDeadLetters(ctx, db, *consumer, *limit)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CONSUMER\tTOPIC\tPARTITION\tOFFSET\tCONVERSATION\tSEQ\tSQLSTATE\tCREATED\tERROR\tVALUE")
		for _, d := range letters {
			seqText := ""
			if d.Seq > 0 {
				seqText = fmt.Sprint(d.Seq)
			}
			shown := d.Value
			if len(shown) > *width {
				shown = shown[:*width]
			}
			v := fmt.Sprintf("%q", shown)
			if len(shown) < len(d.Value) {
				v += fmt.Sprintf("… (%d bytes)", len(d.Value))
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Consumer, d.Topic, d.Partition, d.Offset, d.Conversation, seqText, d.SQLState,
				d.CreatedAt.UTC().Format(time.RFC3339), strings.ReplaceAll(d.Error, "\t", " "), v)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if total > int64(*limit) {
			fmt.Printf("(%d of %d shown; --limit)\n", *limit, total)
		}
		return nil
	})
}
