package logsink

import (
	"context"
	"testing"

	"github.com/chatpipe/chatpipe/internal/pgtest"
)

// ListDeadLetters lists one consumer's rows or everyone's, oldest first,
// at most limit of them, and counts them all; a record that did not decode
// has no conversation or seq.
func TestListDeadLetters(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	for _, q := range []string{
		`INSERT INTO dead_letters (consumer, topic, log_partition, log_offset, conversation_id, seq, sqlstate, error, record_value, created_at)
		 VALUES ('persist', 't', 1, 10, 'c1', 4, '22P05', 'nul byte', 'v1', now() - interval '3 minutes')`,
		`INSERT INTO dead_letters (consumer, topic, log_partition, log_offset, error, created_at)
		 VALUES ('projection', 't', 2, 20, 'not json', now() - interval '2 minutes')`,
		`INSERT INTO dead_letters (consumer, topic, log_partition, log_offset, conversation_id, seq, error, created_at)
		 VALUES ('persist', 't', 1, 11, 'c1', 5, 'too long', now() - interval '1 minute')`,
	} {
		if _, err := db.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	all, total, err := ListDeadLetters(ctx, db, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	if total != 3 || len(all) != 2 || all[0].Offset != 10 || all[1].Offset != 20 {
		t.Fatalf("all, limit 2: total %d, %+v", total, all)
	}
	if d := all[0]; d.Consumer != "persist" || d.Conversation != "c1" || d.Seq != 4 || d.SQLState != "22P05" || d.Error != "nul byte" || string(d.Value) != "v1" {
		t.Errorf("first row %+v", d)
	}
	if d := all[1]; d.Conversation != "" || d.Seq != 0 || d.SQLState != "" || len(d.Value) != 0 {
		t.Errorf("a record that did not decode: %+v", d)
	}
	mine, total, err := ListDeadLetters(ctx, db, "persist", 10)
	if err != nil {
		t.Fatal(err)
	}
	if total != 2 || len(mine) != 2 || mine[0].Seq != 4 || mine[1].Seq != 5 {
		t.Fatalf("persist's: total %d, %+v", total, mine)
	}
}
