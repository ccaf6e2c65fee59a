// Command ceiling measures the bare pipeline's end-to-end ceiling on this
// machine: N transactional producers (each with its own transactional.id,
// B message records per transaction, one partition per producer as a
// vshard's) → the broker → one read_committed consumer → Postgres, written
// through persist's own consumer and write path (logsink's read_committed
// group consumer; one multi-row INSERT … ON CONFLICT per poll plus the
// offsets, in one Postgres transaction) into a scratch database with
// chatpipe's schema. No gateway, no worker, no fan-out.
//
// The figure is records that reached Postgres per second over the window
// (after a warm-up). It is sustained: the producers run flat out but wait
// while Postgres is more than -max-lag records behind, so the broker's
// backlog stays bounded and what is produced is what is stored.
// With -rate the producers are paced instead, each committing its
// transactions at an even share of that many records a second: the bare
// parts in the shape a light load gives chatpipe's writers (one record per
// transaction, a producer per vshard), to price per record beside them.
// It prints key value lines:
//
//	ceiling_msgs_per_sec, produced_per_sec, window_secs, inserted, produced,
//	txn_per_sec, record_bytes, producers, batch, rate (0: flat out),
//	cpu_secs (this process, producers and consumer together), lag_at_end
//	(produced − inserted)
//
// and, on standard error, "ceiling: window start" and "ceiling: window
// end" as the measured window opens and closes, for a caller that reads
// other processes' CPU over the same window.
//
// Usage: ceiling -kafka ADDR -pg URL [-producers 16] [-batch 50] [-rate 0] [-duration 15s] [-max-lag 20000]
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/internal/schema"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/persist"
)

func main() {
	kafka := flag.String("kafka", os.Getenv("BENCH_KAFKA"), "broker address (default $BENCH_KAFKA)")
	pgURL := flag.String("pg", os.Getenv("BENCH_PG"), "Postgres URL; a scratch database is made beside it (default $BENCH_PG)")
	producers := flag.Int("producers", 16, "transactional producers")
	batch := flag.Int("batch", 50, "records per transaction")
	rate := flag.Float64("rate", 0, "records per second in all, spread evenly over the producers (0: flat out)")
	partitions := flag.Int("partitions", 8, "partitions of the scratch topic")
	bodyBytes := flag.Int("body", 100, "message body bytes (a 100-byte body makes a ~350-byte record)")
	duration := flag.Duration("duration", 15*time.Second, "measured window")
	warmup := flag.Duration("warmup", 3*time.Second, "load before the window")
	maxLag := flag.Int("max-lag", 20000, "producers wait while Postgres is more than this many records behind")
	flag.Parse()
	if *kafka == "" || *pgURL == "" {
		fmt.Fprintln(os.Stderr, "ceiling: -kafka and -pg are required")
		os.Exit(2)
	}
	if *rate < 0 || *producers < 1 || *batch < 1 {
		fmt.Fprintln(os.Stderr, "ceiling: -producers and -batch must be positive, -rate not negative")
		os.Exit(2)
	}
	if err := run(*kafka, *pgURL, *producers, *batch, *partitions, *bodyBytes, *maxLag, *rate, *warmup, *duration); err != nil {
		fmt.Fprintln(os.Stderr, "ceiling:", err)
		os.Exit(1)
	}
}

func cpuSecs() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

func run(addr, pgURL string, producers, batch, partitions, bodyBytes, maxLag int, rate float64, warmup, window time.Duration) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tag := fmt.Sprintf("%d_%d", os.Getpid(), time.Now().Unix())
	topic := "chatpipe.ceiling." + tag
	if err := devstack.EnsureTopic(ctx, []string{addr}, topic, partitions); err != nil {
		return err
	}
	db, drop, err := scratchDB(ctx, pgURL, "chatpipe_ceiling_"+tag)
	if err != nil {
		return err
	}
	defer drop()

	p, err := persist.New(persist.Config{Brokers: []string{addr}, Topic: topic, Group: "ceiling-" + tag, Consumer: "ceiling",
		DB: db, Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return err
	}
	cctx, stopConsumer := context.WithCancel(ctx)
	defer stopConsumer()
	consumerDone := make(chan error, 1)
	go func() { consumerDone <- p.Run(cctx) }()

	body := strings.Repeat("x", bodyBytes)
	var produced, txns atomic.Int64
	var recordBytes atomic.Int64
	pctx, stopProducers := context.WithCancel(ctx)
	defer stopProducers()
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for i := 0; i < producers; i++ {
		cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.TransactionalID("ceiling-"+tag+"-"+fmt.Sprint(i)),
			kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(0),
			kgo.MaxBufferedRecords(2*batch+10))
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cl.Close()
			part := int32(i % partitions)
			now := time.Now().UTC()
			// Paced, a producer commits a transaction every interval, its
			// first at an even offset into one, so that the producers'
			// commits interleave as independent writers' do.
			var interval time.Duration
			var next time.Time
			if rate > 0 {
				interval = time.Duration(float64(batch*producers) / rate * float64(time.Second))
				next = now.Add(interval * time.Duration(i) / time.Duration(producers))
			}
			var n int64
			for pctx.Err() == nil {
				if interval > 0 {
					if d := time.Until(next); d > 0 {
						select {
						case <-pctx.Done():
						case <-time.After(d):
						}
						if pctx.Err() != nil {
							break
						}
					}
					next = next.Add(interval)
				}
				// Sustained, not a burst: the producers wait while the
				// consumer is more than maxLag records behind.
				for produced.Load()-p.Stats().Inserted.Load() > int64(maxLag) && pctx.Err() == nil {
					time.Sleep(time.Millisecond)
				}
				if err := cl.BeginTransaction(); err != nil {
					errs <- err
					return
				}
				for k := 0; k < batch; k++ {
					n++
					conv := fmt.Sprintf("ceil.p%d.c%d", i, n%64)
					e := &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: conv, Seq: n/64 + 1,
						MessageID: fmt.Sprintf("M%04d%022d", i, n), ClientMessageID: fmt.Sprintf("m%d.%d", i, n),
						Sender: "ceil.u" + fmt.Sprint(i), Body: body, CreatedAt: now, VShard: i, Epoch: 1}
					v, err := e.Marshal()
					if err != nil {
						errs <- err
						return
					}
					if n == 1 && i == 0 {
						recordBytes.Store(int64(len(v) + len(conv)))
					}
					cl.Produce(pctx, &kgo.Record{Key: []byte(conv), Value: v, Partition: part}, nil)
				}
				// A cancelled flush aborts the transaction: only committed
				// records count as produced.
				if err := cl.Flush(pctx); err != nil {
					break
				}
				if err := cl.EndTransaction(context.Background(), kgo.TryCommit); err != nil {
					if pctx.Err() != nil {
						break
					}
					errs <- err
					return
				}
				produced.Add(int64(batch))
				txns.Add(1)
			}
			cl.AbortBufferedRecords(context.Background())
			_ = cl.EndTransaction(context.Background(), kgo.TryAbort)
		}()
	}

	fail := func() error {
		select {
		case err := <-errs:
			return fmt.Errorf("producer: %w", err)
		case err := <-consumerDone:
			return fmt.Errorf("consumer ended: %v", err)
		default:
			return nil
		}
	}
	time.Sleep(warmup)
	if err := fail(); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "ceiling: window start")
	in0, pr0, tx0, cpu0, t0 := p.Stats().Inserted.Load(), produced.Load(), txns.Load(), cpuSecs(), time.Now()
	time.Sleep(window)
	in1, pr1, tx1, cpu1, t1 := p.Stats().Inserted.Load(), produced.Load(), txns.Load(), cpuSecs(), time.Now()
	fmt.Fprintln(os.Stderr, "ceiling: window end")
	if err := fail(); err != nil {
		return err
	}
	stopProducers()
	wg.Wait()
	stopConsumer()
	<-consumerDone
	secs := t1.Sub(t0).Seconds()
	fmt.Printf("ceiling_msgs_per_sec %.0f\n", float64(in1-in0)/secs)
	fmt.Printf("produced_per_sec %.0f\n", float64(pr1-pr0)/secs)
	fmt.Printf("txn_per_sec %.0f\n", float64(tx1-tx0)/secs)
	fmt.Printf("window_secs %.2f\n", secs)
	fmt.Printf("inserted %d\n", in1-in0)
	fmt.Printf("produced %d\n", pr1-pr0)
	fmt.Printf("lag_at_end %d\n", pr1-in1)
	fmt.Printf("record_bytes %d\n", recordBytes.Load())
	fmt.Printf("producers %d\n", producers)
	fmt.Printf("batch %d\n", batch)
	fmt.Printf("rate %g\n", rate)
	fmt.Printf("cpu_secs %.2f\n", cpu1-cpu0)
	return nil
}

// scratchDB makes an empty database named name beside the one url names and
// applies the migrations; drop removes it.
func scratchDB(ctx context.Context, url, name string) (*pgxpool.Pool, func(), error) {
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, nil, err
	}
	drop := func() {
		c, err := pgx.Connect(context.Background(), url)
		if err == nil {
			c.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)")
			c.Close(context.Background())
		}
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		drop()
		return nil, nil, err
	}
	cfg.ConnConfig.Database = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		drop()
		return nil, nil, err
	}
	if err := schema.Migrate(ctx, pool); err != nil {
		pool.Close()
		drop()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); drop() }, nil
}
