package sim

import (
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/logrecord"
)

// TestProjectionModelAppliesMovedConversationInSeqOrder is projection's
// TestMovedConversationProjectsInSeqOrder on the model: conversation c's
// seqs 1–4 are on partition 0 (ending in its moved record), 5–6 on
// partition 1; u3 joins at 2 and is kicked at 6. Persist has stored both.
// Whatever order the batches come in, the periods are those of the events
// in seq order; in record order without the gap fill
// (Bugs.ProjectionRecordOrder) u3 stays a member.
func TestProjectionModelAppliesMovedConversationInSeqOrder(t *testing.T) {
	at, to := time.Unix(1, 0).UTC(), 9
	old := []*logrecord.Event{
		{Kind: logrecord.KindCreate, ConversationID: "c", Seq: 1, MessageID: "m1", Sender: "u1", Members: []string{"u1", "u2"}, CreatedAt: at},
		{Kind: logrecord.KindJoin, ConversationID: "c", Seq: 2, MessageID: "m2", Sender: "u1", UserID: "u3", CreatedAt: at},
		{Kind: logrecord.KindMessage, ConversationID: "c", Seq: 3, MessageID: "m3", Sender: "u1", CreatedAt: at},
		{Kind: logrecord.KindMoved, ConversationID: "c", Seq: 4, MessageID: "m4", ToVShard: &to, CreatedAt: at},
	}
	moved := []*logrecord.Event{
		{Kind: logrecord.KindMessage, ConversationID: "c", Seq: 5, MessageID: "m5", Sender: "u1", CreatedAt: at},
		{Kind: logrecord.KindKick, ConversationID: "c", Seq: 6, MessageID: "m6", Sender: "u1", UserID: "u3", CreatedAt: at},
	}
	sink := NewSink()
	for i, e := range append(append([]*logrecord.Event(nil), old...), moved...) {
		sink.insert(&Record{Event: e, Offset: int64(i)}, 1)
	}
	const want = "[u1:1-open u2:1-open u3:2-6]"
	for _, order := range []struct {
		name    string
		batches [][]*logrecord.Event
	}{
		{"new partition first", [][]*logrecord.Event{moved, old}},
		{"one batch, new partition's records first", [][]*logrecord.Event{append(append([]*logrecord.Event(nil), moved...), old...)}},
		{"old partition first", [][]*logrecord.Event{old, moved}},
	} {
		for _, recordOrder := range []bool{false, true} {
			p := NewProjection()
			for _, b := range order.batches {
				p.apply(b, sink, recordOrder, &Stats{})
			}
			got := periodsString(p.Periods("c"))
			switch {
			case !recordOrder && got != want:
				t.Errorf("%s: memberships %s, want %s", order.name, got, want)
			case recordOrder && got == want && order.name != "old partition first":
				t.Errorf("%s in record order: memberships %s; the order before rule 25 should leave u3 a member", order.name, got)
			}
		}
	}
}
