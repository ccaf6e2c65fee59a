package pgcount

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chatpipe/chatpipe/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// A pool traced by a Counter counts each round trip by its kind: queries,
// execs, each query of a batch and a COPY as statements, the begin and
// commit or rollback of every transaction, and a statement or batch sent
// outside a transaction as an implicit one.
func TestCounterCountsRoundTrips(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pgtest.DB(t, pgtest.Options{}).Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	c := New()
	cfg.ConnConfig.Tracer = c
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	if _, err := pool.Exec(ctx, `CREATE TABLE t (x int)`); err != nil { // 1 statement
		t.Fatal(err)
	}
	var one int
	if err := pool.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil { // 2
		t.Fatal(err)
	}
	out := &pgx.Batch{}
	out.Queue(`SELECT 1`)
	out.Queue(`SELECT 2`)
	if err := pool.SendBatch(ctx, out).Close(); err != nil { // 3, 4: one implicit transaction
		t.Fatal(err)
	}
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error { // begin, commit
		b := &pgx.Batch{}
		b.Queue(`SELECT 1`)
		b.Queue(`SELECT 2`)
		if err := tx.SendBatch(ctx, b).Close(); err != nil { // 5, 6
			return err
		}
		_, err := tx.Exec(ctx, `SELECT 3`) // 7
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx) // begin
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"t"}, []string{"x"}, pgx.CopyFromRows([][]any{{1}, {2}})); err != nil { // 8
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil { // rollback
		t.Fatal(err)
	}

	want := map[string]int64{KindStatement: 8, KindBegin: 2, KindCommit: 1, KindRollback: 1, KindImplicit: 3}
	for k, n := range want {
		if got := c.Count(k); got != n {
			t.Errorf("%s: counted %d, want %d", k, got, n)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			got[f.GetName()+"/"+m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	for k, n := range want {
		if v := got["chatpipe_postgres_statements_total/"+k]; v != float64(n) {
			t.Errorf("exported %s: %v, want %d (all: %v)", k, v, n, got)
		}
	}
	if len(got) != len(kinds) {
		t.Errorf("exported %d series, want %d: %v", len(got), len(kinds), got)
	}
}

func TestKindOf(t *testing.T) {
	for sql, want := range map[string]int{
		"commit": 2, "rollback": 3, "begin": 1, "begin isolation level serializable": 1,
		"SELECT 1": 0, "beginning": 0, "  commit ": 2, "INSERT INTO begin_x VALUES (1)": 0,
	} {
		if got := kindOf(sql); got != want {
			t.Errorf("kindOf(%q) = %d, want %d", sql, got, want)
		}
	}
}

// BenchmarkTraceQueryStart is the tracer's cost per statement (without a
// connection to ask for its transaction status).
func BenchmarkTraceQueryStart(b *testing.B) {
	c := New()
	ctx := context.Background()
	d := pgx.TraceQueryStartData{SQL: `INSERT INTO consumer_offsets (consumer, topic, log_partition, next_offset) SELECT $1, $2, p, o FROM unnest($3::int[], $4::bigint[]) AS t(p, o)`}
	b.ReportAllocs()
	for b.Loop() {
		c.TraceQueryStart(ctx, nil, d)
	}
}
