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
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.KeepControlRecords()}, ep.kafkaOpts...)...)
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

// storedOffsets lists the consumers' stored offsets, for a failure message.
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

// acceptedMsg is what a client was told.
type acceptedMsg struct {
	Conv, ClientMessageID, MessageID, Sender string
	Seq                                      int64
	SentAt, AcceptedAt                       time.Time
}

// checkWorld verifies the accepted messages against the log and Postgres
// (not against what the servers answered): each is there exactly once with
// its seq and message_id; no (conversation, seq) or (conversation,
// client_message_id) is used twice; a message accepted before another was
// sent has the smaller seq.
func checkWorld(t *testing.T, ep endpoints, accepted []acceptedMsg) {
	t.Helper()
	logRows := readLog(t, ep)
	dbRows := readDB(t, ep, len(logRows))
	// A command in flight when its client stopped may still commit after
	// the log was read: persist then stores more than that read saw. Read
	// the log again until the two agree (or the log stops growing).
	for deadline := time.Now().Add(30 * time.Second); len(dbRows) > len(logRows) && time.Now().Before(deadline); {
		time.Sleep(time.Second)
		logRows = readLog(t, ep)
		dbRows = readDB(t, ep, len(logRows))
	}
	for name, rows := range map[string][]row{"log": logRows, "postgres": dbRows} {
		bySeq := map[string]row{}
		byCmid := map[string]row{}
		for _, r := range rows {
			k := fmt.Sprintf("%s/%d", r.Conv, r.Seq)
			if prev, ok := bySeq[k]; ok {
				t.Errorf("%s: seq %s used twice: %+v and %+v", name, k, prev, r)
			}
			bySeq[k] = r
			if r.Kind == logrecord.KindMessage {
				ck := r.Conv + "/" + r.ClientMessageID
				if prev, ok := byCmid[ck]; ok {
					t.Errorf("%s: client_message_id %s stored twice: seq %d and %d", name, ck, prev.Seq, r.Seq)
				}
				byCmid[ck] = r
			}
		}
		for _, a := range accepted {
			r, ok := bySeq[fmt.Sprintf("%s/%d", a.Conv, a.Seq)]
			if !ok {
				t.Errorf("%s: accepted %s seq %d (%s) is missing", name, a.Conv, a.Seq, a.ClientMessageID)
				continue
			}
			if r.MessageID != a.MessageID || r.ClientMessageID != a.ClientMessageID || r.Sender != a.Sender {
				t.Errorf("%s: %s seq %d holds %+v, accepted %+v", name, a.Conv, a.Seq, r, a)
			}
		}
	}
	if len(dbRows) != len(logRows) {
		t.Errorf("postgres has %d events, the log %d", len(dbRows), len(logRows))
	}
	// regression: accepted before sent ⇒ smaller seq
	byConv := map[string][]acceptedMsg{}
	for _, a := range accepted {
		byConv[a.Conv] = append(byConv[a.Conv], a)
	}
	for conv, as := range byConv {
		for _, a := range as {
			for _, b := range as {
				if a.AcceptedAt.Before(b.SentAt) && a.Seq >= b.Seq {
					t.Errorf("%s: %s accepted (seq %d) before %s was sent, which got seq %d", conv, a.ClientMessageID, a.Seq, b.ClientMessageID, b.Seq)
				}
			}
		}
	}
}
