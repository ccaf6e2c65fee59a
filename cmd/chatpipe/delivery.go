package main

import (
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/chatpipe/chatpipe/gateway"
	"github.com/chatpipe/chatpipe/internal/delivery"
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
