package devstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

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
// debug level. opts are more kfake options, e.g. kfake.TLS, EnableSASL,
// Superuser and EnableACLs for a secured broker.
func StartKafka(dir string, port int, log *slog.Logger, opts ...kfake.Opt) (*Kafka, error) {
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
	c, err := kfake.NewCluster(append([]kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(port),
		kfake.DataDir(dir),
		kfake.WithLogger(kfakeSlog{log}),
		kfake.ListenFn(func(network, address string) (net.Listener, error) {
			ln, err := net.Listen(network, address)
			if err != nil {
				return nil, err
			}
			return steadyListener{Listener: ln, log: log}, nil
		}),
	}, opts...)...)
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

// steadyListener keeps accepting through errors that pass: out of file
// descriptors, a connection aborted before it was accepted. kfake's accept
// loop returns on any error, so a broker that once ran out of descriptors
// (thousands of vshards' producers in one process) refused every
// connection for the rest of the process's life.
type steadyListener struct {
	net.Listener
	log *slog.Logger
}

// Accept waits for the next connection, retrying passing errors after a
// pause that doubles from 5 ms up to a second.
func (l steadyListener) Accept() (net.Conn, error) {
	var pause time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil || !acceptPasses(err) {
			return c, err
		}
		pause = min(max(2*pause, 5*time.Millisecond), time.Second)
		l.log.Warn("kafka listener: accept failed; retrying", "err", err, "in", pause)
		time.Sleep(pause)
	}
}

// acceptPasses reports whether an Accept error is one a listener outlives.
func acceptPasses(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ECONNABORTED, syscall.ENOBUFS, syscall.ENOMEM} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
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

// TopicSpec is how the log topic is created.
type TopicSpec struct {
	Partitions int
	// Replication is the replication factor; 0 or -1: the broker's default.
	Replication int16
	// Configs are topic configs set at creation (retention.ms,
	// min.insync.replicas, …).
	Configs map[string]string
}

// KeptForever are the configs of a log that is never deleted by time or
// size: the log is the source of truth a writer replays and `admin rebuild`
// reads from.
func KeptForever() map[string]string {
	return map[string]string{"retention.ms": "-1", "retention.bytes": "-1"}
}

// EnsureTopic creates topic with the given number of partitions, kept
// forever, with the broker's default replication, if it does not exist yet.
// If the topic exists with a different partition count, it returns an
// error saying so. opts are appended to the client's options (TLS, SASL).
func EnsureTopic(ctx context.Context, addrs []string, topic string, partitions int, opts ...kgo.Opt) error {
	return EnsureTopicSpec(ctx, addrs, topic, TopicSpec{Partitions: partitions, Configs: KeptForever()}, opts...)
}

// EnsureTopicSpec creates topic as spec says if it does not exist yet,
// talking to the brokers at addrs. An existing topic is left as it is,
// except that a different partition count is an error. opts are appended
// to the client's options (TLS, SASL).
func EnsureTopicSpec(ctx context.Context, addrs []string, topic string, spec TopicSpec, opts ...kgo.Opt) error {
	partitions := spec.Partitions
	if topic == "" {
		return errors.New("devstack: ensure topic: empty topic name")
	}
	if partitions < 1 || partitions > 1<<20 {
		return fmt.Errorf("devstack: ensure topic %q: invalid partition count %d", topic, partitions)
	}
	if len(addrs) == 0 {
		return fmt.Errorf("devstack: ensure topic %q: no broker addresses", topic)
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...)}, opts...)...)
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
	rf := spec.Replication
	if rf <= 0 {
		rf = -1 // the broker's default
	}
	var configs map[string]*string
	for k, v := range spec.Configs {
		if configs == nil {
			configs = map[string]*string{}
		}
		configs[k] = &v
	}
	resp, err := adm.CreateTopic(ctx, int32(partitions), rf, configs, topic)
	if err == nil {
		err = resp.Err
	}
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

// TopicState is what a broker says of an existing topic.
type TopicState struct {
	Partitions int
	// Replication is the smallest replica count of any partition.
	Replication int
	// Configs are the topic's effective configs (explicit and defaults).
	Configs map[string]string
}

// DescribeTopic reads a topic's partitions, replication and configs. opts
// are appended to the client's options (TLS, SASL).
func DescribeTopic(ctx context.Context, addrs []string, topic string, opts ...kgo.Opt) (TopicState, error) {
	var st TopicState
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...)}, opts...)...)
	if err != nil {
		return st, fmt.Errorf("devstack: describe topic %q: new client: %w", topic, err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	tds, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return st, fmt.Errorf("devstack: describe topic %q: %w", topic, err)
	}
	td, ok := tds[topic]
	if !ok || td.Err != nil {
		return st, fmt.Errorf("devstack: describe topic %q: not found (%v)", topic, td.Err)
	}
	st.Partitions = len(td.Partitions)
	for _, p := range td.Partitions {
		if st.Replication == 0 || len(p.Replicas) < st.Replication {
			st.Replication = len(p.Replicas)
		}
	}
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return st, fmt.Errorf("devstack: describe topic %q configs: %w", topic, err)
	}
	rc, err := rcs.On(topic, nil)
	if err != nil {
		return st, fmt.Errorf("devstack: describe topic %q configs: %w", topic, err)
	}
	if rc.Err != nil {
		return st, fmt.Errorf("devstack: describe topic %q configs: %w", topic, rc.Err)
	}
	st.Configs = map[string]string{}
	for _, c := range rc.Configs {
		st.Configs[c.Key] = c.MaybeValue()
	}
	return st, nil
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
