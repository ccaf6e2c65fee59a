// Package pglisten holds a Postgres LISTEN connection and reports its
// notifications: the wake-up the delivery feed and the shard writers use
// instead of polling (polling stays their fallback).
package pglisten

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The pipeline's NOTIFY channels, named here so that the sender and its
// listeners share one name without importing each other.
const (
	// Persisted announces each batch persist committed (its offsets
	// moved): the shard writers, which bound their memory by persist's
	// offsets, learn them from it instead of reading them. The payload
	// names the offsets stored (logsink.AnnouncePayload), or is empty.
	Persisted = "chatpipe_persisted"
	// Delivery announces a delivery row persist committed; the
	// payload is its id. Gateways' delivery feeds listen on it.
	Delivery = "chatpipe_delivery"
)

// Run holds a dedicated connection (a copy of db's connection config)
// LISTENing on channel until ctx ends, and calls wake once after each
// LISTEN (for anything committed while it was not listening; payload "")
// and on every notification, with its payload. A lost connection is
// logged and dialled again after a second; wake must not block.
//
// up, if not nil, is told true once a LISTEN took effect (before that
// LISTEN's wake) and false once its connection is lost: while up, every
// commit's notification reaches wake, so a listener need not poll.
func Run(ctx context.Context, db *pgxpool.Pool, channel string, wake func(payload string), up func(listening bool), log *slog.Logger, lost string) {
	if up == nil {
		up = func(bool) {}
	}
	for ctx.Err() == nil {
		conn, err := pgx.ConnectConfig(ctx, db.Config().ConnConfig.Copy())
		if err == nil {
			if _, err = conn.Exec(ctx, "LISTEN "+channel); err == nil {
				up(true)
				wake("")
				for {
					n, werr := conn.WaitForNotification(ctx)
					if werr != nil {
						err = werr
						break
					}
					wake(n.Payload)
				}
				up(false)
			}
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			conn.Close(cctx)
			cancel()
		}
		if ctx.Err() != nil {
			return
		}
		log.Warn(lost, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
