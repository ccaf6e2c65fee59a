package logrecord

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestUnmarshalErrors: a newer version is told apart from a record no
// version can read; a newer version is reported as such even when its
// fields no longer fit this version's types.
func TestUnmarshalErrors(t *testing.T) {
	for _, c := range []struct {
		value string
		want  error
	}{
		{`{"v":5,"kind":"message","conversation_id":"c","seq":1}`, ErrUnsupportedVersion},
		{`{"v":5,"kind":"message","seq":"one","members":{"a":1}}`, ErrUnsupportedVersion},
		{`{"v":5,"kind":"reaction"}`, ErrUnsupportedVersion},
		{`{"v":3,"kind":"reaction","conversation_id":"c","seq":1}`, ErrMalformed},
		{`{"v":2,"kind":"read","conversation_id":"c","user_id":"u","read_seq":3}`, ErrMalformed},
		{`{"v":3,"kind":"read","conversation_id":"c","user_id":"u","read_seq":3,"seq":4}`, ErrMalformed},
		{`{"v":3,"kind":"read","conversation_id":"c","read_seq":3}`, ErrMalformed},
		{`{"v":3,"kind":"read","conversation_id":"c","user_id":"u"}`, ErrMalformed},
		{`{"v":2,"kind":"reaction","conversation_id":"c","seq":1}`, ErrMalformed},
		{`{"v":1,"kind":"moved","conversation_id":"c","seq":2,"to_vshard":3}`, ErrMalformed},
		{`{"v":2,"kind":"moved","conversation_id":"c","seq":2}`, ErrMalformed},
		{`not json`, ErrMalformed},
		{"{\"v\":1,\"kind\":\"message\",\"body\":\"a\x00\"", ErrMalformed},
		{`{"kind":"message","conversation_id":"c","seq":1}`, ErrMalformed},
		{`{"v":0,"kind":"message","conversation_id":"c","seq":1}`, ErrMalformed},
		{`{"v":"1","kind":"message","conversation_id":"c","seq":1}`, ErrMalformed},
		{`{"v":1,"kind":"reaction","conversation_id":"c","seq":1}`, ErrMalformed},
		{`{"v":1,"kind":"message","seq":1}`, ErrMalformed},
		{`{"v":1,"kind":"message","conversation_id":"c","seq":"x"}`, ErrMalformed},
	} {
		_, err := Unmarshal([]byte(c.value))
		if !errors.Is(err, c.want) {
			t.Errorf("Unmarshal(%q) = %v, want %v", c.value, err, c.want)
		}
		other := ErrMalformed
		if c.want == ErrMalformed {
			other = ErrUnsupportedVersion
		}
		if errors.Is(err, other) {
			t.Errorf("Unmarshal(%q) = %v, also %v", c.value, err, other)
		}
	}
	if e, err := Unmarshal([]byte(`{"v":1,"kind":"message","conversation_id":"c","seq":1,"body":"a\u0000b"}`)); err != nil || e.Body != "a\x00b" {
		t.Errorf("a valid record with a NUL in its body = %v, %v; it decodes (only Postgres refuses it)", e, err)
	}
}

// A moved record is written as version 2 and reads back with its target;
// every other kind is still written as version 1.
func TestMovedRecordRoundTrip(t *testing.T) {
	to := 0
	e := &Event{Kind: KindMoved, ConversationID: "c", Seq: 9, MessageID: "m", ToVShard: &to, VShard: 12}
	raw, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Unmarshal(raw)
	if err != nil || got.V != 2 || got.ToVShard == nil || *got.ToVShard != 0 || got.Seq != 9 {
		t.Fatalf("Unmarshal(%s) = %+v, %v", raw, got, err)
	}
	m := &Event{Kind: KindMessage, ConversationID: "c", Seq: 1, MessageID: "m", Body: "hi"}
	if raw, _ := m.Marshal(); m.V != 1 || strings.Contains(string(raw), "to_vshard") {
		t.Fatalf("message written as %s", raw)
	}
	r := &Event{Kind: KindRead, ConversationID: "c", UserID: "u", Sender: "u", ReadSeq: 7, VShard: 3}
	raw, err = r.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := Unmarshal(raw); err != nil || got.V != 3 || got.ReadSeq != 7 || got.Seq != 0 || got.HasSeq() || !m.HasSeq() {
		t.Fatalf("read record %s = %+v, %v", raw, got, err)
	}
	l := Layout{VShards: 8, Partitions: 4, Dedicated: 2}
	if l.Partition(5) != 1 || l.Partition(8) != 4 || l.Partition(9) != 5 || l.TopicPartitions() != 6 || !l.IsDedicated(9) || l.IsDedicated(7) || l.IsDedicated(10) {
		t.Fatalf("layout %+v maps wrongly", l)
	}
}

// A moved record that carries verdicts is version 4, and they survive the
// round trip; one without says 2; one that claims verdicts in version 2
// is malformed.
func TestMovedVerdictsRoundTrip(t *testing.T) {
	to := 6
	at := time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC)
	e := &Event{Kind: KindMoved, ConversationID: "c", Seq: 9, MessageID: "m", ToVShard: &to, VShard: 3, CreatedAt: at,
		Verdicts: []Verdict{{ClientMessageID: "k", Sender: "u2", Op: "send", Code: "forbidden", Message: "no", At: at}}}
	b, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Unmarshal(b)
	if err != nil || got.V != 4 || len(got.Verdicts) != 1 || got.Verdicts[0] != e.Verdicts[0] {
		t.Fatalf("Unmarshal(%s) = %+v, %v", b, got, err)
	}
	e.Verdicts = nil
	if b, _ := e.Marshal(); e.V != 2 {
		t.Fatalf("a moved record without verdicts: %s", b)
	}
	bad := `{"v":2,"kind":"moved","conversation_id":"c","seq":9,"to_vshard":6,"created_at":"2026-12-06T04:00:00Z","vshard":3,"epoch":0,"verdicts":[{"client_message_id":"k","sender":"u","op":"send","at":"2026-12-06T04:00:00Z"}]}`
	if _, err := Unmarshal([]byte(bad)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("verdicts in version 2: %v, want malformed", err)
	}
}
