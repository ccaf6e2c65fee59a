package worldcheck

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/logsink"
	"github.com/chatpipe/chatpipe/logrecord"
)

// WorldConfig says where the world is and how long to wait for it.
type WorldConfig struct {
	Kafka    []string
	Topic    string
	Postgres string
	// Layout is the stack's hashed vshards and partitions, for the check
	// of where records are; nil: not checked. Its Dedicated, when 0, is
	// taken from the topic: its partitions beyond Layout.Partitions.
	Layout *logrecord.Layout
	// Convs are the conversations to read; nil: every one.
	Convs []string
	// PersistWait bounds the log's read, and then the wait for persist to
	// copy the whole log into Postgres (default 60 s each).
	PersistWait time.Duration
	// Settle bounds how long the world is read again while Postgres holds
	// an event the log read lacks (default 30 s): a command in flight
	// when its client stopped may commit after the log was read.
	Settle time.Duration
	// PersistConsumer is persist's name in consumer_offsets (default persist).
	PersistConsumer string
	// KafkaOpts are appended to the log reader's options (TLS, SASL).
	KafkaOpts []kgo.Opt
}

// ReadWorld reads the committed log (read_committed) from the start, waits
// until persist's stored offsets are past every record read, then reads
// Postgres — for the configured conversations. While Postgres holds an
// event the log read lacks it reads both again, for up to cfg.Settle.
func ReadWorld(ctx context.Context, cfg WorldConfig) (*World, error) {
	if cfg.PersistWait <= 0 {
		cfg.PersistWait = time.Minute
	}
	if cfg.Settle <= 0 {
		cfg.Settle = 30 * time.Second
	}
	if cfg.PersistConsumer == "" {
		cfg.PersistConsumer = logsink.PersistConsumer
	}
	// A pool's URL (pool_max_conns=…) is accepted: pgxpool reads its own
	// settings and leaves the connection's, which one connection uses.
	pcfg, err := pgxpool.ParseConfig(cfg.Postgres)
	if err != nil {
		return nil, fmt.Errorf("worldcheck: postgres url: %w", err)
	}
	conn, err := pgx.ConnectConfig(ctx, pcfg.ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("worldcheck: connect postgres: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	settle := time.Now().Add(cfg.Settle)
	for {
		w, err := readOnce(ctx, cfg, conn)
		if err != nil {
			return nil, err
		}
		if settled(w) || time.Now().After(settle) {
			return w, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("worldcheck: %w", ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// settled reports whether every event of Postgres is in the log read.
func settled(w *World) bool {
	in := make(map[key]bool, len(w.Log))
	for _, e := range w.Log {
		in[key{e.ConversationID, e.Seq}] = true
	}
	for _, e := range w.DB {
		if !in[key{e.ConversationID, e.Seq}] {
			return false
		}
	}
	return true
}

func readOnce(ctx context.Context, cfg WorldConfig, conn *pgx.Conn) (*World, error) {
	var want map[string]bool
	if cfg.Convs != nil {
		want = make(map[string]bool, len(cfg.Convs))
		for _, c := range cfg.Convs {
			want[c] = true
		}
	}
	w := &World{}
	last, partitions, err := readLog(ctx, cfg, want, w)
	if err != nil {
		return nil, err
	}
	if cfg.Layout != nil {
		l := *cfg.Layout
		if l.Dedicated == 0 {
			l.Dedicated = max(0, partitions-l.Partitions)
		}
		w.Layout = &l
	}
	if err := waitPersist(ctx, conn, cfg, last); err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, `SELECT conversation_id, seq, kind, message_id, coalesce(client_message_id, ''), sender,
		coalesce(user_id, ''), coalesce(members, '{}'), coalesce(body, '') FROM events
		WHERE $1::text[] IS NULL OR conversation_id = ANY($1) ORDER BY conversation_id, seq`, cfg.Convs)
	if err != nil {
		return nil, fmt.Errorf("worldcheck: read events: %w", err)
	}
	var e Event
	_, err = pgx.ForEachRow(rows, []any{&e.ConversationID, &e.Seq, &e.Kind, &e.MessageID, &e.ClientMessageID, &e.Sender, &e.UserID, &e.Members, &e.Body}, func() error {
		x := e
		x.Members = append([]string(nil), e.Members...)
		w.DB = append(w.DB, x)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("worldcheck: read events: %w", err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM seq_conflicts WHERE $1::text[] IS NULL OR conversation_id = ANY($1)`, cfg.Convs).Scan(&w.SeqConflicts); err != nil {
		return nil, fmt.Errorf("worldcheck: read seq_conflicts: %w", err)
	}
	return w, nil
}

// readLog reads every partition from the start, read_committed, keeping
// every record's writer and the events of the wanted conversations (nil:
// all), and returns the highest offset of a record read per partition
// (markers included, control records not) and the topic's partitions.
//
// It reads each partition up to its last stable offset as listed first:
// control records are kept, so that the offsets read reach it (every
// transaction ends with its marker; an aborted one's records are skipped,
// its marker is not). Reading until no record came for a while instead
// ended early on a loaded machine, with a partial log (or none) taken
// for the whole. A fetch error (a broker restarting, a leader moving) is
// retried until the read's bound.
func readLog(ctx context.Context, cfg WorldConfig, want map[string]bool, w *World) (map[int32]int64, int, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Kafka...), kgo.ConsumeTopics(cfg.Topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.KeepControlRecords()}, cfg.KafkaOpts...)...)
	if err != nil {
		return nil, 0, fmt.Errorf("worldcheck: kafka client: %w", err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListCommittedOffsets(ctx, cfg.Topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, 0, fmt.Errorf("worldcheck: last stable offsets: %w", err)
	}
	left := map[int32]int64{} // partition → last stable offset not reached yet
	partitions := 0
	ends.Each(func(o kadm.ListedOffset) {
		partitions++
		if o.Offset > 0 {
			left[o.Partition] = o.Offset
		}
	})
	last := map[int32]int64{}
	var bad []string
	var fetchErr error
	rctx, cancel := context.WithTimeout(ctx, cfg.PersistWait)
	defer cancel()
	for len(left) > 0 {
		fs := cl.PollFetches(rctx)
		if err := rctx.Err(); err != nil {
			return nil, 0, fmt.Errorf("worldcheck: read the log: partitions not read up to their last stable offset %v (last fetch error: %v): %w", left, fetchErr, err)
		}
		fs.EachError(func(_ string, _ int32, err error) { fetchErr = err })
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := left[r.Partition]; ok && r.Offset+1 >= end {
				delete(left, r.Partition)
			}
			if r.Attrs.IsControl() {
				return
			}
			last[r.Partition] = max(last[r.Partition], r.Offset)
			e, err := logrecord.Unmarshal(r.Value)
			if err != nil {
				bad = append(bad, fmt.Sprintf("undecodable record at %d/%d: %v", r.Partition, r.Offset, err))
				return
			}
			w.Writes = append(w.Writes, Write{VShard: e.VShard, Epoch: e.Epoch, Kind: e.Kind, Partition: r.Partition, Offset: r.Offset,
				ProducerID: r.ProducerID, ProducerEpoch: r.ProducerEpoch})
			if !e.HasSeq() || (want != nil && !want[e.ConversationID]) {
				return
			}
			w.Log = append(w.Log, Event{Event: *e, Partition: r.Partition, Offset: r.Offset})
		})
		if len(bad) > 0 {
			return nil, 0, fmt.Errorf("worldcheck: read the log: %s", strings.Join(bad, "; "))
		}
	}
	return last, partitions, nil
}

// waitPersist waits until persist's stored next offset is past the last
// record read from every partition, so Postgres holds all of it.
func waitPersist(ctx context.Context, conn *pgx.Conn, cfg WorldConfig, last map[int32]int64) error {
	deadline := time.Now().Add(cfg.PersistWait)
	for {
		next, err := logsink.Offsets(ctx, conn, cfg.PersistConsumer, cfg.Topic)
		if err != nil {
			return fmt.Errorf("worldcheck: %w", err)
		}
		var behind []string
		for part, off := range last {
			if next[part] <= off {
				behind = append(behind, fmt.Sprintf("partition %d at %d, log at %d", part, next[part], off+1))
			}
		}
		if len(behind) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("worldcheck: persist has not copied the log within %v: %s", cfg.PersistWait, strings.Join(behind, "; "))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("worldcheck: wait for persist: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
