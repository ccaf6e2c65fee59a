// Package pgcount counts what a process sends to Postgres through pgx:
// statements, transactions begun, committed and rolled back, and the
// implicit transactions of statements and batches sent outside one (the
// pool's liveness pings, sent below pgx's tracing, are not counted).
// Transactions are begin + implicit. A Counter is a
// pgx tracer (set it as a pool's ConnConfig.Tracer) and a Prometheus
// collector of chatpipe_postgres_statements_total{kind}.
//
// The counts are the client's view, per process, so each role's share of
// the server's work can be told apart where pg_stat_statements sees one
// database user for all of them.
package pgcount

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// The kinds of round trip a Counter tells apart (the metric's kind label).
const (
	KindStatement = "statement" // a query, exec, batched query or COPY
	KindBegin     = "begin"
	KindCommit    = "commit"
	KindRollback  = "rollback"
	// KindImplicit is a statement, or a batch, sent outside a
	// transaction: Postgres runs it as a transaction of its own. It is
	// counted besides its statements.
	KindImplicit = "implicit"
)

var kinds = []string{KindStatement, KindBegin, KindCommit, KindRollback, KindImplicit}

// Counter counts round trips by kind. Its zero value is not usable; make
// one with New. It is safe for concurrent use.
type Counter struct {
	n    [5]atomic.Int64 // indexed as kinds
	desc *prometheus.Desc
}

// New returns a Counter at zero.
func New() *Counter {
	return &Counter{desc: prometheus.NewDesc("chatpipe_postgres_statements_total",
		"Round trips this process sent to Postgres through its pools, by kind: statement (query, exec, each query of a batch, COPY), begin, commit, rollback, and implicit (a statement or batch sent outside a transaction, which Postgres runs as one of its own; counted besides its statements).",
		[]string{"kind"}, nil)}
}

// Count is how many round trips of kind (one of the Kind constants) the
// Counter has seen.
func (c *Counter) Count(kind string) int64 {
	for i, k := range kinds {
		if k == kind {
			return c.n[i].Load()
		}
	}
	return 0
}

// kindOf classifies one SQL text: the words pgx itself sends to begin and
// end a transaction, else a statement.
func kindOf(sql string) int {
	s := strings.TrimSpace(sql)
	switch {
	case s == "commit":
		return 2
	case s == "rollback":
		return 3
	case len(s) >= 5 && strings.EqualFold(s[:5], "begin") && (len(s) == 5 || s[5] == ' '):
		return 1
	}
	return 0
}

// TraceQueryStart counts a query or exec (pgx.QueryTracer).
func (c *Counter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	k := kindOf(d.SQL)
	c.n[k].Add(1)
	if k == 0 && outside(conn) {
		c.n[4].Add(1)
	}
	return ctx
}

// outside tells whether conn is in no transaction ('I', idle).
func outside(conn *pgx.Conn) bool {
	return conn != nil && conn.PgConn().TxStatus() == 'I'
}

// TraceQueryEnd does nothing (pgx.QueryTracer).
func (c *Counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart counts a batch sent outside a transaction as an
// implicit one; each query of the batch is counted by TraceBatchQuery
// (pgx.BatchTracer).
func (c *Counter) TraceBatchStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	if outside(conn) {
		c.n[4].Add(1)
	}
	return ctx
}

// TraceBatchQuery counts one query of a batch (pgx.BatchTracer).
func (c *Counter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.n[kindOf(d.SQL)].Add(1)
}

// TraceBatchEnd does nothing (pgx.BatchTracer).
func (c *Counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TraceCopyFromStart counts a COPY (pgx.CopyFromTracer).
func (c *Counter) TraceCopyFromStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	c.n[0].Add(1)
	if outside(conn) {
		c.n[4].Add(1)
	}
	return ctx
}

// TraceCopyFromEnd does nothing (pgx.CopyFromTracer).
func (c *Counter) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}

// Describe sends the metric's description (prometheus.Collector).
func (c *Counter) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect sends the counts by kind (prometheus.Collector).
func (c *Counter) Collect(ch chan<- prometheus.Metric) {
	for i, k := range kinds {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.n[i].Load()), k)
	}
}

var (
	_ pgx.QueryTracer      = (*Counter)(nil)
	_ pgx.BatchTracer      = (*Counter)(nil)
	_ pgx.CopyFromTracer   = (*Counter)(nil)
	_ prometheus.Collector = (*Counter)(nil)
)
