package projection

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/pgtest"
	"github.com/chatpipe/chatpipe/logrecord"
)

// movedConversation is conversation c's log across a move: seqs 1–4 on
// partition 0 (its hashed vshard's, ending in the moved record), 5–6 on
// partition 1 (the dedicated vshard's). u3 joins at 2 and is kicked at 6.
func movedConversation() (old, moved []*logrecord.Event) {
	at := time.Unix(1, 0).UTC()
	to := 9
	old = []*logrecord.Event{
		{Kind: logrecord.KindCreate, ConversationID: "c", Seq: 1, MessageID: "m1", Sender: "u1", Members: []string{"u1", "u2"}, CreatedAt: at},
		{Kind: logrecord.KindJoin, ConversationID: "c", Seq: 2, MessageID: "m2", Sender: "u1", UserID: "u3", CreatedAt: at},
		{Kind: logrecord.KindMessage, ConversationID: "c", Seq: 3, MessageID: "m3", Sender: "u1", Body: "hi", CreatedAt: at},
		{Kind: logrecord.KindMoved, ConversationID: "c", Seq: 4, MessageID: "m4", ToVShard: &to, CreatedAt: at},
	}
	moved = []*logrecord.Event{
		{Kind: logrecord.KindMessage, ConversationID: "c", Seq: 5, MessageID: "m5", Sender: "u1", Body: "private", CreatedAt: at},
		{Kind: logrecord.KindKick, ConversationID: "c", Seq: 6, MessageID: "m6", Sender: "u1", UserID: "u3", CreatedAt: at},
	}
	return old, moved
}

// storeAsPersist writes events into events (partition part, offsets from
// 0) and persist's offset past them, as persist, or a rebuild's first
// pass, stores them.
func storeAsPersist(t *testing.T, ctx context.Context, db *pgxpool.Pool, part int32, evs []*logrecord.Event) []*kgo.Record {
	t.Helper()
	recs := make([]*kgo.Record, len(evs))
	for i, e := range evs {
		if _, err := db.Exec(ctx, `INSERT INTO events (conversation_id, seq, kind, message_id, sender, members, user_id, body, to_vshard, created_at, vshard, epoch, log_partition, log_offset)
			VALUES ($1, $2, $3, $4, $5, $6, nullif($7, ''), $8, $9, $10, 0, 1, $11, $12)`,
			e.ConversationID, e.Seq, e.Kind, e.MessageID, e.Sender, e.Members, e.UserID, e.Body, e.ToVShard, e.CreatedAt, part, i); err != nil {
			t.Fatal(err)
		}
		recs[i] = rec(t, e, int64(i))
		recs[i].Partition = part
	}
	if _, err := db.Exec(ctx, `INSERT INTO consumer_offsets (consumer, topic, log_partition, next_offset) VALUES ('persist', $1, $2, $3)`,
		logrecord.DefaultTopic, part, len(evs)); err != nil {
		t.Fatal(err)
	}
	return recs
}

func periods(t *testing.T, ctx context.Context, db *pgxpool.Pool) string {
	t.Helper()
	rows, err := db.Query(ctx, `SELECT user_id || ':' || joined_seq || '-' || coalesce(left_seq::text, 'open')
		FROM memberships WHERE conversation_id = 'c' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(got)
}

// TestMovedConversationProjectsInSeqOrder: after a move a conversation's
// events are on two partitions, which a rebuild projects in the order it
// reads them: either first, or together in one batch with the new
// partition's records first.
// Whatever the order, the membership periods are those of the events in
// seq order: u3, kicked at 6 on the new partition, is not left a member by
// the old partition's join at 2 applied after it.
func TestMovedConversationProjectsInSeqOrder(t *testing.T) {
	const want = "[u1:1-open u2:1-open u3:2-6]"
	for _, order := range []string{"new partition first", "one batch, new partition's records first", "old partition first"} {
		t.Run(order, func(t *testing.T) {
			db := pgtest.DB(t, pgtest.Options{})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			old, moved := movedConversation()
			oldRecs := storeAsPersist(t, ctx, db, 0, old)
			movedRecs := storeAsPersist(t, ctx, db, 1, moved)
			p := newTestProjector(t, db)
			var batches [][]*kgo.Record
			switch order {
			case "new partition first":
				batches = [][]*kgo.Record{movedRecs, oldRecs}
			case "one batch, new partition's records first":
				batches = [][]*kgo.Record{append(append([]*kgo.Record(nil), movedRecs...), oldRecs...)}
			default:
				batches = [][]*kgo.Record{oldRecs, movedRecs}
			}
			for i, b := range batches {
				if err := p.consumer.Write(ctx, b); err != nil {
					t.Fatal(err)
				}
				// After every batch: no period is open that the log closes
				// by a seq the read model claims to have applied.
				var last int64
				if err := db.QueryRow(ctx, `SELECT last_seq FROM conversations WHERE conversation_id = 'c'`).Scan(&last); err != nil {
					t.Fatal(err)
				}
				if got := periods(t, ctx, db); last == 6 && got != want {
					t.Fatalf("after batch %d of %d (conversation c projected to seq %d) memberships are %s, want %s", i+1, len(batches), last, got, want)
				}
			}
			if got := periods(t, ctx, db); got != want {
				t.Fatalf("memberships of c are %s, want %s", got, want)
			}
		})
	}
}
