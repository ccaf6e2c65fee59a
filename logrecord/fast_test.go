package logrecord_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/logrecord"
)

// FuzzUnmarshal: the one-parse fast path of Unmarshal reads every record
// value exactly as the lenient path does — the same event, or errors of
// the same class.
func FuzzUnmarshal(f *testing.F) {
	at := time.Date(2026, 11, 29, 7, 0, 0, 123456000, time.UTC)
	for _, e := range []*logrecord.Event{
		{Kind: logrecord.KindMessage, ConversationID: "c1", Seq: 7, MessageID: "01K", ClientMessageID: "m-7", Sender: "u1", Body: "hi \u00e9 \U0001F600", CreatedAt: at, VShard: 3, Epoch: 2},
		{Kind: logrecord.KindCreate, ConversationID: "c1", Seq: 1, MessageID: "01K", Sender: "u1", Members: []string{"u1", "u2"}, CreatedAt: at},
		{Kind: logrecord.KindKick, ConversationID: "c1", Seq: 9, MessageID: "01K", Sender: "u1", UserID: "u2", ClientMessageID: "k", CreatedAt: at},
		{Kind: logrecord.KindTakeover, VShard: 5, Epoch: 9, Worker: "w1", CreatedAt: at},
	} {
		b, err := e.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		`{"v":2,"kind":"message","seq":"x"}`, `{"v":1,"kind":"message","conversation_id":"c","seq":1,"Body":"caps"}`,
		`{"v":1,"kind":"message","conversation_id":"c","seq":1,"body":"a","body":"b"}`, `{"kind":"message"}`, `{"v":0}`,
		`{"v":1,"kind":"message","conversation_id":"c","seq":1,"created_at":"2026-11-29T07:00:00+02:00"}`,
		`{"v":1,"kind":"message","conversation_id":"c","seq":1,"extra":true}`, "{\"v\":1,\"kind\":\"message\",\"conversation_id\":\"c\",\"seq\":1,\"body\":\"\xff\"}",
		`{"v":1,"kind":"bogus"}`, `null`, `[]`, ``, `{"v":1.0,"kind":"takeover"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := logrecord.Unmarshal(b)
		le, lerr := logrecord.UnmarshalLenient(b)
		if (err == nil) != (lerr == nil) || errors.Is(err, logrecord.ErrUnsupportedVersion) != errors.Is(lerr, logrecord.ErrUnsupportedVersion) ||
			errors.Is(err, logrecord.ErrMalformed) != errors.Is(lerr, logrecord.ErrMalformed) {
			t.Fatalf("%q: fast %v, lenient %v", b, err, lerr)
		}
		if err == nil && !(reflect.DeepEqual(e, le) || sameEvent(e, le)) {
			t.Fatalf("%q: fast %+v, lenient %+v", b, e, le)
		}
	})
}

// sameEvent compares two events, their times as instants.
func sameEvent(a, b *logrecord.Event) bool {
	x, y := *a, *b
	if !x.CreatedAt.Equal(y.CreatedAt) {
		return false
	}
	x.CreatedAt, y.CreatedAt = time.Time{}, time.Time{}
	if len(x.Members) == 0 && len(y.Members) == 0 {
		x.Members, y.Members = nil, nil
	}
	return reflect.DeepEqual(x, y)
}

// BenchmarkUnmarshalMessage is a consumer's per-record decoding cost, the
// fast path beside the lenient one.
func BenchmarkUnmarshalMessage(b *testing.B) {
	b.Run("one-parse", func(b *testing.B) { benchUnmarshal(b, logrecord.Unmarshal) })
	b.Run("two-pass", func(b *testing.B) { benchUnmarshal(b, logrecord.UnmarshalLenient) })
}

func benchUnmarshal(b *testing.B, unmarshal func([]byte) (*logrecord.Event, error)) {
	e := &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: "g-000123", Seq: 4711, MessageID: "01KQ8Z3V9T4B6N2M5X7C1D0F8G",
		ClientMessageID: "u-000042-000000001234", Sender: "u-000042", Body: "hello there, this is a message of a typical length for a chat app",
		CreatedAt: time.Now(), VShard: 17, Epoch: 3}
	v, _ := e.Marshal()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := unmarshal(v); err != nil {
			b.Fatal(err)
		}
	}
}
