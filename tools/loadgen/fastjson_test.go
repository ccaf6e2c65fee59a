package loadgen

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestDecodeFrameMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{
		`{"op":"accepted","id":"r1","conversation_id":"run.c17","seq":1234,"message_id":"01K","client_message_id":"m1"}`,
		` { "op" : "event" , "conversation_id":"c","seq":7,"kind":"message","message_id":"M","sender":"u","body":"m1 123 xx","created_at":"2026-12-01T10:00:00Z" } `,
		`{"op":"rejected","id":"r9","code":"rate_limited","message":"slow down","retry_after_ms":250}`,
		`{"op":"synced","id":"r2","cursors":{"c1":4,"c2":9},"more":true}`,
		`{"op":"event","kind":"create","members":["a","b"],"seq":1,"conversation_id":"c"}`,
		`{"op":"event","body":"caf\u00e9 \"quoted\"","seq":3}`,
		`{"op":"event","body":"café ☕","sender":null,"extra":1.5e3,"more":false}`,
		`{"op":"rejected","seq":-1}`,
		`{}`,
	} {
		var want, got frame
		if err := json.Unmarshal([]byte(s), &want); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if err := decodeFrame([]byte(s), &got); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got %+v\nwant %+v", s, got, want)
		}
	}
	for _, bad := range []string{`{"op":"event"`, `{"op":}`, `[1]`, `{"op":"a"} x`, "{\"op\":\"\xff\"}x"} {
		var f frame
		if err := decodeFrame([]byte(bad), &f); err == nil && json.Unmarshal([]byte(bad), &frame{}) != nil {
			t.Errorf("%q decoded: %+v", bad, f)
		}
	}
}

func TestAppendedJSONMatchesEncodingJSON(t *testing.T) {
	as := []Accepted{
		{Op: "send", Conv: "r.c1", Seq: 9, MessageID: "01K", ClientMessageID: "m3", Sender: "r.u1", Device: "r.u1/0", Due: 1, Sent: 2, At: 3, Attempts: 2, Dup: true},
		{Op: "join", Conv: "r.c1", Seq: 10, Sender: "r.u0", UserID: "r.u4", Device: "r.u0/0", Attempts: 1, Probe: true},
		{Op: "send", Conv: "c<&>\"\\\n é", Sender: "\xff"},
	}
	for _, a := range as {
		want, _ := json.Marshal(a)
		if got := appendAccepted(nil, &a); string(got) != string(want) {
			t.Errorf("accepted:\n got %s\nwant %s", got, want)
		}
	}
	x := Delivered{Device: "r.u1/1", Conv: "r.c1", Seq: 4, Kind: "message", MessageID: "M", Sender: "ü", At: 77}
	want, _ := json.Marshal(x)
	if got := appendDelivered(nil, &x); string(got) != string(want) {
		t.Errorf("delivered:\n got %s\nwant %s", got, want)
	}
	for _, o := range []op{
		{kind: "send", conv: "c", cmid: "m1", body: "m1 123 \"x\""},
		{kind: "create", conv: "c", members: []string{"a", "b"}},
		{kind: "create", conv: "c"},
		{kind: "kick", conv: "c", target: "u"},
		{kind: "join", conv: "c", target: "u", cmid: "j3"},
		{kind: "leave", conv: "c"},
		{kind: "sync", cursors: map[string]int64{"c": 3}},
	} {
		b := appendRequest(nil, &o, "r7")
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil || m["op"] != o.kind || m["id"] != "r7" {
			t.Errorf("%s: %s %v", o.kind, b, err)
		}
		if o.cmid != "" && m["client_message_id"] != o.cmid {
			t.Errorf("%s: client_message_id %v, want %s", o.kind, m["client_message_id"], o.cmid)
		}
		if o.kind == "send" && m["body"] != o.body {
			t.Errorf("body %q", m["body"])
		}
	}
}
