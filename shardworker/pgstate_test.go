package shardworker

import (
	"context"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/logrecord"

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

// TestLoadAppliesDeadLetteredEvents: a record persist dead-lettered is a
// committed event all the same. A writer loading its conversation applies
// it in seq order (a dead-lettered kick still removes the user), and a
// retry of a dead-lettered send finds its first result.
func TestLoadAppliesDeadLetteredEvents(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	if _, err := db.Exec(ctx, `INSERT INTO events (conversation_id, seq, kind, message_id, sender, members, created_at, vshard, epoch, log_partition, log_offset)
		VALUES ('c1', 1, 'create', 'm1', 'u1', '{u1,u2}', now(), 0, 1, 0, 0), ('c1', 4, 'message', 'm4', 'u1', NULL, now(), 0, 1, 0, 3)`); err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC()
	kick, _ := (&logrecord.Event{Kind: logrecord.KindKick, ConversationID: "c1", Seq: 2, MessageID: "m2", Sender: "u1", UserID: "u2", CreatedAt: at}).Marshal()
	send, _ := (&logrecord.Event{Kind: logrecord.KindMessage, ConversationID: "c1", Seq: 3, MessageID: "m3", Sender: "u1", ClientMessageID: "k3", Body: "a\x00b", CreatedAt: at}).Marshal()
	if _, err := db.Exec(ctx, `INSERT INTO dead_letters (consumer, topic, log_partition, log_offset, conversation_id, seq, error, record_value)
		VALUES ('persist', 'chatpipe.log', 0, 1, 'c1', 2, 'x', $1), ('persist', 'chatpipe.log', 0, 2, 'c1', 3, 'x', $2)`, kick, send); err != nil {
		t.Fatal(err)
	}
	convs, found, err := fetchState(ctx, db, []string{"c1"}, []shardcore.DedupeKey{{Conv: "c1", CMID: "k3"}})
	if err != nil {
		t.Fatal(err)
	}
	c := convs["c1"]
	if _, still := c.Members["u2"]; still || c.LastSeq != 4 {
		t.Errorf("loaded c1 = %+v: the dead-lettered kick of u2 at seq 2 was not applied, or last seq is not 4", c)
	}
	if f, ok := c.Dedupe["k3"]; !ok || f.Seq != 3 {
		t.Errorf("the dead-lettered send k3 is not in the loaded dedupe: %+v", c.Dedupe)
	}
	if f, ok := found[shardcore.DedupeKey{Conv: "c1", CMID: "k3"}]; !ok || f.Seq != 3 || f.MessageID != "m3" {
		t.Errorf("the lookup of the dead-lettered send k3 found %+v %v", f, ok)
	}
}

// TestLoadReadsMoves: a conversation's moved events (to_vshard) are read
// with its other non-message events, in seq order: the last one says
// where it is written now.
func TestLoadReadsMoves(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	if _, err := db.Exec(ctx, `INSERT INTO events (conversation_id, seq, kind, message_id, sender, members, created_at, vshard, epoch, log_partition, log_offset, to_vshard)
		VALUES ('c1', 1, 'create', 'm1', 'u1', '{u1}', now(), 3, 1, 3, 0, NULL), ('c1', 2, 'moved', 'm2', '', NULL, now(), 3, 1, 3, 1, 9),
		       ('c1', 3, 'message', 'm3', 'u1', NULL, now(), 9, 1, 8, 0, NULL), ('c1', 4, 'moved', 'm4', '', NULL, now(), 9, 1, 8, 1, 3),
		       ('c2', 1, 'create', 'm5', 'u1', '{u1}', now(), 3, 1, 3, 2, NULL), ('c2', 2, 'moved', 'm6', '', NULL, now(), 3, 1, 3, 3, 9)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE events SET verdicts = '[{"client_message_id":"k9","sender":"u3","op":"send","code":"forbidden","message":"no","at":"2026-12-06T04:00:00Z"}]' WHERE conversation_id = 'c2' AND seq = 2`); err != nil {
		t.Fatal(err)
	}
	convs, _, err := fetchState(ctx, db, []string{"c1", "c2"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := convs["c1"]; !c.Moved || c.At != 3 || c.LastSeq != 4 || !(shardcore.Stamp{VShard: 3}).Holds(c, "c1") {
		t.Errorf("c1 = %+v, want moved back to 3 at seq 4", c)
	}
	if c := convs["c2"]; !c.Moved || c.At != 9 || (shardcore.Stamp{VShard: 3}).Holds(c, "c2") || !(shardcore.Stamp{VShard: 9, Dedicated: true}).Holds(c, "c2") || c.MovedAt.IsZero() {
		t.Errorf("c2 = %+v, want at dedicated vshard 9", c)
	}
	if vs := convs["c2"].Verdicts; len(vs) != 1 || vs[0].ClientMessageID != "k9" || vs[0].Code != "forbidden" || !vs[0].At.Equal(time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC)) {
		t.Errorf("c2's moved record carried %+v, want k9's forbidden", vs)
	}
	if vs := convs["c1"].Verdicts; len(vs) != 0 {
		t.Errorf("c1's last moved record carried no verdicts, loaded %+v", vs)
	}
}

// TestLoadKnowsStoredKeys: a loaded conversation gets a filter of its
// stored client_message_ids, so a key it never had needs no lookup and a
// stored one (a dead-lettered send's too) is looked up or found; a
// conversation with more keys than a load reads gets none, and every key
// it is sent is looked up.
func TestLoadKnowsStoredKeys(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	if _, err := db.Exec(ctx, `INSERT INTO events (conversation_id, seq, kind, message_id, sender, members, created_at, vshard, epoch, log_partition, log_offset, client_message_id)
		VALUES ('c1', 1, 'create', 'm1', 'u1', '{u1}', now(), 0, 1, 0, 0, 'k1'), ('c1', 2, 'message', 'm2', 'u1', NULL, now(), 0, 1, 0, 1, 'k2'),
		       ('c2', 1, 'create', 'm3', 'u1', '{u1}', now(), 0, 1, 0, 2, 'j1'), ('c2', 2, 'message', 'm4', 'u1', NULL, now(), 0, 1, 0, 3, 'j2'),
		       ('c2', 3, 'message', 'm5', 'u1', NULL, now(), 0, 1, 0, 4, 'j3')`); err != nil {
		t.Fatal(err)
	}
	keyFilterLoadMax = 2
	t.Cleanup(func() { keyFilterLoadMax = 10000 })
	convs, _, err := fetchState(ctx, db, []string{"c1", "c2", "c3"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	send := func(cid, k string) *shardcore.Command {
		return &shardcore.Command{Op: "send", ConversationID: cid, Sender: "u1", ClientMessageID: k}
	}
	c1 := convs["c1"]
	if c1.Known == nil {
		t.Fatal("c1, with 2 keys stored, was loaded without a filter of them")
	}
	for _, k := range []string{"k1", "k2"} {
		if !shardcore.NeedsDedupeLookup(c1, send("c1", k)) {
			t.Errorf("c1's stored key %s would not be looked up", k)
		}
	}
	if shardcore.NeedsDedupeLookup(c1, send("c1", "new")) {
		t.Error("a key c1 never had would be looked up")
	}
	if c2 := convs["c2"]; c2.Known != nil || !shardcore.NeedsDedupeLookup(c2, send("c2", "new")) {
		t.Errorf("c2, with 3 keys stored (more than a load reads), has a filter %v, or a new key is not looked up", c2.Known)
	}
	if c3 := convs["c3"]; c3.Known == nil || shardcore.NeedsDedupeLookup(c3, send("c3", "new")) {
		t.Error("c3, with no events, has no filter, or a new key would be looked up")
	}
}
