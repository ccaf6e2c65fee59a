package logrecord

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The published JSON Schema (docs/log-record.schema.json) must match what
// Marshal writes: the same kinds, and every field it requires present in a
// record of each kind.
func TestSchemaMatchesRecords(t *testing.T) {
	b, err := os.ReadFile("../docs/log-record.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Required   []string `json:"required"`
		Properties struct {
			Kind struct {
				Enum []string `json:"enum"`
			} `json:"kind"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatalf("schema is not JSON: %v", err)
	}
	kinds := []string{KindCreate, KindJoin, KindKick, KindLeave, KindMessage, KindTakeover, KindMoved, KindRead}
	if !slices.Equal(schema.Properties.Kind.Enum, kinds) {
		t.Errorf("schema kinds %v, code %v", schema.Properties.Kind.Enum, kinds)
	}
	now := time.Now()
	perKind := map[string][]string{
		KindTakeover: {"worker"},
		KindMoved:    {"conversation_id", "seq", "message_id", "to_vshard"},
		KindMessage:  {"conversation_id", "seq", "message_id", "sender", "client_message_id", "body"},
		KindCreate:   {"conversation_id", "seq", "message_id", "sender", "members"},
		KindJoin:     {"conversation_id", "seq", "message_id", "sender", "user_id"},
		KindRead:     {"conversation_id", "user_id", "sender", "read_seq"},
	}
	events := []*Event{
		{Kind: KindTakeover, VShard: 3, Epoch: 1, Worker: "w1", CreatedAt: now},
		{Kind: KindMoved, ConversationID: "c", Seq: 4, MessageID: "m", ToVShard: new(int), VShard: 3, Epoch: 1, CreatedAt: now},
		{Kind: KindMoved, ConversationID: "c", Seq: 4, MessageID: "m", ToVShard: new(int), VShard: 3, Epoch: 1, CreatedAt: now,
			Verdicts: []Verdict{{ClientMessageID: "k", Sender: "a", Op: "send", Code: "forbidden", Message: "no", At: now}, {ClientMessageID: "j", Sender: "a", Op: "join", Seq: 2, At: now}}},
		{Kind: KindMessage, ConversationID: "c", Seq: 2, MessageID: "m", Sender: "a", ClientMessageID: "x", Body: "hi", VShard: 3, Epoch: 1, CreatedAt: now},
		{Kind: KindCreate, ConversationID: "c", Seq: 1, MessageID: "m", Sender: "a", Members: []string{"a"}, VShard: 3, CreatedAt: now},
		{Kind: KindJoin, ConversationID: "c", Seq: 3, MessageID: "m", Sender: "a", UserID: "b", VShard: 3, Epoch: 1, CreatedAt: now},
		{Kind: KindRead, ConversationID: "c", Sender: "b", UserID: "b", ReadSeq: 3, VShard: 3, Epoch: 1, CreatedAt: now},
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	const url = "https://github.com/chatpipe/chatpipe/docs/log-record.schema.json"
	c := jsonschema.NewCompiler()
	if err := c.AddResource(url, doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		raw, err := e.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if v, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw)); err != nil {
			t.Fatal(err)
		} else if err := sch.Validate(v); err != nil {
			t.Errorf("%s record does not match the schema: %s\n%v", e.Kind, raw, err)
		}
		var m map[string]any
		json.Unmarshal(raw, &m)
		for _, f := range append(append([]string(nil), schema.Required...), perKind[e.Kind]...) {
			if _, ok := m[f]; !ok {
				t.Errorf("%s record lacks %q required by the schema: %s", e.Kind, f, raw)
			}
		}
	}
	// ... and it is not a rubber stamp.
	for _, bad := range []string{
		`{"v":3,"kind":"read","conversation_id":"c","sender":"b","user_id":"b","read_seq":3,"seq":4,"created_at":"2026-12-01T00:00:00Z","vshard":1,"epoch":1}`,
		`{"v":1,"kind":"read","conversation_id":"c","sender":"b","user_id":"b","read_seq":3,"created_at":"2026-12-01T00:00:00Z","vshard":1,"epoch":1}`,
		`{"v":3,"kind":"message","conversation_id":"c","seq":2,"message_id":"m","sender":"a","client_message_id":"x","body":"hi","created_at":"2026-12-01T00:00:00Z","vshard":1,"epoch":1}`,
		"{\"v\":1,\"kind\":\"message\",\"conversation_id\":\"c\",\"seq\":2,\"message_id\":\"m\",\"sender\":\"a\",\"client_message_id\":\"x\",\"body\":\"a\\u0000b\",\"created_at\":\"2026-12-01T00:00:00Z\",\"vshard\":1,\"epoch\":1}",
	} {
		v, err := jsonschema.UnmarshalJSON(strings.NewReader(bad))
		if err != nil {
			t.Fatal(err)
		}
		if sch.Validate(v) == nil {
			t.Errorf("the schema accepts %s", bad)
		}
	}
}
