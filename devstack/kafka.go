package devstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// kafkaLockFile guards a kfake data dir against two clusters at once.
const kafkaLockFile = "devstack-kafka.lock"

// Kafka is an in-process Kafka broker: franz-go's kfake with its data
// persisted under a data directory (kfake.DataDir, without SyncWrites, so
// recent writes live in the page cache until the cluster is closed or a
// segment rolls).
//
// Stop it with Close, which flushes the data dir; a process that dies
// without Close may lose the most recent records.
type Kafka struct {
	c    *kfake.Cluster
	addr string
	lock *os.File
	log  *slog.Logger

	closeOnce sync.Once
}

// StartKafka starts a 1-broker kfake cluster on 127.0.0.1:port (0 = a free
// port chosen by the listener itself) with kfake.DataDir(dir). State from a
// previous cluster on dir (topics, records, committed offsets, producer IDs
// and transactions) is reloaded; the port may differ between runs. kfake's
// warnings and errors go to log; its info and debug output goes to log at
// debug level.
func StartKafka(dir string, port int, log *slog.Logger) (*Kafka, error) {
	log = orDefault(log).With("component", "kafka")
	if dir == "" {
		return nil, errors.New("devstack: start kafka: empty data dir")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("devstack: start kafka: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("devstack: start kafka: create data dir: %w", err)
	}
	lock, err := lockDir(dir, kafkaLockFile, "kafka")
	if err != nil {
		return nil, err
	}
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.Ports(port),
		kfake.DataDir(dir),
		kfake.WithLogger(kfakeSlog{log}),
	)
	if err != nil {
		_ = lock.Close()
		return nil, fmt.Errorf("devstack: start kafka in %s on port %d: %w", dir, port, err)
	}
	addrs := c.ListenAddrs()
	if len(addrs) != 1 {
		c.Close()
		_ = lock.Close()
		return nil, fmt.Errorf("devstack: start kafka: expected 1 listen address, got %v", addrs)
	}
	log.Debug("kafka ready", "dir", dir, "addr", addrs[0])
	return &Kafka{c: c, addr: addrs[0], lock: lock, log: log}, nil
}

// Addr returns the broker's host:port bootstrap address.
func (k *Kafka) Addr() string { return k.addr }

// Cluster returns the underlying kfake cluster, e.g. for fault injection in
// tests.
func (k *Kafka) Cluster() *kfake.Cluster { return k.c }

// Close shuts the cluster down gracefully: kfake's Close flushes its state
// and segments to the data dir before returning. It is safe to call more
// than once; later calls do nothing.
func (k *Kafka) Close() {
	k.closeOnce.Do(func() {
		k.c.Close()
		_ = k.lock.Close()
		k.log.Debug("kafka stopped")
	})
}

// EnsureTopic creates topic with the given number of partitions if it does
// not exist yet, talking to the brokers at addrs. If the topic exists with a
// different partition count, it returns an error saying so.
func EnsureTopic(ctx context.Context, addrs []string, topic string, partitions int) error {
	if topic == "" {
		return errors.New("devstack: ensure topic: empty topic name")
	}
	if partitions < 1 || partitions > 1<<20 {
		return fmt.Errorf("devstack: ensure topic %q: invalid partition count %d", topic, partitions)
	}
	if len(addrs) == 0 {
		return fmt.Errorf("devstack: ensure topic %q: no broker addresses", topic)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		return fmt.Errorf("devstack: ensure topic %q: new client: %w", topic, err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	check := func() (exists bool, err error) {
		tds, err := adm.ListTopics(ctx, topic)
		if err != nil {
			return false, fmt.Errorf("devstack: ensure topic %q: list topics: %w", topic, err)
		}
		td, ok := tds[topic]
		if !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition) {
			return false, nil
		}
		if td.Err != nil {
			return false, fmt.Errorf("devstack: ensure topic %q: describe: %w", topic, td.Err)
		}
		if got := len(td.Partitions); got != partitions {
			return true, fmt.Errorf("devstack: ensure topic %q: exists with %d partitions, want %d", topic, got, partitions)
		}
		return true, nil
	}

	exists, err := check()
	if err != nil || exists {
		return err
	}
	// -1: the broker's default replication factor.
	_, err = adm.CreateTopic(ctx, int32(partitions), -1, nil, topic)
	if errors.Is(err, kerr.TopicAlreadyExists) {
		// Someone else created it between our check and create.
		if _, err := check(); err != nil {
			return err
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("devstack: ensure topic %q: create with %d partitions: %w", topic, partitions, err)
	}
	return nil
}

// kfakeSlog adapts a *slog.Logger to kfake.Logger. kfake's info level is
// per-request chatter, so it is demoted to debug.
type kfakeSlog struct{ log *slog.Logger }

func (l kfakeSlog) Logf(level kfake.LogLevel, msg string, args ...any) {
	var sl slog.Level
	switch level {
	case kfake.LogLevelError:
		sl = slog.LevelError
	case kfake.LogLevelWarn:
		sl = slog.LevelWarn
	case kfake.LogLevelInfo:
		sl = slog.LevelDebug
	case kfake.LogLevelDebug:
		sl = slog.LevelDebug - 4
	default:
		return
	}
	ctx := context.Background()
	if !l.log.Enabled(ctx, sl) {
		return
	}
	l.log.Log(ctx, sl, fmt.Sprintf(msg, args...))
}
