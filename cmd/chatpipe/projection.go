package main

import (
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/chatpipe/chatpipe/gateway"
	"github.com/chatpipe/chatpipe/internal/delivery"

	"github.com/chatpipe/chatpipe/projection"
)

// deliveryFlags configure a gateway's delivery feed.
type deliveryFlags struct {
	poll   *time.Duration
	listen *bool
}

func addDeliveryFlags(fs *flagSet) deliveryFlags {
	fs.check(positive("delivery-poll"))
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

// newProjectionCommand makes chatpipe projection.
func newProjectionCommand() *command {
	var retain *time.Duration
	var listen *bool
	return newLogConsumerCommand("projection", "maintain the read model (memberships, conversation list, delivery outbox) from the log",
		func(fs *flagSet) {
			retain = fs.Duration("retain", 0, "how long delivery outbox rows are kept for gateways (default 1h)")
			listen = fs.Bool("persist-listen", true, "LISTEN for persist's commits instead of only polling for them (false: e.g. behind a transaction-pooling proxy)")
			fs.check(notNegative("retain"))
		},
		func(d consumerDeps) (logConsumer, error) { return newProjection(d, *retain, !*listen) })
}

// newProjection makes the projection role's consumer; retain 0 keeps
// delivery outbox rows for the default time, noListen polls for persist's
// commits only.
func newProjection(d consumerDeps, retain time.Duration, noListen bool) (logConsumer, error) {
	return projection.New(projection.Config{Brokers: d.Brokers, KafkaOpts: d.KafkaOpts, Topic: d.Topic, DB: d.DB, Pace: d.Pace, Retain: retain, Log: d.Log, NoListen: noListen})
}
