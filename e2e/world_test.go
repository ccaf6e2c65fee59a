package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/logsink"
	"github.com/chatpipe/chatpipe/internal/worldcheck"
	"github.com/chatpipe/chatpipe/logrecord"
)

// row is one event as the world holds it: the committed log or Postgres.
type row struct {
	Conv, Kind, MessageID, ClientMessageID, Sender string
	Seq                                            int64
	UserID, Body                                   string
	Members                                        []string
}

// eachLogEvent reads the whole committed log, read_committed, and calls fn
// for each decodable event in offset order per partition.
//
// It reads every partition up to its last stable offset as listed first
// (everything the test waits for was committed before): control records
// are kept, so that the offsets read reach that offset (a transaction
// ends with its marker, an aborted one's records are skipped but its
// marker is not). Reading until the log stayed idle for a while instead
// ended early on a loaded machine and took a partial log for the whole.
func eachLogEvent(t *testing.T, ep endpoints, fn func(r *kgo.Record, e *logrecord.Event)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(ep.Kafka...), kgo.ConsumeTopics(ep.Topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.KeepControlRecords()}, ep.KafkaOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListCommittedOffsets(ctx, ep.Topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("list the log's last stable offsets: %v", err)
	}
	left := map[int32]int64{} // partition → last stable offset not reached yet
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			left[o.Partition] = o.Offset
		}
	})
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("log not read within 90 s: partitions not read up to their last stable offset: %v", left)
		}
		for _, fe := range fs.Errors() {
			t.Logf("reading the log: partition %d: %v", fe.Partition, fe.Err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := left[r.Partition]; ok && r.Offset+1 >= end {
				delete(left, r.Partition)
			}
			if r.Attrs.IsControl() {
				return
			}
			e, err := logrecord.Unmarshal(r.Value)
			if err != nil {
				t.Errorf("undecodable record at %d/%d: %v", r.Partition, r.Offset, err)
				return
			}
			fn(r, e)
		})
	}
}

// readLog reads the whole committed log's events (takeover markers left
// out), checking each is in its vshard's partition.
func readLog(t *testing.T, ep endpoints) []row {
	t.Helper()
	var out []row
	eachLogEvent(t, ep, func(r *kgo.Record, e *logrecord.Event) {
		if e.Kind == logrecord.KindTakeover {
			return
		}
		l := logrecord.Layout{VShards: ep.VShards, Partitions: ep.Partitions, Dedicated: ep.Dedicated}
		if home := logrecord.VShard(e.ConversationID, ep.VShards); e.VShard != home && !l.IsDedicated(e.VShard) {
			t.Errorf("%s/%d written by vshard %d: neither its own (%d) nor a dedicated one", e.ConversationID, e.Seq, e.VShard, home)
		}
		if got := l.Partition(e.VShard); got != r.Partition {
			t.Errorf("%s/%d of vshard %d in partition %d, want %d", e.ConversationID, e.Seq, e.VShard, r.Partition, got)
		}
		out = append(out, row{Conv: e.ConversationID, Kind: e.Kind, MessageID: e.MessageID, ClientMessageID: e.ClientMessageID, Sender: e.Sender, Seq: e.Seq,
			UserID: e.UserID, Body: e.Body, Members: e.Members})
	})
	return out
}

// readDB reads every event row from Postgres once persist has caught up
// with the log: it waits until Postgres holds n events.
func readDB(t *testing.T, ep endpoints, n int) []row {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, ep.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for {
		var have int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&have); err != nil {
			t.Fatal(err)
		}
		if have >= n {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("Postgres holds %d events, the log %d; stored offsets (consumer partition next updated):\n%s", have, n, storedOffsets(ep))
		case <-time.After(200 * time.Millisecond):
		}
	}
	rows, err := conn.Query(ctx, `SELECT conversation_id, seq, kind, message_id, coalesce(client_message_id, ''), sender,
		coalesce(user_id, ''), coalesce(body, ''), members FROM events`)
	if err != nil {
		t.Fatal(err)
	}
	var out []row
	var r row
	_, err = pgx.ForEachRow(rows, []any{&r.Conv, &r.Seq, &r.Kind, &r.MessageID, &r.ClientMessageID, &r.Sender, &r.UserID, &r.Body, &r.Members}, func() error {
		out = append(out, r)
		r.Members = nil
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var conflicts int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM seq_conflicts`).Scan(&conflicts); err != nil {
		t.Fatal(err)
	}
	if conflicts != 0 {
		t.Errorf("persist recorded %d seq conflicts", conflicts)
	}
	return out
}

// storedOffsets lists the offsets stored in consumer_offsets, for a
// failure message.
func storedOffsets(ep endpoints) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, ep.Postgres)
	if err != nil {
		return err.Error()
	}
	defer conn.Close(context.Background())
	offs, err := logsink.AllOffsets(ctx, conn, ep.Topic)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, o := range offs {
		fmt.Fprintf(&b, "  %s %d %d %s\n", o.Consumer, o.Partition, o.NextOffset, o.UpdatedAt.UTC().Format("15:04:05.000"))
	}
	return b.String()
}

// readWorld reads the whole world for the world checker: the committed
// log from the start, read_committed, and, once persist has stored every
// record read, Postgres (worldcheck.ReadWorld).
func readWorld(t *testing.T, ep endpoints) *worldcheck.World {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	w, err := worldcheck.ReadWorld(ctx, worldcheck.WorldConfig{Kafka: ep.Kafka, Topic: ep.Topic, Postgres: ep.Postgres,
		Layout:      &logrecord.Layout{VShards: ep.VShards, Partitions: ep.Partitions, Dedicated: ep.Dedicated},
		PersistWait: 90 * time.Second, KafkaOpts: ep.KafkaOpts})
	if err != nil {
		t.Fatalf("read the world: %v; stored offsets (consumer partition next updated):\n%s", err, storedOffsets(ep))
	}
	return w
}

// worldAccepted is what clients were told, in the world checker's terms.
func worldAccepted(accepted []acceptedMsg) []worldcheck.Accepted {
	unix := func(t time.Time) int64 {
		if t.IsZero() {
			return 0
		}
		return t.UnixNano()
	}
	out := make([]worldcheck.Accepted, 0, len(accepted))
	for _, a := range accepted {
		out = append(out, worldcheck.Accepted{Conv: a.Conv, Seq: a.Seq, MessageID: a.MessageID, ClientMessageID: a.ClientMessageID,
			Sender: a.Sender, Sent: unix(a.SentAt), At: unix(a.AcceptedAt)})
	}
	return out
}

// checkWorld runs the world check (internal/worldcheck) of the accepted
// messages against the log and Postgres, not against what the servers
// answered, and fails the test on every violation: each accepted message
// is there exactly once with its seq, message_id, client_message_id and
// sender; no (conversation, seq), (conversation, client_message_id) or
// message_id is used twice; seqs run 1, 2, 3, … and grow in each
// partition; a message accepted before another was sent has the smaller
// seq; no message is from a non-member; Postgres holds exactly the log;
// no vshard's records go back to an older epoch, and each is in its
// vshard's partition.
func checkWorld(t *testing.T, ep endpoints, accepted []acceptedMsg) {
	t.Helper()
	res := worldcheck.Check(&worldcheck.Run{Accepted: worldAccepted(accepted)}, readWorld(t, ep))
	if !res.OK() {
		t.Errorf("%s", res.Text())
		return
	}
	t.Logf("%s", res.Text())
}
