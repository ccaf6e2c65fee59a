package loadcheck

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
	"github.com/chatpipe/chatpipe/tools/loadgen"
)

// WorldConfig says where the world is and how long to wait for it.
type WorldConfig struct {
	Stack loadgen.Stack
	// Convs are the run's conversations; the world is read for them only.
	Convs []string
	// PersistWait bounds the log's read, and then the wait for persist to
	// copy the whole log into Postgres (default 60 s each).
	PersistWait time.Duration
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
		return nil, fmt.Errorf("loadcheck: postgres url: %w", err)
	}
	conn, err := pgx.ConnectConfig(ctx, pcfg.ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("loadcheck: connect postgres: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := waitPersist(ctx, conn, cfg, last); err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, `SELECT conversation_id, seq, kind, message_id, coalesce(client_message_id, ''), sender,
		coalesce(user_id, ''), coalesce(members, '{}') FROM events WHERE conversation_id = ANY($1) ORDER BY conversation_id, seq`, cfg.Convs)
	if err != nil {
		return nil, fmt.Errorf("loadcheck: read events: %w", err)
	}
	var e Event
	_, err = pgx.ForEachRow(rows, []any{&e.Conv, &e.Seq, &e.Kind, &e.MessageID, &e.ClientMessageID, &e.Sender, &e.UserID, &e.Members}, func() error {
		x := e
		x.Members = append([]string(nil), e.Members...)
		w.DB = append(w.DB, x)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("loadcheck: read events: %w", err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM seq_conflicts WHERE conversation_id = ANY($1)`, cfg.Convs).Scan(&w.SeqConflicts); err != nil {
		return nil, fmt.Errorf("loadcheck: read seq_conflicts: %w", err)
	}
	return w, nil
}

// readLog reads every partition from the start, read_committed, keeping
// the events of the wanted conversations, and returns the highest offset
// of a record read per partition (markers included, control records not).
//
// It reads each partition up to its last stable offset as listed first:
// control records are kept, so that the offsets read reach it (every
// transaction ends with its marker; an aborted one's records are skipped,
// its marker is not). Reading until no record came for a while instead
// ended early on a loaded machine, with a partial log (or none) taken
// for the whole.
func readLog(ctx context.Context, cfg WorldConfig, want map[string]bool, w *World) (map[int32]int64, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Stack.Kafka...), kgo.ConsumeTopics(cfg.Stack.Topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.KeepControlRecords()}, cfg.KafkaOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("loadcheck: kafka client: %w", err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListCommittedOffsets(ctx, cfg.Stack.Topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("loadcheck: last stable offsets: %w", err)
	}
	left := map[int32]int64{} // partition → last stable offset not reached yet
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			left[o.Partition] = o.Offset
		}
	})
	last := map[int32]int64{}
	var bad []string
	rctx, cancel := context.WithTimeout(ctx, cfg.PersistWait)
	defer cancel()
	for len(left) > 0 {
		fs := cl.PollFetches(rctx)
		if err := rctx.Err(); err != nil {
			return nil, fmt.Errorf("loadcheck: read the log: partitions not read up to their last stable offset %v: %w", left, err)
		}
		fs.EachError(func(_ string, _ int32, err error) {
			bad = append(bad, err.Error())
		})
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
			if !e.HasSeq() || !want[e.ConversationID] {
				return
			}
			w.Log = append(w.Log, Event{Conv: e.ConversationID, Seq: e.Seq, Kind: e.Kind, MessageID: e.MessageID,
				ClientMessageID: e.ClientMessageID, Sender: e.Sender, UserID: e.UserID, Members: e.Members,
				Partition: r.Partition, Offset: r.Offset})
		})
		if len(bad) > 0 {
			return nil, fmt.Errorf("loadcheck: read the log: %s", strings.Join(bad, "; "))
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
			return fmt.Errorf("loadcheck: %w", err)
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
			return fmt.Errorf("loadcheck: persist has not copied the log within %v: %s", cfg.PersistWait, strings.Join(behind, "; "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
