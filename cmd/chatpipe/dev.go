package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/chatpipe/chatpipe/atomicfile"
	"github.com/chatpipe/chatpipe/auth"
	"github.com/chatpipe/chatpipe/devstack"
	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/schema"
	"github.com/chatpipe/chatpipe/shardworker"
)

func runDev(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "chatpipe-data", "directory for all state (etcd, Kafka, Postgres, the JWT secret)")
	httpAddr := fs.String("http", "127.0.0.1:8080", "gateway listen address (websocket at /v1/ws)")
	workers := fs.Int("workers", 2, "shard workers to run in this process (0: run none; add them with 'chatpipe worker')")
	vshards := fs.Int("vshards", 64, "virtual shards (fixed for a deployment; stored in etcd)")
	partitions := fs.Int("partitions", 8, "partitions of the log topic (fixed for a deployment)")
	dbURL := fs.String("database-url", "", "use this Postgres instead of a private cluster under the data dir")
	kafkaAddrs := fs.String("kafka", "", "use these Kafka brokers (comma separated) instead of an embedded broker")
	etcdAddrs := fs.String("etcd", "", "use these etcd endpoints (comma separated) instead of an embedded member")
	runPersist := fs.Bool("persist", true, "run persist in this process (false: run 'chatpipe persist' yourself)")
	runProj := fs.Bool("projection", true, "run projection in this process (false: run 'chatpipe projection' yourself)")
	secret := fs.String("jwt-secret", "", "JWT HS256 secret (default: CHATPIPE_JWT_SECRET, else generated once into the data dir)")
	linger := fs.Duration("linger", 0, "extra time a shard writer waits for a batch to fill before committing")
	cacheConvs := fs.Int("cache-convs", 20000, "conversations a shard writer keeps in memory (more while persist lags)")
	adminAddr := fs.String("admin", "127.0.0.1:0", "listen address of /metrics, /healthz, /readyz and /debug/pprof/ of the whole process (empty: none; in endpoints.json as admin)")
	lim := addLimitFlags(fs)
	dlv := addDeliveryFlags(fs)
	sec := addSecFlags(fs)
	checkFlags(fs, notNegative("workers"), atLeast("vshards", 1), atLeast("partitions", 1),
		notNegative("linger"), atLeast("cache-convs", 1))
	level, format := logFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if *kafkaAddrs == "" && sec.kafka.On() {
		return errEmbeddedSecured
	}
	log, err := newLogger(*level, *format)
	if err != nil {
		return err
	}
	dir, err := filepath.Abs(*dataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	key, err := auth.LoadSecret(*secret, dir, true)
	if err != nil {
		return err
	}
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()

	// Infrastructure.
	etcdEndpoints := splitList(*etcdAddrs)
	if len(etcdEndpoints) == 0 {
		etcd, err := devstack.StartEtcd(ctx, filepath.Join(dir, "etcd"), 0, log)
		if err != nil {
			return err
		}
		closers = append(closers, func() { etcd.Close() })
		etcdEndpoints = etcd.Endpoints()
	}
	brokers := splitList(*kafkaAddrs)
	if len(brokers) == 0 {
		kafka, err := devstack.StartKafka(filepath.Join(dir, "kafka"), 0, log)
		if err != nil {
			return err
		}
		closers = append(closers, kafka.Close)
		brokers = []string{kafka.Addr()}
	}
	kopts, err := sec.kafkaOpts(ctx, brokers)
	if err != nil {
		return err
	}
	pgURL := *dbURL
	if pgURL == "" {
		pg, err := devstack.StartPostgres(ctx, filepath.Join(dir, "postgres"), 0, log)
		if err != nil {
			return err
		}
		closers = append(closers, func() { pg.Close() })
		pgURL = pg.URL()
	}
	cli, err := dialEtcd(ctx, etcdEndpoints, sec)
	if err != nil {
		return err
	}
	closers = append(closers, func() { cli.Close() })
	cfg, err := lease.EnsureConfig(ctx, cli, lease.DefaultPrefix, lease.Config{VShards: *vshards, Partitions: *partitions, Topic: logrecord.DefaultTopic})
	if err != nil {
		return err
	}
	if err := devstack.EnsureTopic(ctx, brokers, cfg.Topic, cfg.Partitions, kopts...); err != nil {
		return err
	}
	db, err := openDB(ctx, pgURL)
	if err != nil {
		return err
	}
	closers = append(closers, db.Close)
	if err := schema.Migrate(ctx, db); err != nil {
		return err
	}

	// Roles.
	roleCtx, stopRoles := context.WithCancel(context.Background())
	var roles sync.WaitGroup
	closers = append(closers, func() { stopRoles(); roles.Wait() })
	start := func(name string, run func(context.Context) error) {
		roles.Add(1)
		go func() {
			defer roles.Done()
			if err := run(roleCtx); err != nil {
				log.Error("role failed", "role", name, "err", err)
			}
		}()
	}
	var metrics []prometheus.Collector
	deps := func(role string) consumerDeps {
		return consumerDeps{Brokers: brokers, KafkaOpts: kopts, Topic: cfg.Topic, DB: db, Log: log.With("role", role)}
	}
	if *runPersist {
		p, err := newPersist(deps("persist"))
		if err != nil {
			return err
		}
		metrics = append(metrics, p.Collectors()...)
		start("persist", p.Run)
	}
	if *runProj {
		p, err := newProjection(deps("projection"), 0, false)
		if err != nil {
			return err
		}
		metrics = append(metrics, p.Collectors()...)
		start("projection", p.Run)
	}
	var ws []*shardworker.Worker
	for i := 1; i <= *workers; i++ {
		w, err := newWorker(fmt.Sprintf("w%d", i), "", "", "", cli, cfg, brokers, kopts, db, *linger, *cacheConvs, lim, log)
		if err != nil {
			return err
		}
		metrics = append(metrics, w.Collectors()...)
		start("worker", w.Run)
		ws = append(ws, w)
	}
	// Ready means every vshard has a writer accepting commands.
	waitAccepting(ctx, ws, cfg.VShards, log)

	g, err := newGatewayRole(roleCtx, key, *httpAddr, lim, dlv, metrics,
		webDeps{Etcd: cli, Config: cfg, DB: db, Brokers: brokers, KafkaOpts: kopts, Secret: key, Dev: true, Log: log.With("role", "web")}, log)
	if err != nil {
		return err
	}
	start("delivery", g.feed.Run)
	closers = append(closers, g.shutdown)
	adminURL := ""
	admin, err := g.serveAdmin(*adminAddr, log)
	if err != nil {
		return err
	}
	if admin != nil {
		closers = append(closers, admin.Close)
		adminURL = "http://" + admin.Addr()
	}
	srvErr := g.serve()
	ln := g.ln

	httpURL := "http://" + ln.Addr().String()
	ep := Endpoints{
		WebSocket: "ws://" + ln.Addr().String() + "/v1/ws", HTTP: httpURL,
		Kafka: brokers, Topic: cfg.Topic, Postgres: pgURL, Etcd: etcdEndpoints, Prefix: lease.DefaultPrefix, Metrics: httpURL + "/metrics", Admin: adminURL,
		VShards: cfg.VShards, Partitions: cfg.Partitions, PID: os.Getpid(),
	}
	b, _ := json.MarshalIndent(ep, "", "  ")
	epPath := filepath.Join(dir, "endpoints.json")
	if err := atomicfile.Write(epPath, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write endpoints: %w", err)
	}
	closers = append(closers, func() { os.Remove(epPath) })
	fmt.Printf(`chatpipe dev is running (data in %s)
  websocket  %s
  pages      %s/?user=alice (chat)   %s/ops (pipeline)
  kafka      %s  topic %s (read with isolation.level=read_committed)
  postgres   %s
  etcd       %s
  endpoints  %s
  get a token: chatpipe token --data-dir %s --user alice
Press Ctrl-C to stop.
`, dir, ep.WebSocket, httpURL, httpURL, brokers[0], cfg.Topic, pgURL, etcdEndpoints[0], epPath, dir)
	log.Info("ready", "websocket", ep.WebSocket)

	select {
	case <-ctx.Done():
		log.Info("stopping")
	case err := <-srvErr:
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http server: %w", err)
		}
	}
	return nil
}

// waitAccepting waits (at most a minute) until the workers accept commands
// for all vshards between them.
func waitAccepting(ctx context.Context, ws []*shardworker.Worker, vshards int, log *slog.Logger) {
	if len(ws) == 0 {
		return
	}
	deadline := time.Now().Add(time.Minute)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		n := 0
		for _, w := range ws {
			n += len(w.Owned())
		}
		if n >= vshards {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	log.Warn("not every vshard has an accepting writer yet; starting anyway")
}
