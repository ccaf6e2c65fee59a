// Package devstack is embedded infrastructure for `chatpipe dev` and tests on
// one machine.
//
// It starts the three backing services chatpipe needs, each bound to
// 127.0.0.1 only (Postgres to another loopback address if a test asks) and
// each keeping its state in a caller-chosen directory so that a restart on
// the same directory sees the same data:
//
//   - [Etcd]: a single-member etcd server embedded in this process
//     (go.etcd.io/etcd/server/v3/embed).
//   - [Kafka]: a one-broker in-process Kafka cluster (franz-go's kfake) that
//     persists its log under a data directory.
//   - [Postgres]: a private PostgreSQL cluster run as a child process from the
//     machine's PostgreSQL binaries.
//
// Every Start function returns a value whose Close method stops everything it
// started; Close methods are safe to call more than once. Nothing here is
// meant for production: there is no authentication (but for the
// Postgres password a test may ask StartPostgresWith for), no TLS and no
// replication.
//
// All logging goes to the *slog.Logger passed in (nil means slog.Default()).
// Each component adds a "component" attribute, and the embedded servers'
// own chatter is filtered down to warnings and errors.
package devstack
