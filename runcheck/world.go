package runcheck

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/loadgen"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/logsink"
)

// WorldConfig says where the world is and how long to wait for it.
type WorldConfig struct {
	Stack loadgen.Stack
	// Convs are the run's conversations; the world is read for them only.
	Convs []string
	// PersistWait bounds the wait for persist to copy the whole log into
	// Postgres (default 60 s).
	PersistWait time.Duration
	// Idle ends the log read when no record came for this long (default 2 s).
	Idle time.Duration
	// PersistConsumer is persist's name in consumer_offsets (default persist).
	PersistConsumer string
	// KafkaOpts are appended to the log reader's options (TLS, SASL).
	KafkaOpts []kgo.Opt
}

// ReadWorld reads the committed log (read_committed) from the start, waits
// until persist's stored offsets are past every record read, then reads
// Postgres — both for the run's conversations.
func ReadWorld(ctx context.Context, cfg WorldConfig) (*World, error) {
	if cfg.PersistWait <= 0 {
		cfg.PersistWait = time.Minute
	}
	if cfg.Idle <= 0 {
		cfg.Idle = 2 * time.Second
	}
	if cfg.PersistConsumer == "" {
		cfg.PersistConsumer = logsink.PersistConsumer
	}
	want := make(map[string]bool, len(cfg.Convs))
	for _, c := range cfg.Convs {
		want[c] = true
	}
	w := &World{}
	last, err := readLog(ctx, cfg, want, w)
	if err != nil {
		return nil, err
	}
	// A pool's URL (pool_max_conns=…) is accepted: pgxpool reads its own
	// settings and leaves the connection's, which one connection uses.
	pcfg, err := pgxpool.ParseConfig(cfg.Stack.Postgres)
	if err != nil {
		return nil, fmt.Errorf("runcheck: postgres url: %w", err)
	}
	conn, err := pgx.ConnectConfig(ctx, pcfg.ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("runcheck: connect postgres: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := waitPersist(ctx, conn, cfg, last); err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, `SELECT conversation_id, seq, kind, message_id, coalesce(client_message_id, ''), sender,
		coalesce(user_id, ''), coalesce(members, '{}') FROM events WHERE conversation_id = ANY($1) ORDER BY conversation_id, seq`, cfg.Convs)
	if err != nil {
		return nil, fmt.Errorf("runcheck: read events: %w", err)
	}
	var e Event
	_, err = pgx.ForEachRow(rows, []any{&e.Conv, &e.Seq, &e.Kind, &e.MessageID, &e.ClientMessageID, &e.Sender, &e.UserID, &e.Members}, func() error {
		x := e
		x.Members = append([]string(nil), e.Members...)
		w.DB = append(w.DB, x)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("runcheck: read events: %w", err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM seq_conflicts WHERE conversation_id = ANY($1)`, cfg.Convs).Scan(&w.SeqConflicts); err != nil {
		return nil, fmt.Errorf("runcheck: read seq_conflicts: %w", err)
	}
	return w, nil
}

// readLog reads every partition from the start, read_committed, keeping
// the events of the wanted conversations, and returns the highest offset
// read per partition (any record, markers included). A partition is done
// once a record at or past its high watermark − 2 was read (the last
// record before the last commit marker); otherwise the read ends after
// cfg.Idle without records (a log ending in an aborted transaction).
func readLog(ctx context.Context, cfg WorldConfig, want map[string]bool, w *World) (map[int32]int64, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Stack.Kafka...), kgo.ConsumeTopics(cfg.Stack.Topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, cfg.KafkaOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("runcheck: kafka client: %w", err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, cfg.Stack.Topic)
	if err != nil {
		return nil, fmt.Errorf("runcheck: end offsets: %w", err)
	}
	hwm := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { hwm[o.Partition] = o.Offset })
	last := map[int32]int64{}
	done := func() bool {
		for p, end := range hwm {
			if l, ok := last[p]; end > 0 && (!ok || l+2 < end) {
				return false
			}
		}
		return true
	}
	var bad []string
	for !done() {
		pctx, cancel := context.WithTimeout(ctx, cfg.Idle)
		fs := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("runcheck: read the log: %w", err)
		}
		n := 0
		fs.EachError(func(_ string, _ int32, err error) {
			if pctx.Err() == nil {
				bad = append(bad, err.Error())
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			n++
			last[r.Partition] = max(last[r.Partition], r.Offset)
			e, err := logrecord.Unmarshal(r.Value)
			if err != nil {
				bad = append(bad, fmt.Sprintf("undecodable record at %d/%d: %v", r.Partition, r.Offset, err))
				return
			}
			if !e.HasSeq() || !want[e.ConversationID] {
				return
			}
			w.Log = append(w.Log, Event{Conv: e.ConversationID, Seq: e.Seq, Kind: e.Kind, MessageID: e.MessageID,
				ClientMessageID: e.ClientMessageID, Sender: e.Sender, UserID: e.UserID, Members: e.Members,
				Partition: r.Partition, Offset: r.Offset})
		})
		if len(bad) > 0 {
			return nil, fmt.Errorf("runcheck: read the log: %s", strings.Join(bad, "; "))
		}
		if n == 0 {
			break // idle: the rest of the log is aborted or control records
		}
	}
	return last, nil
}

// waitPersist waits until persist's stored next offset is past the last
// record read from every partition, so Postgres holds all of it.
func waitPersist(ctx context.Context, conn *pgx.Conn, cfg WorldConfig, last map[int32]int64) error {
	deadline := time.Now().Add(cfg.PersistWait)
	for {
		next, err := logsink.Offsets(ctx, conn, cfg.PersistConsumer, cfg.Stack.Topic)
		if err != nil {
			return fmt.Errorf("runcheck: %w", err)
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
			return fmt.Errorf("runcheck: persist has not copied the log within %v: %s", cfg.PersistWait, strings.Join(behind, "; "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
