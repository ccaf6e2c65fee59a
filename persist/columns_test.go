package persist

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/projection"
)

// TestDecodeColumns: each event becomes one row of the columns, in record
// order, its log position taken from the record; members are joined with
// commas, absent fields are empty; takeover markers are no rows.
func TestDecodeColumns(t *testing.T) {
	at := time.Unix(1_700_000_000, 0).UTC()
	create := &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: "c1", Seq: 1, MessageID: "m1", Sender: "u1",
		Members: []string{"u1", "u2"}, CreatedAt: at, VShard: 3, Epoch: 2}
	takeover := &logrecord.Event{Kind: logrecord.KindTakeover, VShard: 3, Epoch: 3, Worker: "w1", CreatedAt: at}
	msg := &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: "c1", Seq: 2, MessageID: "m2", ClientMessageID: "k2",
		Sender: "u2", Body: "hi", CreatedAt: at.Add(time.Second), VShard: 3, Epoch: 3}
	join := &logrecord.Event{Kind: logrecord.KindJoin, ConversationID: "c1", Seq: 3, MessageID: "m3", Sender: "u1", UserID: "u3",
		CreatedAt: at.Add(2 * time.Second), VShard: 3, Epoch: 3}
	recs := []*kgo.Record{record(t, create, 10), record(t, takeover, 11), record(t, msg, 12), record(t, join, 13)}
	recs[3].Partition = 5

	events, err := projection.Decode(recs)
	if err != nil {
		t.Fatal(err)
	}
	var c columns
	if err := c.decode(recs, events); err != nil {
		t.Fatal(err)
	}
	if c.len() != 3 {
		t.Fatalf("%d rows, want 3 (the takeover marker is none)", c.len())
	}
	for _, col := range []struct {
		name      string
		got, want any
	}{
		{"conversation_id", c.conv, []string{"c1", "c1", "c1"}},
		{"seq", c.seq, []int64{1, 2, 3}},
		{"kind", c.kind, []string{"create", "message", "join"}},
		{"message_id", c.mid, []string{"m1", "m2", "m3"}},
		{"client_message_id", c.cmid, []string{"", "k2", ""}},
		{"sender", c.sender, []string{"u1", "u2", "u1"}},
		{"body", c.body, []string{"", "hi", ""}},
		{"user_id", c.user, []string{"", "", "u3"}},
		{"members", c.members, []string{"u1,u2", "", ""}},
		{"created_at", c.created, []time.Time{at, at.Add(time.Second), at.Add(2 * time.Second)}},
		{"vshard", c.vshard, []int32{3, 3, 3}},
		{"epoch", c.epoch, []int64{2, 3, 3}},
		{"log_partition", c.part, []int32{0, 0, 5}},
		{"log_offset", c.offset, []int64{10, 12, 13}},
	} {
		if fmt.Sprint(col.got) != fmt.Sprint(col.want) {
			t.Errorf("%s = %v, want %v", col.name, col.got, col.want)
		}
	}
}

// TestDecodeStopsAtUnreadableRecord: a record no version reads and a record
// of a newer version fail the batch with the error logsink classifies
// (dead letter, halt), naming the record's position; neither is skipped.
func TestDecodeStopsAtUnreadableRecord(t *testing.T) {
	for _, c := range []struct {
		value []byte
		want  error
	}{
		{[]byte("not json"), logrecord.ErrMalformed},
		{[]byte(`{"v":1,"kind":"message"}`), logrecord.ErrMalformed},
		{[]byte(`{"v":99,"kind":"message","conversation_id":"c1","seq":2}`), logrecord.ErrUnsupportedVersion},
	} {
		recs := []*kgo.Record{record(t, message("c1", 1, "m1", "k1"), 0), {Partition: 2, Offset: 7, Value: c.value}}
		_, err := projection.Decode(recs)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), "2/7") {
			t.Errorf("decode(%s) = %v, want %v at 2/7", c.value, err, c.want)
		}
	}
}

// TestConflictReplayed: a row not inserted is a replay only when the same
// message holds its seq; a different message there, or none (its
// client_message_id is taken), is a conflict.
func TestConflictReplayed(t *testing.T) {
	same, other := "m1", "m2"
	for _, c := range []struct {
		existing *string
		want     bool
	}{{&same, true}, {&other, false}, {nil, false}} {
		if got := (conflict{existing: c.existing, incoming: "m1"}).replayed(); got != c.want {
			t.Errorf("replayed with existing %v = %v, want %v", c.existing, got, c.want)
		}
	}
}
