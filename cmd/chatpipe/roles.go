package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/chatpipe/chatpipe/gateway"
	"github.com/chatpipe/chatpipe/internal/auth"
	"github.com/chatpipe/chatpipe/internal/delivery"
	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/internal/logsink"
	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/persist"
	"github.com/chatpipe/chatpipe/shardworker"
)

// infraFlags are the flags of roles that join a running stack.
type infraFlags struct {
	endpoints, etcd, kafka, dbURL, topic *string
	sec                                  *secFlags
}

func addInfraFlags(fs *flagSet) infraFlags {
	return infraFlags{
		endpoints: fs.String("endpoints", "", "endpoints.json of a running 'chatpipe dev'; fills --etcd, --kafka and --database-url"),
		etcd:      fs.String("etcd", "", "etcd endpoints, comma separated"),
		kafka:     fs.String("kafka", "", "Kafka bootstrap brokers, comma separated"),
		dbURL:     fs.String("database-url", "", "Postgres URL"),
		topic:     fs.String("topic", logrecord.DefaultTopic, "log topic"),
		sec:       addSecFlags(fs),
	}
}

func (f infraFlags) resolve() error {
	if *f.endpoints == "" {
		return nil
	}
	ep, err := readEndpoints(*f.endpoints)
	if err != nil {
		return err
	}
	if *f.etcd == "" {
		*f.etcd = joinList(ep.Etcd)
	}
	if *f.kafka == "" {
		*f.kafka = joinList(ep.Kafka)
	}
	if *f.dbURL == "" {
		*f.dbURL = ep.Postgres
	}
	return nil
}

// setup fills the infrastructure flags from --endpoints and makes the
// logger.
func (f infraFlags) setup(level, format *string) (*slog.Logger, error) {
	if err := f.resolve(); err != nil {
		return nil, err
	}
	return newLogger(*level, *format)
}

func joinList(l []string) string {
	s := ""
	for i, x := range l {
		if i > 0 {
			s += ","
		}
		s += x
	}
	return s
}

// newWorkerCommand makes chatpipe worker.
func newWorkerCommand() *command {
	fs := newFlagSet("worker")
	inf := addInfraFlags(fs)
	id := fs.String("id", "", "worker id, unique in the deployment: its owner rows and the worker label of its metrics (default: <hostname>-<port> with a fixed --listen port, so a restarted worker keeps it; worker-<random> with port 0)")
	listen := fs.String("listen", "127.0.0.1:0", "gateway-facing listen address (port 0: a free one, advertised in etcd)")
	advertise := fs.String("advertise", "", "address gateways dial (default: the listener's)")
	adminAddr := fs.String("admin", "127.0.0.1:0", "listen address of /metrics, /healthz, /readyz and /debug/pprof/ (advertised in etcd)")
	linger := fs.Duration("linger", 0, "extra time a shard writer waits for a batch to fill before committing")
	cacheConvs := fs.Int("cache-convs", 20000, "conversations a shard writer keeps in memory (more while persist lags)")
	txnTimeout := fs.Duration("txn-timeout", 10*time.Second, "Kafka transaction.timeout of the shard writers")
	leaseTTL := fs.Int64("lease-ttl", lease.DefaultTTL, leaseTTLUsage)
	persistListen := fs.Bool("persist-listen", true, "LISTEN for persist's commits to learn its stored offsets instead of reading them whenever a writer trims (false: e.g. behind a transaction-pooling proxy)")
	lim := addLimitFlags(fs)
	fs.check(notNegative("linger"), atLeast("cache-convs", 1), positive("txn-timeout"), atLeast("lease-ttl", 2))
	level, format := logFlags(fs)
	return newCommand(fs, "own virtual shards and write their conversations to Kafka", func(ctx context.Context, _ []string) error {
		log, err := inf.setup(level, format)
		if err != nil {
			return err
		}
		if *inf.etcd == "" || *inf.kafka == "" || *inf.dbURL == "" {
			return errors.New("need --endpoints, or --etcd, --kafka and --database-url")
		}
		if *id == "" {
			*id = defaultWorkerID(*listen)
		}
		kopts, err := inf.kafkaOpts(ctx)
		if err != nil {
			return err
		}
		cli, cfg, err := etcdConfig(ctx, *inf.etcd, inf.sec, lease.Config{})
		if err != nil {
			return err
		}
		defer cli.Close()
		db, err := openDB(ctx, *inf.dbURL)
		if err != nil {
			return err
		}
		defer db.Close()
		ln, err := listenAdmin(*adminAddr)
		if err != nil {
			return err
		}
		w, err := newWorker(workerOpts{id: *id, listen: *listen, advertise: *advertise, admin: shardworker.Advertised(ln.Addr().String()),
			cli: cli, cfg: cfg, brokers: splitList(*inf.kafka), kopts: kopts, db: db,
			linger: *linger, cacheConvs: *cacheConvs, leaseTTL: *leaseTTL, noListen: !*persistListen, lim: lim, log: log})
		if err != nil {
			ln.Close()
			return err
		}
		w.SetTxnTimeout(*txnTimeout)
		admin := serveAdmin(ln, newRegistry(append(w.Collectors(), lim.linkCollectors()...)...), w.Healthy, nil, log, shardworker.MountHot(w.Hot))
		defer admin.Close()
		log.Info("worker starting", "id", *id, "admin", admin.Addr())
		return w.Run(ctx)
	})
}

// logConsumer is what the persist role runs.
type logConsumer interface {
	Run(ctx context.Context) error
	Collectors() []prometheus.Collector
	CaughtUp(maxLag int64) error
	Degraded(ctx context.Context) string
}

// consumerDeps is what a consumer of the log is made from.
type consumerDeps struct {
	Brokers   []string
	KafkaOpts []kgo.Opt
	Topic     string
	DB        *pgxpool.Pool
	Pace      logsink.Pace
	Retain    time.Duration // delivery outbox rows (0: the default)
	Log       *slog.Logger
}

// newLogConsumerCommand makes the command of a consumer of the log, run as
// its own process: flags, Postgres with migrations, and an admin server
// whose /readyz is "caught up" (503 while behind or stopped at a record of
// a newer schema version; 200 "ready, degraded: N dead letters …" once it
// has dead letters). addFlags adds the role's own flags; build makes the
// consumer.
func newLogConsumerCommand(name, help string, addFlags func(*flagSet), build func(consumerDeps) (logConsumer, error)) *command {
	fs := newFlagSet(name)
	inf := addInfraFlags(fs)
	adminAddr := fs.String("admin", "127.0.0.1:0", "listen address of /metrics, /healthz, /readyz and /debug/pprof/")
	maxLag := fs.Int64("ready-lag", 10000, "/readyz fails while a partition lags by more records than this")
	txnBudget := fs.Float64("txn-budget", logsink.DefaultTxnBudget, "Postgres transactions/s this consumer aims to stay under; it lingers (up to --linger-max) for its batch to fill once records arrive faster")
	lingerMax := fs.Duration("linger-max", logsink.DefaultLingerMax, "latency budget of the consumer's group commit: the longest it waits for its batch to fill (0: never wait)")
	fs.check(notNegative("ready-lag"), positive("txn-budget"), notNegative("linger-max"))
	if addFlags != nil {
		addFlags(fs)
	}
	level, format := logFlags(fs)
	return newCommand(fs, help, func(ctx context.Context, _ []string) error {
		log, err := inf.setup(level, format)
		if err != nil {
			return err
		}
		if *inf.kafka == "" || *inf.dbURL == "" {
			return errors.New("need --endpoints, or --kafka and --database-url")
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
		pace := logsink.Pace{TxnBudget: *txnBudget, LingerMax: *lingerMax}
		if pace.LingerMax == 0 {
			pace.LingerMax = -1 // never wait
		}
		c, err := build(consumerDeps{Brokers: splitList(*inf.kafka), KafkaOpts: kopts, Topic: *inf.topic, DB: db, Pace: pace, Log: log})
		if err != nil {
			return err
		}
		ln, err := listenAdmin(*adminAddr)
		if err != nil {
			return err
		}
		admin := serveAdmin(ln, newRegistry(c.Collectors()...), func() error { return c.CaughtUp(*maxLag) }, c.Degraded, log)
		defer admin.Close()
		log.Info(name+" starting", "admin", admin.Addr())
		return c.Run(ctx)
	})
}

// newPersistCommand makes chatpipe persist.
func newPersistCommand() *command {
	var retain *time.Duration
	return newLogConsumerCommand("persist", "copy the committed log into Postgres: its events and the read model (memberships, conversation list, delivery outbox)",
		func(fs *flagSet) {
			retain = fs.Duration("retain", 0, "how long delivery outbox rows are kept for gateways (default 1h)")
			fs.check(notNegative("retain"))
		},
		func(d consumerDeps) (logConsumer, error) {
			d.Retain = *retain
			return newPersist(d)
		})
}

// newPersist makes the persist role's consumer.
func newPersist(d consumerDeps) (logConsumer, error) {
	return persist.New(persist.Config{Brokers: d.Brokers, KafkaOpts: d.KafkaOpts, Topic: d.Topic, DB: d.DB, Pace: d.Pace, Retain: d.Retain, Log: d.Log})
}

// newGatewayCommand makes chatpipe gateway.
func newGatewayCommand() *command {
	fs := newFlagSet("gateway")
	inf := addInfraFlags(fs)
	httpAddr := fs.String("http", "127.0.0.1:8080", "listen address (websocket at /v1/ws)")
	tokens := addTokenFlags(fs, "JWT HS256 secret (default: --jwt-secret-file, else CHATPIPE_JWT_SECRET, else the file in --data-dir; none with --jwks-url: HS256 off)")
	dataDir := fs.String("data-dir", "", "data dir holding a generated JWT secret")
	lim := addLimitFlags(fs)
	dlv := addDeliveryFlags(fs)
	pages := fs.Bool("pages", true, "serve the chat page (/) on the --http address")
	opsPublic := fs.Bool("ops-public", false, "serve the pipeline page (/ops, with /ops/state) on the --http address too; it shows the deployment's workers and addresses, and is always on --admin")
	metricsPublic := fs.Bool("metrics-public", false, "serve /metrics on the --http address too; it is always on --admin")
	adminAddr := fs.String("admin", "127.0.0.1:0", "listen address of /metrics, /healthz, /readyz, /debug/pprof/ and the pipeline page /ops (empty: none)")
	level, format := logFlags(fs)
	return newCommand(fs, "serve the websocket protocol and route commands to workers", func(ctx context.Context, _ []string) error {
		log, err := inf.setup(level, format)
		if err != nil {
			return err
		}
		if *inf.etcd == "" || *inf.dbURL == "" {
			return errors.New("need --endpoints, or --etcd and --database-url (sync, history and delivery read Postgres)")
		}
		var kopts []kgo.Opt
		if *inf.kafka != "" {
			if kopts, err = inf.kafkaOpts(ctx); err != nil {
				return err
			}
		}
		key, err := tokens.loadSecret(*dataDir, false)
		if err != nil {
			return err
		}
		if key != nil && len(key) < auth.MinSecretBytes {
			return fmt.Errorf("the JWT secret is %d bytes; HS256 needs at least %d (e.g. openssl rand -hex 32)", len(key), auth.MinSecretBytes)
		}
		verifier, err := tokens.verifier(ctx, key, log)
		if err != nil {
			return err
		}
		defer verifier.Close()
		cli, cfg, err := etcdConfig(ctx, *inf.etcd, inf.sec, lease.Config{})
		if err != nil {
			return err
		}
		defer cli.Close()
		db, err := openDB(ctx, *inf.dbURL)
		if err != nil {
			return err
		}
		defer db.Close()
		g, err := newGatewayRole(ctx, verifier, *httpAddr, lim, dlv, nil,
			webDeps{Etcd: cli, Config: cfg, DB: db, Brokers: splitList(*inf.kafka), KafkaOpts: kopts, NoChat: !*pages, OpsPublic: *opsPublic, MetricsPublic: *metricsPublic, Log: log.With("role", "web")}, log)
		if err != nil {
			return err
		}
		admin, err := g.serveAdmin(*adminAddr, log)
		if err != nil {
			return err
		}
		if admin != nil {
			defer admin.Close()
			log.Info("gateway admin listening", "admin", admin.Addr())
		}
		feedCtx, stopFeed := context.WithCancel(context.Background())
		feedDone := make(chan struct{})
		go func() { defer close(feedDone); g.feed.Run(feedCtx) }()
		defer func() { stopFeed(); <-feedDone }()
		errc := g.serve()
		log.Info("gateway listening", "addr", g.ln.Addr().String())
		select {
		case <-ctx.Done():
		case err := <-errc:
			if !errors.Is(err, http.ErrServerClosed) {
				return err
			}
		}
		g.shutdown()
		return nil
	})
}

// gatewayRole is a gateway with its HTTP server (websocket, /healthz,
// /readyz, the chat page; /metrics and /ops only if asked), its delivery
// feed, the registry its /metrics serves and the pipeline page its admin
// listener serves.
type gatewayRole struct {
	gw   *gateway.Gateway
	srv  *http.Server
	ln   net.Listener
	feed *delivery.Feed
	reg  *prometheus.Registry
	// pages mounts the chat page and/or the pipeline page (/ops,
	// /ops/state) on a mux; nil without the web pages.
	pages func(mux *http.ServeMux, chat, ops bool)
}

// newGatewayRole makes a gateway listening on addr that reads web.DB and
// follows owners in web.Etcd until ctx ends, and its feed; the registry
// holds the gateway's and the feed's metrics and more (other roles of the
// process). Run the feed and call serve to start it.
func newGatewayRole(ctx context.Context, tokens *auth.Verifier, addr string, lim limitFlags, dlv deliveryFlags,
	more []prometheus.Collector, web webDeps, log *slog.Logger) (*gatewayRole, error) {
	gw, srv, ln, err := startGateway(ctx, web.Etcd, web.Config, tokens, addr, web.DB, lim, log)
	if err != nil {
		return nil, err
	}
	g := &gatewayRole{gw: gw, srv: srv, ln: ln, feed: dlv.feed(web.DB, gw, log)}
	metrics := append(append(append(append([]prometheus.Collector{}, more...), gw.Collectors()...), g.feed.Collectors()...), lim.linkCollectors()...)
	g.reg = newRegistry(metrics...)
	mh := promhttp.HandlerFor(g.reg, promhttp.HandlerOpts{})
	mux := http.NewServeMux()
	mux.Handle("/", gw.Handler())
	if newPages != nil {
		g.pages = newPages(web, mh)
		g.pages(mux, !web.NoChat, web.OpsPublic)
	}
	if web.MetricsPublic {
		mux.Handle("GET /metrics", mh)
	}
	srv.Handler = mux
	return g, nil
}

// serveAdmin serves the gateway's metrics, readiness and pipeline page, and
// what more mounts, on addr; an empty addr serves none and returns nil.
func (g *gatewayRole) serveAdmin(addr string, log *slog.Logger, more ...func(*http.ServeMux)) (*adminServer, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := listenAdmin(addr)
	if err != nil {
		return nil, err
	}
	mounts := more
	if g.pages != nil {
		mounts = append(mounts, func(mux *http.ServeMux) { g.pages(mux, false, true) })
	}
	return serveAdmin(ln, g.reg, g.gw.Ready, nil, log, mounts...), nil
}

// serve serves HTTP on the gateway's listener; the channel gets the
// server's error (http.ErrServerClosed after shutdown).
func (g *gatewayRole) serve() <-chan error {
	errc := make(chan error, 1)
	go func() { errc <- g.srv.Serve(g.ln) }()
	return errc
}

// shutdown stops the HTTP server, then the gateway's connections, in 10 s
// at most.
func (g *gatewayRole) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = g.srv.Shutdown(ctx)
	g.gw.Shutdown(ctx)
}

// workerOpts is what newWorker builds a shard worker from: the command's
// flags and the deployment's connections.
type workerOpts struct {
	id, listen, advertise, admin string
	cli                          *clientv3.Client
	cfg                          lease.Config
	brokers                      []string
	kopts                        []kgo.Opt
	db                           *pgxpool.Pool
	linger                       time.Duration
	cacheConvs                   int
	leaseTTL                     int64 // seconds
	noListen                     bool  // no LISTEN for persist's commits
	lim                          limitFlags
	log                          *slog.Logger
}

func newWorker(o workerOpts) (*shardworker.Worker, error) {
	wc := shardworker.Config{
		ID: o.id, Listen: o.listen, Advertise: o.advertise, AdminAddr: o.admin, Etcd: o.cli, Prefix: lease.DefaultPrefix,
		Brokers: o.brokers, KafkaOpts: o.kopts, Topic: o.cfg.Topic, VShards: o.cfg.VShards, Partitions: o.cfg.Partitions,
		Dedicated: o.cfg.Dedicated, DB: o.db, Linger: o.linger, MaxConvs: o.cacheConvs, LeaseTTL: o.leaseTTL, NoListen: o.noListen,
		Log: o.log.With("role", "worker"),
	}
	o.lim.worker(&wc)
	return shardworker.New(wc)
}

// leaseTTLUsage is the help of the worker's and dev's --lease-ttl.
const leaseTTLUsage = "seconds a worker's etcd lease lives without a renewal (renewed every third of it): how long a dead or paused worker keeps its vshards, and the coordinator's election, before others take them over"

// linkCollectors are the link certificate's expiry gauge when the
// gateway↔worker link is mutual TLS, else none.
func (l limitFlags) linkCollectors() []prometheus.Collector {
	if c := l.wire.link.creds; c != nil {
		return []prometheus.Collector{c.ExpiryGauge()}
	}
	return nil
}

// startGateway makes a gateway and its listener; with db it answers sync and
// history (run a delivery.Feed beside it to push events).
func startGateway(ctx context.Context, cli *clientv3.Client, cfg lease.Config, tokens *auth.Verifier, addr string, db *pgxpool.Pool, lim limitFlags, log *slog.Logger) (*gateway.Gateway, *http.Server, net.Listener, error) {
	watcher, err := lease.Watch(ctx, cli, lease.DefaultPrefix, log)
	if err != nil {
		return nil, nil, nil, err
	}
	gcfg := gateway.Config{Owners: watcher, VShards: cfg.VShards, Dedicated: cfg.Dedicated, Tokens: tokens, Log: log.With("role", "gateway")}
	if db != nil {
		gcfg.Reads = &delivery.Store{DB: db}
	}
	lim.gateway(&gcfg)
	gw, err := gateway.New(gcfg)
	if err != nil {
		return nil, nil, nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("gateway listen: %w", err)
	}
	srv := &http.Server{Handler: gw.Handler(), ReadHeaderTimeout: 10 * time.Second}
	return gw, srv, ln, nil
}

// webDeps is what the web pages (newPages) may use.
type webDeps struct {
	Etcd    *clientv3.Client
	Config  lease.Config
	DB      *pgxpool.Pool // nil when the gateway has no database
	Brokers []string
	// KafkaOpts are the Kafka client options (TLS, SASL) of the ops page.
	KafkaOpts []kgo.Opt
	Secret    []byte // JWT secret; used only when Dev is set
	Dev       bool   // chatpipe dev: dev-only endpoints (minting tokens) are on
	// Issuer and Audience go into the tokens Dev mints (the gateway's
	// --jwt-issuer and --jwt-audience).
	Issuer, Audience string
	NoChat           bool // no chat page on the public address (chatpipe gateway --pages=false)
	// OpsPublic serves the pipeline page (/ops, /ops/state) on the public
	// address too; it is on the admin listener regardless.
	OpsPublic bool
	// MetricsPublic serves /metrics on the public address too; it is on
	// the admin listener regardless.
	MetricsPublic bool
	Log           *slog.Logger
}

// newPages, when set (from web.go), makes the browser pages and returns
// what mounts them on a mux: the chat page (/) with chat, the pipeline page
// (/ops, /ops/state, which reads this process's metrics through metrics)
// with ops. It may be called for several muxes; the pipeline's state is
// shared.
var newPages func(d webDeps, metrics http.Handler) func(mux *http.ServeMux, chat, ops bool)

// newKafkaCommand makes chatpipe kafka.
func newKafkaCommand() *command {
	fs := newFlagSet("kafka")
	dataDir := fs.String("data-dir", "chatpipe-kafka", "directory the broker persists its log in")
	port := fs.Int("port", 9092, "listen port on 127.0.0.1 (0: a free one)")
	topic := fs.String("topic", logrecord.DefaultTopic, "topic to create if missing")
	partitions := fs.Int("partitions", devTopicPartitions(), "partitions of the topic (the default fits 'chatpipe dev --kafka' with its defaults: its hashed partitions and one per dedicated vshard)")
	adminAddr := fs.String("admin", "", "listen address of /metrics (Go and process collectors) and /healthz (default: none)")
	fs.check(portCheck("port", true), atLeast("partitions", 1))
	level, format := logFlags(fs)
	return newCommand(fs, "run a standalone dev Kafka broker (kfake) with a data dir", func(ctx context.Context, _ []string) error {
		log, err := newLogger(*level, *format)
		if err != nil {
			return err
		}
		k, err := devstack.StartKafka(*dataDir, *port, log)
		if err != nil {
			return err
		}
		defer k.Close()
		if err := devstack.EnsureTopic(ctx, []string{k.Addr()}, *topic, *partitions); err != nil {
			return err
		}
		if *adminAddr != "" {
			ln, err := listenAdmin(*adminAddr)
			if err != nil {
				return err
			}
			admin := serveAdmin(ln, newRegistry(), func() error { return nil }, nil, log)
			defer admin.Close()
			log.Info("kafka admin listening", "admin", admin.Addr())
		}
		fmt.Println(k.Addr())
		<-ctx.Done()
		return nil
	})
}

// newTokenCommand makes chatpipe token.
func newTokenCommand() *command {
	fs := newFlagSet("token")
	user := fs.String("user", "", "user id (the token's sub)")
	ttl := fs.Duration("ttl", 24*time.Hour, "validity")
	secret := fs.String("jwt-secret", "", "JWT HS256 secret (default: --jwt-secret-file, else CHATPIPE_JWT_SECRET, else the file in --data-dir)")
	secretFile := fs.String("jwt-secret-file", "", "file holding the JWT HS256 secret")
	issuer := fs.String("jwt-issuer", "", "iss of the token (for a gateway with --jwt-issuer)")
	audience := fs.String("jwt-audience", "", "aud of the token (for a gateway with --jwt-audience)")
	dataDir := fs.String("data-dir", "chatpipe-data", "data dir of 'chatpipe dev' holding the generated secret")
	fs.check(positive("ttl"))
	return newCommand(fs, "print a client token for a user", func(_ context.Context, _ []string) error {
		if *user == "" {
			return errors.New("--user is required")
		}
		dir, _ := filepath.Abs(*dataDir)
		key, err := auth.FindSecret(auth.SecretSources{Value: *secret, File: *secretFile, DataDir: dir})
		if err != nil {
			return err
		}
		tok, err := auth.MintFor(key, *user, *ttl, time.Now(), *issuer, *audience)
		if err != nil {
			return err
		}
		fmt.Println(tok)
		return nil
	})
}

// kafkaOpts returns the Kafka client options of the --kafka-tls* and
// --kafka-sasl-* flags, checked against --kafka once (see secFlags).
func (f infraFlags) kafkaOpts(ctx context.Context) ([]kgo.Opt, error) {
	return f.sec.kafkaOpts(ctx, splitList(*f.kafka))
}

// defaultWorkerID is a worker's id when --id is not given. With a fixed
// listen port it is the host's name and that port — and the listen IP
// when it is not a wildcard —, which no other worker on the host can have
// at the same time and which a restarted worker (a container restarted in
// place, a unit restarted by systemd) has again, so its owner rows and the
// worker label of its metrics stay the same across restarts. The host's
// name is $HOSTNAME when set (a container's own, which Docker sets), else
// the kernel's. With port 0 (a free port each start) it is
// worker-<random>.
func defaultWorkerID(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil || port == "" || port == "0" {
		b := make([]byte, 4)
		rand.Read(b)
		return "worker-" + hex.EncodeToString(b)
	}
	name := os.Getenv("HOSTNAME")
	if name == "" {
		name, _ = os.Hostname()
	}
	if name == "" {
		name = "worker"
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		name += "-" + host
	}
	return name + "-" + port
}
