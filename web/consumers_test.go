package web

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/internal/schema"
)

// TestConsumers checks the consumers' lag against a real Postgres and a
// Kafka topic written through a transaction: a consumer whose next offset
// is the commit marker is caught up.
func TestConsumers(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	kafka, err := devstack.StartKafka(filepath.Join(dir, "kafka"), 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer kafka.Close()
	const topic = "chatpipe.log"
	if err := devstack.EnsureTopic(ctx, []string{kafka.Addr()}, topic, 2); err != nil {
		t.Fatal(err)
	}
	// Three records in one transaction on partition 0: offsets 0-2, the
	// commit marker at 3, end offset 4. Partition 1 stays empty.
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.Addr()), kgo.TransactionalID("web-test"),
		kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := cl.ProduceSync(ctx, &kgo.Record{Partition: 0, Value: fmt.Appendf(nil, "r%d", i)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}

	pg, err := devstack.StartPostgres(ctx, filepath.Join(dir, "pg"), 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	db, err := pgxpool.New(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := schema.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec(ctx, `INSERT INTO consumer_offsets (consumer, topic, log_partition, next_offset) VALUES
		('persist', $1, 0, 3), ('projection', $1, 0, 1), ('persist', 'another.topic', 0, 0)`, topic)
	if err != nil {
		t.Fatal(err)
	}

	// readConsumers needs no etcd: call it on an Ops made by hand.
	state := func(brokers []string) *State {
		ops := &Ops{cfg: OpsConfig{VShards: 1, Topic: topic, DB: db, Brokers: brokers, Log: testLog(t)}}
		cs, errs := ops.readConsumers(ctx)
		if len(errs) > 0 {
			t.Fatalf("errors: %v", errs)
		}
		return &State{Consumers: cs}
	}
	s := state([]string{kafka.Addr()})
	got := fmt.Sprint(s.Consumers)
	if len(s.Consumers) != 2 {
		t.Fatalf("consumers: %s", got)
	}
	persist, projection := s.Consumers[0], s.Consumers[1]
	if persist.Consumer != "persist" || persist.Behind != 0 || len(persist.Partitions) != 2 ||
		persist.Partitions[0] != (PartitionState{Partition: 0, NextOffset: 3, EndOffset: 4, Behind: 0}) ||
		persist.Partitions[1] != (PartitionState{Partition: 1, NextOffset: 0, EndOffset: 0, Behind: 0}) {
		t.Errorf("persist: %+v", persist)
	}
	if projection.Consumer != "projection" || projection.Behind != 2 || projection.Partitions[0].Behind != 2 {
		t.Errorf("projection: %+v", projection)
	}

	// Without brokers the end offsets are unknown: lag is -1, not 0.
	s = state(nil)
	if len(s.Consumers) != 2 || s.Consumers[0].Behind != -1 || s.Consumers[0].Partitions[0].Behind != -1 {
		t.Errorf("consumers without brokers: %+v", s.Consumers)
	}
}
