package shardworker

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/internal/kafkatest"
)

// TestCommitEndsWhenTheBrokerIsGone: a writer whose broker goes away ends
// its commit at the produce deadline, though its records never fail by
// themselves (they wait for a broker, and this client's delivery timeout
// is an hour). It closes the client, so that the records' promises run and
// the next session opens a new producer. A worker stopped while its broker
// was down once waited here until it was killed.
func TestCommitEndsWhenTheBrokerIsGone(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	k := kafkatest.Broker(t)
	brokers := []string{k.Addr()}
	const topic = "gone"
	if err := devstack.EnsureTopic(ctx, brokers, topic, 1); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID("gone-txn"),
		kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(0), kgo.RecordDeliveryTimeout(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	s := &shard{w: &Worker{cfg: Config{CommitTimeout: 5 * time.Second}}, log: slog.New(slog.DiscardHandler), cl: cl}
	rec := func(v string) []*kgo.Record { return []*kgo.Record{{Value: []byte(v)}} }
	if err := s.commit(ctx, cl, rec("first"), false, false); err != nil {
		t.Fatalf("commit with the broker up: %v", err)
	}

	k.Close()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		defer pcancel()
		done <- s.commit(pctx, cl, rec("second"), false, false)
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("commit with the broker gone succeeded")
		}
		t.Logf("commit ended after %v: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(30 * time.Second):
		t.Fatal("commit with the broker gone still waits after 30 s")
	}
	if s.cl != nil {
		t.Error("the closed client is still the shard's producer")
	}
}

// BenchmarkCommit is one writer's transaction of 20 records against an
// in-process kfake: the commit as a shard writer makes it, with the
// broker's share of the work in the figure too.
func BenchmarkCommit(b *testing.B) {
	brokers := []string{kafkatest.Broker(b).Addr()}
	const topic = "bench"
	if err := devstack.EnsureTopic(b.Context(), brokers, topic, 1); err != nil {
		b.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID("bench-txn"),
		kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	s := &shard{w: &Worker{cfg: Config{CommitTimeout: 10 * time.Second}}, log: slog.New(slog.DiscardHandler), cl: cl}
	recs := make([]*kgo.Record, 20)
	b.ReportAllocs()
	for b.Loop() {
		for i := range recs {
			recs[i] = &kgo.Record{Value: []byte("a message body of a typical length")}
		}
		if err := s.commit(b.Context(), cl, recs, false, false); err != nil {
			b.Fatal(err)
		}
	}
}
