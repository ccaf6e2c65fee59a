package protocol

import (
	"bytes"
	"encoding/json"
	"testing"
)

var appendRequests = []*Request{
	{},
	{Op: OpSend, ID: "r1", ConversationID: "c1", ClientMessageID: "m-1", Body: "hello"},
	{Op: OpSend, ID: "r2", ConversationID: "c/é", ClientMessageID: "m", Body: "<b>&\"quoted\"\\ \x00 \x7f \u2028 é \xff"},
	{Op: OpCreate, ID: "r3", ConversationID: "c", Members: []string{"bob", "carol<>"}, ClientMessageID: "x"},
	{Op: OpSync, ID: "r4", Cursors: map[string]int64{"b": 2, "a": -1, "é": 0}},
	{Op: OpHistory, ID: "r5", ConversationID: "c", BeforeSeq: 9, Limit: -3},
	{Op: OpRead, ID: "r6", ConversationID: "c", Seq: 1 << 62},
	{Op: OpRefresh, ID: "r7", Token: "a.b.c", UserID: "u"},
	{Op: OpCreate, Members: []string{}},
}

var appendReplies = []*Reply{
	{},
	{Op: OpAccepted, ID: "r1", ConversationID: "c1", Seq: 7, MessageID: "01K", ClientMessageID: "m-1"},
	{Op: OpRejected, ID: "r2", Code: CodeUnavailable, Message: "shard <moving> & \"busy\"", RetryAfterMS: 250},
	{Op: OpAccepted, ID: "r3", ExpiresAt: "2026-12-03T05:00:00Z", Seq: -1},
}

var appendEvents = []*Event{
	{},
	{Op: OpEvent, ConversationID: "c1", Seq: 7, Kind: "message", MessageID: "01K", ClientMessageID: "m-1", Sender: "u1", Body: "hi <é> \"q\" \x00 \xff", CreatedAt: "2026-12-03T07:00:00.123456Z"},
	{Op: OpEvent, ConversationID: "c1", Seq: 1, Kind: "create", MessageID: "01K", Sender: "u1", Members: []string{"u1", "u2&"}, CreatedAt: "2026-12-03T07:00:00Z"},
	{ConversationID: "c1", Seq: -2, Kind: "kick", Sender: "u1", UserID: "u2", Members: []string{}},
}

func TestAppendMatchesMarshal(t *testing.T) {
	for _, e := range appendEvents {
		want, _ := json.Marshal(e)
		if got := AppendEvent(nil, e); !bytes.Equal(got, want) {
			t.Errorf("AppendEvent(%+v)\n got %s\nwant %s", e, got, want)
		}
		m := &ReadMarker{Op: OpRead, ConversationID: e.ConversationID + e.Body, Seq: e.Seq}
		want, _ = json.Marshal(m)
		if got := AppendReadMarker(nil, m); !bytes.Equal(got, want) {
			t.Errorf("AppendReadMarker(%+v)\n got %s\nwant %s", m, got, want)
		}
	}
	for _, r := range appendRequests {
		want, _ := json.Marshal(r)
		if got := AppendRequest(nil, r); !bytes.Equal(got, want) {
			t.Errorf("AppendRequest(%+v)\n got %s\nwant %s", r, got, want)
		}
	}
	for _, r := range appendReplies {
		want, _ := json.Marshal(r)
		if got := AppendReply([]byte("x"), r); !bytes.Equal(got[1:], want) || got[0] != 'x' {
			t.Errorf("AppendReply(%+v)\n got %s\nwant %s", r, got, want)
		}
	}
}

func FuzzAppendRequest(f *testing.F) {
	for _, r := range appendRequests {
		f.Add(r.Op, r.ConversationID, r.Body, r.BeforeSeq, int64(len(r.Members)))
	}
	f.Fuzz(func(t *testing.T, op, conv, body string, n, k int64) {
		r := &Request{Op: op, ID: conv + op, ConversationID: conv, Body: body, BeforeSeq: n, Limit: int(k), Seq: n ^ k}
		if k%3 == 0 {
			r.Members = []string{body, op}
			r.Cursors = map[string]int64{conv: n, body: k}
		}
		want, _ := json.Marshal(r)
		if got := AppendRequest(nil, r); !bytes.Equal(got, want) {
			t.Fatalf("AppendRequest(%+v)\n got %s\nwant %s", r, got, want)
		}
		e := &Event{Op: op, ConversationID: conv, Seq: n, Kind: body, MessageID: op, ClientMessageID: body, Sender: conv, Body: body, UserID: op, CreatedAt: body}
		if k%2 == 0 {
			e.Members = []string{conv, body}
		}
		want, _ = json.Marshal(e)
		if got := AppendEvent(nil, e); !bytes.Equal(got, want) {
			t.Fatalf("AppendEvent(%+v)\n got %s\nwant %s", e, got, want)
		}
		m := &ReadMarker{Op: op, ConversationID: body, Seq: k}
		want, _ = json.Marshal(m)
		if got := AppendReadMarker(nil, m); !bytes.Equal(got, want) {
			t.Fatalf("AppendReadMarker(%+v)\n got %s\nwant %s", m, got, want)
		}
		rep := &Reply{Op: op, ID: conv, Message: body, Seq: n, RetryAfterMS: k, Code: Code(body)}
		want, _ = json.Marshal(rep)
		if got := AppendReply(nil, rep); !bytes.Equal(got, want) {
			t.Fatalf("AppendReply(%+v)\n got %s\nwant %s", rep, got, want)
		}
	})
}

// BenchmarkEncodeSend compares the hand encoder of a typical send with
// json.Marshal (the encoder it replaced on the link).
func BenchmarkEncodeSend(b *testing.B) {
	r := &Request{Op: OpSend, ID: "r123", ConversationID: "run.c17", ClientMessageID: "run.u1-0-1234",
		Body: "run.u1-0-1234 1764748800123456789 xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}
	var buf []byte
	versusMarshal(b, r, "AppendRequest", func() { buf = AppendRequest(buf[:0], r) })
}

// BenchmarkEncodeEvent compares the feed's encoding of one message event
// (EncodeEvent) with json.Marshal, which it replaced.
func BenchmarkEncodeEvent(b *testing.B) {
	e := &Event{Op: OpEvent, ConversationID: "conv-000123", Seq: 4711, Kind: "message", MessageID: "01KB8Z6Q9V3W4X5Y6Z7A8B9C0D", ClientMessageID: "d1-000042",
		Sender: "user-000017", Body: "a message body of a typical length, about sixty bytes long.", CreatedAt: "2026-12-03T07:00:00.123456Z"}
	versusMarshal(b, e, "EncodeEvent", func() { _ = EncodeEvent(e) })
}

// BenchmarkEncodeReadMarker compares EncodeReadMarker with json.Marshal,
// which it replaced.
func BenchmarkEncodeReadMarker(b *testing.B) {
	m := &ReadMarker{Op: OpRead, ConversationID: "conv-000123", Seq: 4711}
	versusMarshal(b, m, "EncodeReadMarker", func() { _ = EncodeReadMarker(m) })
}

// versusMarshal runs encode as the sub-benchmark name beside json.Marshal
// of v, the encoding it replaced.
func versusMarshal(b *testing.B, v any, name string, encode func()) {
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run(name, func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			encode()
		}
	})
}
