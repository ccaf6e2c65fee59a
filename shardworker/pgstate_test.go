package shardworker

import (
	"context"
	"testing"

	"github.com/chatpipe/chatpipe/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestLoadCountsDeadLetteredSeq: a conversation whose newest committed
// record persist dead-lettered is loaded with that record's seq as its last
// one, so the writer does not hand it out again.
func TestLoadCountsDeadLetteredSeq(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	if _, err := db.Exec(ctx, `INSERT INTO events (conversation_id, seq, kind, message_id, sender, members, created_at, vshard, epoch, log_partition, log_offset)
		VALUES ('c1', 1, 'create', 'm1', 'u1', '{u1}', now(), 0, 1, 0, 0), ('c1', 2, 'message', 'm2', 'u1', NULL, now(), 0, 1, 0, 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO dead_letters (consumer, topic, log_partition, log_offset, conversation_id, seq, error)
		VALUES ('persist', 'chatpipe.log', 0, 2, 'c1', 3, 'x'), ('projection', 'chatpipe.log', 0, 3, 'c1', 9, 'x')`); err != nil {
		t.Fatal(err)
	}
	convs, _, err := fetchState(ctx, db, []string{"c1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := convs["c1"]
	if !c.Exists || c.LastSeq != 3 || c.Members["u1"] != 1 {
		t.Errorf("loaded c1 = %+v, want existing, last seq 3, member u1", c)
	}
}
