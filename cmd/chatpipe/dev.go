package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/chatpipe/chatpipe/internal/atomicfile"
	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/shardworker"
)

// newDevCommand makes chatpipe dev.
func newDevCommand() *command {
	fs := newFlagSet("dev")
	f := addDevFlags(fs)
	return newCommand(fs, "run everything in one process on embedded defaults (etcd, Kafka, Postgres)", func(ctx context.Context, _ []string) error {
		return runDev(ctx, f)
	})
}

// runDev runs the whole pipeline in one process. On exit it stops, in
// this order: endpoints.json, the admin server, the gateway, the other
// roles (delivery feed, workers, persist), then Postgres
// connections, etcd client and the embedded Postgres, Kafka and etcd.
func runDev(ctx context.Context, f devFlags) error {
	if *f.kafka == "" && f.sec.kafka.On() {
		return errEmbeddedSecured
	}
	log, err := newLogger(*f.level, *f.format)
	if err != nil {
		return err
	}
	dir, err := makeDataDir(*f.dataDir)
	if err != nil {
		return err
	}
	key, err := f.tokens.loadSecret(dir, true)
	if err != nil {
		return err
	}
	s := &devStack{}
	defer s.close()
	verifier, err := f.tokens.verifier(ctx, key, log)
	if err != nil {
		return err
	}
	s.onClose(verifier.Close)
	if err := s.start(ctx, f, dir, log); err != nil {
		return err
	}
	roles := newRoleGroup(log)
	s.onClose(roles.stop)
	metrics, err := s.startBackends(ctx, f, roles, log)
	if err != nil {
		return err
	}
	wd := s.webDeps(key, log)
	wd.OpsPublic, wd.MetricsPublic = *f.opsPublic, *f.metricsPublic
	wd.Issuer, wd.Audience = *f.tokens.issuer, *f.tokens.audience // the page's tokens pass the gateway's checks
	g, err := newGatewayRole(roles.ctx, verifier, *f.httpAddr, f.lim, f.dlv, metrics, wd, log)
	if err != nil {
		return err
	}
	roles.start("delivery", g.feed.Run)
	s.onClose(g.shutdown)
	admin, err := g.serveAdmin(*f.admin, log, shardworker.MountHot(shardworker.HotOf(s.workers)))
	if err != nil {
		return err
	}
	if admin != nil {
		s.onClose(admin.Close)
	}
	srvErr := g.serve()
	ep := s.endpoints(g, admin, *f.metricsPublic)
	epPath, err := writeEndpoints(dir, ep)
	if err != nil {
		return err
	}
	s.onClose(func() { os.Remove(epPath) })
	printDevBanner(dir, epPath, ep, *f.opsPublic)
	log.Info("ready", "websocket", ep.WebSocket)
	return waitDev(ctx, srvErr, roles.failed, log)
}

// The shape of a new chatpipe dev deployment. chatpipe kafka creates its
// topic with devTopicPartitions, so that chatpipe dev --kafka finds the
// topic it needs.
const (
	devVShards    = 64 // virtual shards
	devPartitions = 8  // log partitions of the hashed vshards
	devDedicated  = 2  // dedicated vshards, each with a partition of its own
)

// newDevConfig is the deployment chatpipe dev asks etcd for, given its
// --vshards, --partitions and --dedicated: a dedicated of -1 means
// devDedicated (for a new deployment; prepare keeps an existing one's).
func newDevConfig(vshards, partitions, dedicated int) lease.Config {
	if dedicated < 0 {
		dedicated = devDedicated
	}
	return lease.Config{VShards: vshards, Partitions: partitions, Topic: logrecord.DefaultTopic, Dedicated: dedicated}
}

// devTopicPartitions is how many partitions the log topic of a new
// chatpipe dev deployment with the default shape has: the hashed ones
// and one per dedicated vshard.
func devTopicPartitions() int {
	return newDevConfig(devVShards, devPartitions, devDedicated).Layout().TopicPartitions()
}

// devFlags are the flags of chatpipe dev.
type devFlags struct {
	dataDir, httpAddr, dbURL, kafka, etcd, admin        *string
	workers, vshards, partitions, dedicated, cacheConvs *int
	persist, opsPublic, metricsPublic                   *bool
	pgStats                                             *bool
	linger                                              *time.Duration
	leaseTTL                                            *int64
	lim                                                 limitFlags
	dlv                                                 deliveryFlags
	sec                                                 *secFlags
	tokens                                              tokenFlags
	level, format                                       *string
}

func addDevFlags(fs *flagSet) devFlags {
	var f devFlags
	f.dataDir = fs.String("data-dir", "chatpipe-data", "directory for all state (etcd, Kafka, Postgres, the JWT secret)")
	f.httpAddr = fs.String("http", "127.0.0.1:8080", "gateway listen address (websocket at /v1/ws)")
	f.workers = fs.Int("workers", 2, "shard workers to run in this process (0: run none; add them with 'chatpipe worker')")
	f.vshards = fs.Int("vshards", devVShards, "virtual shards (fixed for a deployment; stored in etcd)")
	f.partitions = fs.Int("partitions", devPartitions, "partitions of the log topic for the hashed vshards (fixed for a deployment)")
	f.dedicated = fs.Int("dedicated", -1, "dedicated vshards for hot conversations, each with a partition of its own after the hashed ones (fixed for a deployment; -1: "+strconv.Itoa(devDedicated)+" for a new one, else as stored)")
	f.dbURL = fs.String("database-url", "", "use this Postgres instead of a private cluster under the data dir")
	f.pgStats = fs.Bool("postgres-stats", false, "load pg_stat_statements into the private Postgres and create the extension, to count each statement's calls (costs Postgres a few per cent)")
	f.kafka = fs.String("kafka", "", "use these Kafka brokers (comma separated) instead of an embedded broker")
	f.etcd = fs.String("etcd", "", "use these etcd endpoints (comma separated) instead of an embedded member")
	f.persist = fs.Bool("persist", true, "run persist (the events and the read model) in this process (false: run 'chatpipe persist' yourself)")
	f.tokens = addTokenFlags(fs, "JWT HS256 secret (default: --jwt-secret-file, else CHATPIPE_JWT_SECRET, else generated once into the data dir)")
	f.linger = fs.Duration("linger", 0, "extra time a shard writer waits for a batch to fill before committing")
	f.cacheConvs = fs.Int("cache-convs", 20000, "conversations a shard writer keeps in memory (more while persist lags)")
	f.leaseTTL = fs.Int64("lease-ttl", lease.DefaultTTL, leaseTTLUsage)
	f.admin = fs.String("admin", "127.0.0.1:0", "listen address of /metrics, /healthz, /readyz, /debug/pprof/ and the pipeline page /ops of the whole process (empty: none; in endpoints.json as admin)")
	f.opsPublic = fs.Bool("ops-public", true, "serve the pipeline page (/ops, with /ops/state) on the --http address too (chatpipe gateway: false)")
	f.metricsPublic = fs.Bool("metrics-public", false, "serve /metrics on the --http address too (it is on --admin, which endpoints.json names as metrics)")
	f.lim = addLimitFlags(fs)
	f.dlv = addDeliveryFlags(fs)
	f.sec = addSecFlags(fs)
	fs.check(notNegative("workers"), atLeast("vshards", 1), atLeast("partitions", 1), atLeast("dedicated", -1),
		notNegative("linger"), atLeast("cache-convs", 1), atLeast("lease-ttl", 2))
	f.level, f.format = logFlags(fs)
	return f
}

// makeDataDir makes the data dir and returns its absolute path.
func makeDataDir(dataDir string) (string, error) {
	dir, err := filepath.Abs(dataDir)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("data dir: %w", err)
	}
	return dir, nil
}

// devStack is the infrastructure of chatpipe dev (etcd, Kafka and
// Postgres, embedded unless given) and what to close on exit, last opened
// first.
type devStack struct {
	etcd    []string
	brokers []string
	kopts   []kgo.Opt
	pgURL   string
	cli     *clientv3.Client
	cfg     lease.Config
	db      *pgxpool.Pool
	workers []*shardworker.Worker // in-process; their /debug/hot is the process's admin server's
	closers []func()
}

func (s *devStack) onClose(f func()) { s.closers = append(s.closers, f) }

func (s *devStack) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
}

// start brings up etcd, Kafka and Postgres, the deployment's config in
// etcd, the topic and the schema.
func (s *devStack) start(ctx context.Context, f devFlags, dir string, log *slog.Logger) error {
	// The embedded Postgres (its start is the longest of the three) comes
	// up beside etcd and Kafka; it is closed after them, as if started last.
	pgCtx, cancelPG := context.WithCancel(ctx)
	defer cancelPG()
	var pg *devstack.Postgres
	pgErr := make(chan error, 1)
	if s.pgURL = *f.dbURL; s.pgURL == "" {
		go func() {
			var err error
			var setup devstack.PostgresSetup
			if *f.pgStats {
				setup.Settings = []string{"shared_preload_libraries=pg_stat_statements"}
			}
			pg, err = devstack.StartPostgresWith(pgCtx, filepath.Join(dir, "postgres"), 0, setup, log)
			pgErr <- err
		}()
	} else {
		pgErr <- nil
	}
	err := s.startEtcd(ctx, *f.etcd, dir, log)
	if err == nil {
		err = s.startKafka(ctx, *f.kafka, f.sec, dir, log)
	}
	if err != nil {
		cancelPG() // no need to wait for a start that is not used
	}
	if perr := <-pgErr; err == nil {
		err = perr
	}
	if pg != nil {
		s.onClose(func() { pg.Close() })
		s.pgURL = pg.URL()
	}
	if err != nil {
		return err
	}
	return s.prepare(ctx, f)
}

func (s *devStack) startEtcd(ctx context.Context, addrs, dir string, log *slog.Logger) error {
	if s.etcd = splitList(addrs); len(s.etcd) > 0 {
		return nil
	}
	etcd, err := devstack.StartEtcd(ctx, filepath.Join(dir, "etcd"), 0, log)
	if err != nil {
		return err
	}
	s.onClose(func() { etcd.Close() })
	s.etcd = etcd.Endpoints()
	return nil
}

func (s *devStack) startKafka(ctx context.Context, addrs string, sec *secFlags, dir string, log *slog.Logger) error {
	if s.brokers = splitList(addrs); len(s.brokers) == 0 {
		kafka, err := devstack.StartKafka(filepath.Join(dir, "kafka"), 0, log)
		if err != nil {
			return err
		}
		s.onClose(kafka.Close)
		s.brokers = []string{kafka.Addr()}
	}
	var err error
	s.kopts, err = sec.kafkaOpts(ctx, s.brokers)
	return err
}

// prepare writes (or checks) the deployment's config in etcd, makes the
// topic and migrates the schema.
func (s *devStack) prepare(ctx context.Context, f devFlags) error {
	cli, err := dialEtcd(ctx, s.etcd, f.sec)
	if err != nil {
		return err
	}
	s.cli = cli
	s.onClose(func() { cli.Close() })
	want := newDevConfig(*f.vshards, *f.partitions, *f.dedicated)
	if *f.dedicated < 0 {
		// devDedicated for a new deployment; an existing one keeps what
		// it has.
		if have, err := lease.EnsureConfig(ctx, cli, lease.DefaultPrefix, lease.Config{}); err == nil {
			want.Dedicated = have.Dedicated
		}
	}
	if s.cfg, err = lease.EnsureConfig(ctx, cli, lease.DefaultPrefix, want); err != nil {
		return err
	}
	if err := devstack.EnsureTopic(ctx, s.brokers, s.cfg.Topic, s.cfg.Layout().TopicPartitions(), s.kopts...); err != nil {
		return err
	}
	if s.db, err = openMigratedDB(ctx, s.pgURL); err != nil {
		return err
	}
	s.onClose(s.db.Close)
	if *f.pgStats {
		if _, err := s.db.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
			return fmt.Errorf("--postgres-stats: %w", err)
		}
	}
	return nil
}

// startBackends starts persist and the shard workers that f
// asks for, waits until every vshard has a writer accepting commands, and
// returns their metrics.
func (s *devStack) startBackends(ctx context.Context, f devFlags, roles *roleGroup, log *slog.Logger) ([]prometheus.Collector, error) {
	metrics, err := s.startConsumers(f, roles, log)
	if err != nil {
		return nil, err
	}
	var ws []*shardworker.Worker
	for i := 1; i <= *f.workers; i++ {
		w, err := newWorker(workerOpts{id: fmt.Sprintf("w%d", i), cli: s.cli, cfg: s.cfg, brokers: s.brokers, kopts: s.kopts, db: s.db,
			linger: *f.linger, cacheConvs: *f.cacheConvs, leaseTTL: *f.leaseTTL, lim: f.lim, log: log})
		if err != nil {
			return nil, err
		}
		metrics = append(metrics, w.Collectors()...)
		roles.start("worker", w.Run)
		ws = append(ws, w)
	}
	s.workers = ws
	waitAccepting(ctx, ws, s.cfg.Layout().AllVShards(), log)
	return metrics, nil
}

// startConsumers starts persist (with chatpipe persist's defaults) unless f
// turns it off, and returns its metrics.
func (s *devStack) startConsumers(f devFlags, roles *roleGroup, log *slog.Logger) ([]prometheus.Collector, error) {
	if !*f.persist {
		return nil, nil
	}
	lc, err := newPersist(consumerDeps{Brokers: s.brokers, KafkaOpts: s.kopts, Topic: s.cfg.Topic, DB: s.db, Log: log.With("role", "persist")})
	if err != nil {
		return nil, err
	}
	roles.start("persist", lc.Run)
	return lc.Collectors(), nil
}

// webDeps are the web pages' dependencies in dev: the dev-only endpoints
// (minting tokens with key) are on.
func (s *devStack) webDeps(key []byte, log *slog.Logger) webDeps {
	return webDeps{Etcd: s.cli, Config: s.cfg, DB: s.db, Brokers: s.brokers, KafkaOpts: s.kopts, Secret: key, Dev: true, Log: log.With("role", "web")}
}

// endpoints describes the running stack; admin may be nil. Its metrics
// URL is the admin listener's, or the public address's with
// metricsPublic (empty if neither serves it).
func (s *devStack) endpoints(g *gatewayRole, admin *adminServer, metricsPublic bool) Endpoints {
	addr := g.ln.Addr().String()
	httpURL := "http://" + addr
	adminURL, metricsURL := "", ""
	if admin != nil {
		adminURL = "http://" + admin.Addr()
		metricsURL = adminURL + "/metrics"
	}
	if metricsPublic {
		metricsURL = httpURL + "/metrics"
	}
	return Endpoints{
		WebSocket: "ws://" + addr + "/v1/ws", HTTP: httpURL,
		Kafka: s.brokers, Topic: s.cfg.Topic, Postgres: s.pgURL, Etcd: s.etcd, Prefix: lease.DefaultPrefix, Metrics: metricsURL, Admin: adminURL,
		VShards: s.cfg.VShards, Partitions: s.cfg.Partitions, Dedicated: s.cfg.Dedicated, PID: os.Getpid(),
	}
}

// writeEndpoints writes ep to DIR/endpoints.json and returns its path.
func writeEndpoints(dir string, ep Endpoints) (string, error) {
	b, _ := json.MarshalIndent(ep, "", "  ")
	path := filepath.Join(dir, "endpoints.json")
	if err := atomicfile.Write(path, append(b, '\n'), 0o644); err != nil {
		return "", fmt.Errorf("write endpoints: %w", err)
	}
	return path, nil
}

// printDevBanner says where everything is; the pipeline page is on the
// public address with opsPublic, else on the admin address (if any).
func printDevBanner(dir, epPath string, ep Endpoints, opsPublic bool) {
	ops := "(pipeline page off: no --admin address)"
	switch {
	case opsPublic:
		ops = ep.HTTP + "/ops (pipeline)"
	case ep.Admin != "":
		ops = ep.Admin + "/ops (pipeline)"
	}
	admin := "none"
	if ep.Admin != "" {
		admin = ep.Admin + "  (/metrics, /readyz, /ops, /debug/pprof/)"
	}
	fmt.Printf(`chatpipe dev is running (data in %s)
  websocket  %s
  pages      %s/?user=alice (chat)   %s
  admin      %s
  kafka      %s  topic %s (read with isolation.level=read_committed)
  postgres   %s
  etcd       %s
  endpoints  %s
  get a token: chatpipe token --data-dir %s --user alice
Press Ctrl-C to stop.
`, dir, ep.WebSocket, ep.HTTP, ops, admin, ep.Kafka[0], ep.Topic, ep.Postgres, ep.Etcd[0], epPath, dir)
}

// waitDev waits for ctx to end, the gateway's HTTP server to fail or a
// role to fail.
func waitDev(ctx context.Context, srvErr <-chan error, roleErr <-chan error, log *slog.Logger) error {
	select {
	case <-ctx.Done():
		log.Info("stopping")
	case err := <-roleErr:
		return err
	case err := <-srvErr:
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http server: %w", err)
		}
	}
	return nil
}

// roleGroup runs the roles of chatpipe dev on one context until stop. A
// role that returns an error before stop is logged and reported on failed:
// chatpipe dev then stops (exit status 1) rather than go on, and keep
// reporting ready, without it.
type roleGroup struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	log    *slog.Logger
	failed chan error // the first role error, buffered
}

func newRoleGroup(log *slog.Logger) *roleGroup {
	ctx, cancel := context.WithCancel(context.Background())
	return &roleGroup{ctx: ctx, cancel: cancel, log: log, failed: make(chan error, 1)}
}

func (g *roleGroup) start(name string, run func(context.Context) error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := run(g.ctx); err != nil && g.ctx.Err() == nil {
			g.log.Error("role failed", "role", name, "err", err)
			select {
			case g.failed <- fmt.Errorf("role %s failed: %w", name, err):
			default:
			}
		}
	}()
}

// stop cancels the roles' context and waits for them to return.
func (g *roleGroup) stop() {
	g.cancel()
	g.wg.Wait()
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
