package delivery

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/chatpipe/chatpipe/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// seedConversation stores conv with events 1..last, projected, and user u
// a member from seq 1 (until left, if not nil).
func seedConversation(t *testing.T, db *pgxpool.Pool, conv string, last int64, left *int64) {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Exec(ctx, `INSERT INTO memberships (conversation_id, user_id, joined_seq, left_seq) VALUES ($1, 'u', 1, $2)`, conv, left); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO conversations (conversation_id, last_seq, last_activity_at) VALUES ($1, $2, now())`, conv, last); err != nil {
		t.Fatal(err)
	}
	for seq := int64(1); seq <= last; seq++ {
		if _, err := db.Exec(ctx, `INSERT INTO events (conversation_id, seq, kind, message_id, sender, body, created_at, vshard, epoch, log_partition, log_offset)
			VALUES ($1, $2, 'message', $3, 'u', 'x', now(), 0, 1, 0, 0)`, conv, seq, fmt.Sprintf("%s-%d", conv, seq)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSyncPagesUnderLinguisticCollation: paging must not depend on the
// database's collation. Under en-US "a1" sorts before "B1", in bytes after
// it; a page that stops inside a1 must not move B1's cursor past events it
// never returned.
func TestSyncPagesUnderLinguisticCollation(t *testing.T) {
	for _, c := range []struct{ name, create string }{
		{"C", ""},
		{"icu-en-US", `TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C'`},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			db := pgtest.DB(t, pgtest.Options{Create: c.create})
			convs := []string{"B1", "a1", "b2", "A2"}
			for _, conv := range convs {
				seedConversation(t, db, conv, 3, nil)
			}
			s := &Store{DB: db}
			cursors := map[string]int64{}
			got := map[string]int{}
			for page := 0; ; page++ {
				if page > 20 {
					t.Fatal("sync does not finish")
				}
				res, err := s.Sync(ctx, "u", cursors, 2)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range res.Events {
					got[e.ConversationID+fmt.Sprint("/", e.Seq)]++
				}
				cursors = res.Cursors
				if !res.More {
					break
				}
			}
			for _, conv := range convs {
				for seq := 1; seq <= 3; seq++ {
					if k := fmt.Sprintf("%s/%d", conv, seq); got[k] != 1 {
						t.Errorf("event %s returned %d times, want once", k, got[k])
					}
				}
				if cursors[conv] != 3 {
					t.Errorf("cursor of %s = %d, want 3", conv, cursors[conv])
				}
			}
		})
	}
}

// Since reads only the conversations it is given, after their cursors and
// within the user's periods, with the user's read markers of those.
func TestSinceReadsOnlyTheNamedConversations(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	left := int64(3) // u left c2 at seq 3
	seedConversation(t, db, "c1", 5, nil)
	seedConversation(t, db, "c2", 5, &left)
	seedConversation(t, db, "c3", 5, nil)
	if _, err := db.Exec(ctx, `INSERT INTO read_markers (conversation_id, user_id, read_seq) VALUES ('c1', 'u', 4), ('c3', 'u', 2)`); err != nil {
		t.Fatal(err)
	}
	s := &Store{DB: db}
	res, err := s.Since(ctx, "u", map[string]int64{"c1": 3, "c2": 1, "elsewhere": 0}, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range res.Events {
		got = append(got, fmt.Sprintf("%s/%d", e.ConversationID, e.Seq))
	}
	if fmt.Sprint(got) != "[c1/4 c1/5 c2/2 c2/3]" {
		t.Errorf("events %v, want c1 after 3 and c2 up to u's leave", got)
	}
	if fmt.Sprint(res.Cursors) != "map[c1:5 c2:3]" {
		t.Errorf("cursors %v, want c1 and c2 only", res.Cursors)
	}
	if fmt.Sprint(res.Read) != "map[c1:4]" {
		t.Errorf("read markers %v, want c1's only", res.Read)
	}
}
