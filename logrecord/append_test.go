package logrecord_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/logrecord"
)

// marshalBoth encodes e with Marshal (by hand) and with encoding/json.
func marshalBoth(t *testing.T, e *logrecord.Event) (got, want []byte, gerr, werr error) {
	t.Helper()
	got, gerr = e.Marshal() // sets e.V
	want, werr = json.Marshal(e)
	return
}

// TestAppendJSONMatchesMarshal: Marshal writes json.Marshal's bytes for
// every kind and field, escapes included, and refuses what it refuses.
func TestAppendJSONMatchesMarshal(t *testing.T) {
	at := time.Date(2026, 11, 29, 7, 0, 0, 123456000, time.UTC)
	to := 0
	far := 4095
	for _, e := range []*logrecord.Event{
		{Kind: logrecord.KindMessage, ConversationID: "c1", Seq: 7, MessageID: "01K", ClientMessageID: "m-7", Sender: "u1", Body: "hi \u00e9 \U0001F600 <&> \"q\" \\ \x00 \x1f \u2028", CreatedAt: at, VShard: 3, Epoch: 2, Worker: "w1"},
		{Kind: logrecord.KindCreate, ConversationID: "c1", Seq: 1, MessageID: "01K", Sender: "u1", Members: []string{"u1", "u2", "ü"}, CreatedAt: at},
		{Kind: logrecord.KindCreate, ConversationID: "c1", Seq: 1, Members: []string{}, CreatedAt: at},
		{Kind: logrecord.KindKick, ConversationID: "c1", Seq: 9, MessageID: "01K", Sender: "u1", UserID: "u2", ClientMessageID: "k", CreatedAt: at},
		{Kind: logrecord.KindTakeover, VShard: 5, Epoch: 9, Worker: "w1", CreatedAt: at},
		{Kind: logrecord.KindMoved, ConversationID: "c", Seq: 4, ToVShard: &to, CreatedAt: at},
		{Kind: logrecord.KindMoved, ConversationID: "c", Seq: 4, ToVShard: &far, CreatedAt: at, VShard: -1, Epoch: -3},
		{Kind: logrecord.KindRead, ConversationID: "c", UserID: "u", ReadSeq: 12, CreatedAt: at},
		{Kind: logrecord.KindMoved, ConversationID: "c", Seq: 4, ToVShard: &to, CreatedAt: at, Verdicts: []logrecord.Verdict{
			{ClientMessageID: "k<1>", Sender: "u2", Op: "send", Code: "forbidden", Message: "u2 is not a member of c", At: at},
			{ClientMessageID: "j", Sender: "u1", Op: "join", Seq: 3, At: at.Add(time.Second)},
		}},
		{Kind: logrecord.KindMessage, ConversationID: "c", Seq: 1, Body: "\xff\xfe bad utf-8", CreatedAt: at},
		{Kind: logrecord.KindMessage, CreatedAt: time.Time{}},
		{Kind: logrecord.KindMessage, CreatedAt: at.In(time.FixedZone("x", 5*3600+30*60))},
		{Kind: logrecord.KindMessage, CreatedAt: at.In(time.FixedZone("y", -(11*3600 + 17)))},
		{Kind: logrecord.KindMessage, CreatedAt: at.In(time.FixedZone("day", 24*3600))},
		{Kind: logrecord.KindMessage, CreatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{Kind: logrecord.KindMessage, CreatedAt: time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)},
		{Kind: logrecord.KindMessage, CreatedAt: time.Date(2026, 1, 1, 0, 0, 0, 1, time.UTC)},
	} {
		got, want, gerr, werr := marshalBoth(t, e)
		if (gerr != nil) != (werr != nil) {
			t.Errorf("%+v: Marshal error %v, json.Marshal error %v", e, gerr, werr)
			continue
		}
		if werr == nil && !bytes.Equal(got, want) {
			t.Errorf("Marshal\n got %s\nwant %s", got, want)
		}
	}
}

// FuzzAppendJSON: Marshal and encoding/json agree on any field values.
func FuzzAppendJSON(f *testing.F) {
	f.Add("message", "c1", int64(7), "01K", "m-7", "u1", "hi <é>", "u2", "u3", int64(1764400000123456789), 0, 3, int64(2), "w1", 1, int64(0))
	f.Add("create", "", int64(0), "", "", "", "", "", "", int64(0), -36000, 0, int64(0), "", -1, int64(-5))
	f.Fuzz(func(t *testing.T, kind, conv string, seq int64, mid, cmid, sender, body, m1, user string, unixNano int64, offset, vshard int, epoch int64, worker string, to int, readSeq int64) {
		e := &logrecord.Event{Kind: kind, ConversationID: conv, Seq: seq, MessageID: mid, ClientMessageID: cmid, Sender: sender, Body: body,
			UserID: user, CreatedAt: time.Unix(0, unixNano).In(time.FixedZone("", offset%(48*3600))), VShard: vshard, Epoch: epoch, Worker: worker, ReadSeq: readSeq}
		if m1 != "" {
			e.Members = []string{m1, sender}
		}
		if to >= 0 {
			e.ToVShard = &to
		}
		got, want, gerr, werr := marshalBoth(t, e)
		if (gerr != nil) != (werr != nil) {
			t.Fatalf("%+v: Marshal error %v, json.Marshal error %v", e, gerr, werr)
		}
		if werr == nil && !bytes.Equal(got, want) {
			t.Fatalf("Marshal\n got %s\nwant %s", got, want)
		}
	})
}

// BenchmarkMarshalMessage is the writer's encoding of one message record.
func BenchmarkMarshalMessage(b *testing.B) {
	e := &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: "conv-000123", Seq: 4711, MessageID: "01KB8Z6Q9V3W4X5Y6Z7A8B9C0D", ClientMessageID: "d1-000042",
		Sender: "user-000017", Body: "a message body of a typical length, about sixty bytes long.", CreatedAt: time.Now().UTC(), VShard: 17, Epoch: 3, Worker: "w1"}
	b.Run("Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, err := e.Marshal(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if _, err := json.Marshal(e); err != nil {
				b.Fatal(err)
			}
		}
	})
}
