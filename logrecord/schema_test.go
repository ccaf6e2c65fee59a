package logrecord

import (
	"encoding/json"
	"os"
	"slices"
	"testing"
	"time"
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
	kinds := []string{KindCreate, KindJoin, KindKick, KindLeave, KindMessage, KindTakeover, KindMoved}
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
	}
	events := []*Event{
		{Kind: KindTakeover, VShard: 3, Epoch: 1, Worker: "w1", CreatedAt: now},
		{Kind: KindMoved, ConversationID: "c", Seq: 4, MessageID: "m", ToVShard: new(int), VShard: 3, Epoch: 1, CreatedAt: now},
		{Kind: KindMessage, ConversationID: "c", Seq: 2, MessageID: "m", Sender: "a", ClientMessageID: "x", Body: "hi", VShard: 3, Epoch: 1, CreatedAt: now},
		{Kind: KindCreate, ConversationID: "c", Seq: 1, MessageID: "m", Sender: "a", Members: []string{"a"}, VShard: 3, CreatedAt: now},
		{Kind: KindJoin, ConversationID: "c", Seq: 3, MessageID: "m", Sender: "a", UserID: "b", VShard: 3, Epoch: 1, CreatedAt: now},
	}
	for _, e := range events {
		raw, err := e.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		json.Unmarshal(raw, &m)
		for _, f := range append(append([]string(nil), schema.Required...), perKind[e.Kind]...) {
			if _, ok := m[f]; !ok {
				t.Errorf("%s record lacks %q required by the schema: %s", e.Kind, f, raw)
			}
		}
	}
}
