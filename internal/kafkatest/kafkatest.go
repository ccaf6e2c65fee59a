// Package kafkatest gives a test a private broker (devstack's kfake, on
// loopback) and topics on it with a producer.
package kafkatest

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/devstack"
)

// Broker starts a broker for the test; the test's cleanup stops it (Close
// may also be called before).
func Broker(t testing.TB) *devstack.Kafka {
	t.Helper()
	k, err := devstack.StartKafka(filepath.Join(t.TempDir(), "kafka"), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	return k
}

// Topic creates topic, of one partition, on brokers and returns a producer
// to it; the test's cleanup closes the producer.
func Topic(ctx context.Context, t testing.TB, brokers []string, topic string) *kgo.Client {
	t.Helper()
	if err := devstack.EnsureTopic(ctx, brokers, topic, 1); err != nil {
		t.Fatal(err)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	return prod
}
