package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/internal/schema"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/persist"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

var (
	kafkaOnce sync.Once
	kafkaAddr string
	kafkaErr  error
)

const benchTopic = "chatpipe.bench"

// broker returns BENCH_KAFKA, or starts an in-process kfake broker, and
// makes sure the bench topic exists with BENCH_PARTITIONS partitions.
func broker(b *testing.B) string {
	kafkaOnce.Do(func() {
		kafkaAddr = os.Getenv("BENCH_KAFKA")
		if kafkaAddr == "" {
			dir, err := os.MkdirTemp("", "chatpipe-bench-kafka")
			if err != nil {
				kafkaErr = err
				return
			}
			k, err := devstack.StartKafka(dir, 0, slog.New(slog.DiscardHandler))
			if err != nil {
				kafkaErr = err
				return
			}
			kafkaAddr = k.Addr() // lives until the process exits
		}
		kafkaErr = devstack.EnsureTopic(context.Background(), []string{kafkaAddr}, benchTopic, envInt("BENCH_PARTITIONS", 8))
	})
	if kafkaErr != nil {
		b.Fatal(kafkaErr)
	}
	return kafkaAddr
}

// BenchmarkTxnProduce commits transactions of `batch` records of
// BENCH_RECORD_BYTES (default 350, a chatpipe message record with a
// 100-byte body) from `producers` transactional producers at once, each
// with its own transactional.id — as chatpipe's vshard writers do. "one"
// puts a producer's records in one partition (as a vshard's are), "spread"
// spreads them over every partition. It reports records/s and txn/s.
//
// BENCH_PRODUCERS and BENCH_BATCH add a case matching a chatpipe run (its
// vshards and its events per commit).
func BenchmarkTxnProduce(b *testing.B) {
	type tc struct {
		producers, batch int
		spread           bool
	}
	cases := []tc{{1, 1, false}, {1, 100, false}, {1, 1000, false}, {1, 100, true}, {1, 1000, true}, {64, 1, false}, {64, 10, false}}
	if p, n := envInt("BENCH_PRODUCERS", 0), envInt("BENCH_BATCH", 0); p > 0 && n > 0 {
		cases = append(cases, tc{p, n, false})
	}
	size := envInt("BENCH_RECORD_BYTES", 350)
	for _, c := range cases {
		layout := "one"
		if c.spread {
			layout = "spread"
		}
		b.Run(fmt.Sprintf("producers=%d/batch=%d/partitions=%s", c.producers, c.batch, layout), func(b *testing.B) {
			txnProduce(b, broker(b), c.producers, c.batch, size, c.spread)
		})
	}
}

var runID atomic.Int64

func txnProduce(b *testing.B, addr string, producers, batch, size int, spread bool) {
	parts := envInt("BENCH_PARTITIONS", 8)
	value := []byte(strings.Repeat("x", size))
	run := fmt.Sprintf("%d-%d", os.Getpid(), runID.Add(1))
	clients := make([]*kgo.Client, producers)
	for i := range clients {
		cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.TransactionalID(fmt.Sprintf("bench-%s-%d", run, i)),
			kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.DefaultProduceTopic(benchTopic), kgo.ProducerLinger(0),
			kgo.MaxBufferedRecords(2*batch+10))
		if err != nil {
			b.Fatal(err)
		}
		defer cl.Close()
		clients[i] = cl
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	b.ResetTimer()
	start := time.Now()
	for i, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for next.Add(1) <= int64(b.N) {
				if err := cl.BeginTransaction(); err != nil {
					errs <- err
					return
				}
				for k := 0; k < batch; k++ {
					p := int32(i % parts)
					if spread {
						p = int32(k % parts)
					}
					cl.Produce(ctx, &kgo.Record{Key: []byte("c"), Value: value, Partition: p}, nil)
				}
				if err := cl.Flush(ctx); err != nil {
					errs <- err
					return
				}
				if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed, "txn/s")
	b.ReportMetric(float64(b.N*batch)/elapsed, "records/s")
}

// BenchmarkPersistWrite stores batches of BENCH_PG_BATCH (default 1000)
// message records through persist's write path (rows and offsets in one
// Postgres transaction) into a scratch database with chatpipe's schema, in
// the Postgres of BENCH_PG. It reports rows/s.
func BenchmarkPersistWrite(b *testing.B) {
	url := os.Getenv("BENCH_PG")
	if url == "" {
		b.Skip("set BENCH_PG to a Postgres URL (its server gets a scratch database)")
	}
	ctx := context.Background()
	db := scratchDB(b, url)
	p, err := persist.New(persist.Config{Brokers: []string{"unused:9092"}, DB: db, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	batch := envInt("BENCH_PG_BATCH", 1000)
	body := strings.Repeat("x", 100)
	now := time.Now().UTC()
	var off int64
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		recs := make([]*kgo.Record, batch)
		for k := range recs {
			off++
			conv := fmt.Sprintf("bench.c%d", off%5000)
			e := &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: conv, Seq: off, MessageID: fmt.Sprintf("M%026d", off),
				ClientMessageID: fmt.Sprintf("m%d", off), Sender: "bench.u1", Body: body, CreatedAt: now, VShard: int(off % 64), Epoch: 1}
			v, err := e.Marshal()
			if err != nil {
				b.Fatal(err)
			}
			recs[k] = &kgo.Record{Topic: logrecord.DefaultTopic, Partition: int32(off % 8), Offset: off, Key: []byte(conv), Value: v}
		}
		if err := p.Write(ctx, recs); err != nil {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start).Seconds()
	b.StopTimer()
	b.ReportMetric(float64(b.N*batch)/elapsed, "rows/s")
}

// scratchDB makes an empty database beside the one url names, applies the
// migrations, and drops it when the benchmark ends.
func scratchDB(b *testing.B, url string) *pgxpool.Pool {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close(ctx)
	name := fmt.Sprintf("chatpipe_bench_%d_%d", os.Getpid(), runID.Add(1))
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		b.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.Database = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		pool.Close()
		if c, err := pgx.Connect(ctx, url); err == nil {
			c.Exec(ctx, "DROP DATABASE "+name)
			c.Close(ctx)
		}
	})
	if err := schema.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	return pool
}
