package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/chatpipe/chatpipe/delivery"
	"github.com/chatpipe/chatpipe/gateway"

	"github.com/chatpipe/chatpipe/projection"
)

func init() {
	register("projection", "maintain the read model (memberships, conversation list, delivery outbox) from the log", runProjection)
}

// deliveryFlags configure a gateway's delivery feed.
type deliveryFlags struct {
	poll   *time.Duration
	listen *bool
}

func addDeliveryFlags(fs *flag.FlagSet) deliveryFlags {
	return deliveryFlags{
		poll:   fs.Duration("delivery-poll", time.Second, "how often the gateway reads the delivery outbox without a notification"),
		listen: fs.Bool("delivery-listen", true, "LISTEN for delivery notifications (false: poll only, e.g. behind a transaction-pooling proxy)"),
	}
}

func (f deliveryFlags) feed(db *pgxpool.Pool, gw *gateway.Gateway, log *slog.Logger) *delivery.Feed {
	feed := delivery.NewFeed(db, gw, log.With("role", "delivery"))
	feed.Poll, feed.NoListen = *f.poll, !*f.listen
	return feed
}

func runProjection(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("projection", flag.ContinueOnError)
	inf := addInfraFlags(fs)
	adminAddr := fs.String("admin", "127.0.0.1:0", "listen address of /metrics, /healthz and /readyz")
	maxLag := fs.Int64("ready-lag", 10000, "/readyz fails while a partition lags by more records than this")
	retain := fs.Duration("retain", 0, "how long delivery outbox rows are kept for gateways (default 1h)")
	level, format := logFlags(fs)
	log, err := inf.setup(fs, args, level, format)
	if err != nil {
		return err
	}
	if *inf.kafka == "" || *inf.dbURL == "" {
		return errors.New("need --endpoints, or --kafka and --database-url")
	}
	db, err := openMigratedDB(ctx, *inf.dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	p, err := projection.New(projection.Config{Brokers: splitList(*inf.kafka), Topic: *inf.topic, DB: db, Retain: *retain, Log: log})
	if err != nil {
		return err
	}
	ln, err := listenAdmin(*adminAddr)
	if err != nil {
		return err
	}
	admin := serveAdmin(ln, newRegistry(p.Collectors()...), func() error { return p.CaughtUp(*maxLag) }, log)
	defer admin.Close()
	log.Info("projection starting", "admin", admin.Addr())
	return p.Run(ctx)
}
