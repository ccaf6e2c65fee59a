package protocol_test

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/chatpipe/chatpipe/protocol"
)

const schemaURL = "https://github.com/chatpipe/chatpipe/docs/protocol.schema.json"

// frameSchemas compiles docs/protocol.schema.json's client and server
// frame definitions.
func frameSchemas(t *testing.T) (client, server *jsonschema.Schema) {
	t.Helper()
	b, err := os.ReadFile("../docs/protocol.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(schemaURL, doc); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Compile(schemaURL); err != nil {
		t.Fatal(err)
	}
	client, err = c.Compile(schemaURL + "#/$defs/clientFrame")
	if err != nil {
		t.Fatal(err)
	}
	server, err = c.Compile(schemaURL + "#/$defs/serverFrame")
	if err != nil {
		t.Fatal(err)
	}
	return client, server
}

func validate(sch *jsonschema.Schema, frame []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(frame))
	if err != nil {
		return err
	}
	return sch.Validate(v)
}

func marshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Every request the Go types marshal, and every reply they build, is a
// frame the schema describes; the schema's client frames are ones Decode
// accepts.
func TestSchemaMatchesGoTypes(t *testing.T) {
	clientSch, serverSch := frameSchemas(t)
	reqs := []protocol.Request{
		{Op: protocol.OpCreate, ID: "r1", ConversationID: "c1", Members: []string{"u2", "u3"}, ClientMessageID: "k1"},
		{Op: protocol.OpCreate, ID: "r1", ConversationID: "c1"},
		{Op: protocol.OpJoin, ID: "r2", ConversationID: "c1", UserID: "u4", ClientMessageID: "k2"},
		{Op: protocol.OpKick, ID: "r3", ConversationID: "c1", UserID: "u4"},
		{Op: protocol.OpLeave, ID: "r4", ConversationID: "c1", ClientMessageID: "k3"},
		{Op: protocol.OpSend, ID: "r5", ConversationID: "c1", ClientMessageID: "m-1", Body: "hi ✓ \u2028"},
		{Op: protocol.OpSync, ID: "r6", Cursors: map[string]int64{"c1": 5, "c2": 0}},
		{Op: protocol.OpSync, ID: "r6"},
		{Op: protocol.OpHistory, ID: "r7", ConversationID: "c1", BeforeSeq: 100, Limit: 20},
		{Op: protocol.OpHistory, ID: "r7", ConversationID: "c1"},
		{Op: protocol.OpConversations, ID: "r8", Limit: 10},
		{Op: protocol.OpRead, ID: "r9", ConversationID: "c1", Seq: 105},
		{Op: protocol.OpRefresh, ID: "r10", Token: "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ1MSJ9.c2ln"},
	}
	for _, r := range reqs {
		b := marshal(t, &r)
		if err := validate(clientSch, b); err != nil {
			t.Errorf("client frame %s: %v", b, err)
		}
		if _, _, e := protocol.Decode(b, protocol.DefaultLimits()); e != nil {
			t.Errorf("Decode(%s): %v", b, e)
		}
	}
	now := protocol.FormatTime(time.Date(2026, 11, 29, 7, 0, 0, 123456000, time.UTC))
	msg := &protocol.Event{Op: protocol.OpEvent, ConversationID: "c1", Seq: 105, Kind: "message", MessageID: "01K", ClientMessageID: "m-7", Sender: "u1", Body: "hi", CreatedAt: now}
	kick := &protocol.Event{Op: protocol.OpEvent, ConversationID: "c1", Seq: 106, Kind: "kick", MessageID: "01L", Sender: "u1", UserID: "u2", CreatedAt: now}
	create := &protocol.Event{ConversationID: "c1", Seq: 1, Kind: "create", MessageID: "01J", Sender: "u1", Members: []string{"u1", "u2"}, CreatedAt: protocol.FormatTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	hmsg := *msg
	hmsg.Op = ""
	replies := []any{
		&protocol.Reply{Op: protocol.OpAccepted, ID: "r1", ConversationID: "c1", Seq: 105, MessageID: "01K", ClientMessageID: "m-7"},
		&protocol.Reply{Op: protocol.OpAccepted, ID: "r1", ConversationID: "c1", Seq: 1, MessageID: "01J"},
		protocol.Rejected("r1", protocol.Errorf(protocol.CodeForbidden, "u2 is not a member of c1")),
		protocol.Rejected("", protocol.Errorf(protocol.CodeBadRequest, "frame is not a JSON object")),
		protocol.Rejected("r1", &protocol.Error{Code: protocol.CodeRateLimited, Message: "slow down", RetryAfterMS: 250}),
		msg, kick,
		&protocol.Synced{Op: protocol.OpSynced, ID: "r2", Cursors: map[string]int64{"c1": 106, "c2": 7}},
		&protocol.Synced{Op: protocol.OpSynced, ID: "r2", Cursors: map[string]int64{}, More: true},
		&protocol.HistoryPage{Op: protocol.OpHistory, ID: "r3", ConversationID: "c1", Events: []*protocol.Event{create, &hmsg}},
		&protocol.HistoryPage{Op: protocol.OpHistory, ID: "r3", ConversationID: "c1", Events: []*protocol.Event{}},
		&protocol.ConversationList{Op: protocol.OpConversations, ID: "r4", Conversations: []*protocol.ConversationInfo{{ConversationID: "c1", LastSeq: 105, LastActivityAt: now, ReadSeq: 100, Unread: 3}}},
		&protocol.Reply{Op: protocol.OpAccepted, ID: "r9", ConversationID: "c1", Seq: 105},
		&protocol.Reply{Op: protocol.OpAccepted, ID: "r10", ExpiresAt: protocol.FormatTime(time.Date(2026, 12, 1, 23, 0, 0, 0, time.UTC))},
		protocol.Rejected("r10", protocol.Errorf(protocol.CodeForbidden, "the token is for u2, not u1")),
		&protocol.ReadMarker{Op: protocol.OpRead, ConversationID: "c1", Seq: 105},
		&protocol.Synced{Op: protocol.OpSynced, ID: "r2", Cursors: map[string]int64{"c1": 106}, Read: map[string]int64{"c1": 100}},
	}
	for _, r := range replies {
		b := marshal(t, r)
		if err := validate(serverSch, b); err != nil {
			t.Errorf("server frame %s: %v", b, err)
		}
	}
}

// The schema is not a rubber stamp: frames that break the document fail.
func TestSchemaRejectsBadFrames(t *testing.T) {
	clientSch, serverSch := frameSchemas(t)
	badClient := []string{
		`{"op":"send","id":"r1","conversation_id":"c1","body":"hi"}`,                          // no client_message_id
		`{"op":"send","id":"r1","conversation_id":"c 1","client_message_id":"m","body":"hi"}`, // id alphabet
		`{"op":"send","id":"r1","conversation_id":"c1","client_message_id":"m","body":""}`,
		`{"op":"join","id":"r1","conversation_id":"c1"}`,
		`{"op":"sync","id":"r1","cursors":{"c1":-1}}`,
		`{"op":"shout","id":"r1"}`,
		`{"op":"read","id":"r1","conversation_id":"c1"}`,
		`{"op":"read","id":"r1","conversation_id":"c1","seq":0}`,
		`{"op":"create","id":"r1","conversation_id":"c1","extra":1}`,
		`{"op":"refresh","id":"r1"}`,
		`{"op":"refresh","id":"r1","token":""}`,
	}
	for _, f := range badClient {
		if validate(clientSch, []byte(f)) == nil {
			t.Errorf("client frame %s passed the schema", f)
		}
		if _, _, e := protocol.Decode([]byte(f), protocol.DefaultLimits()); e == nil && !strings.Contains(f, "extra") {
			t.Errorf("Decode accepted %s", f)
		}
	}
	badServer := []string{
		`{"op":"accepted","id":"r1","conversation_id":"c1","message_id":"x"}`, // no seq
		`{"op":"rejected","id":"r1","code":"nope","message":"x"}`,
		`{"op":"event","conversation_id":"c1","seq":2,"kind":"message","message_id":"x","sender":"u1","created_at":"2026-11-29T07:00:00Z"}`, // message without body
		`{"op":"event","conversation_id":"c1","seq":2,"kind":"join","message_id":"x","sender":"u1","created_at":"2026-11-29T07:00:00Z"}`,    // join without user_id
		`{"op":"event","conversation_id":"c1","seq":2,"kind":"message","message_id":"x","sender":"u1","body":"b","created_at":"yesterday"}`,
		`{"op":"synced","id":"r1"}`,
		`{"op":"accepted","id":"r1"}`, // neither a write's answer nor refresh's
		`{"op":"accepted","id":"r1","conversation_id":"c1","seq":1,"expires_at":"2026-11-29T07:00:00Z"}`,
		`{"op":"synced","id":"r1","cursors":{},"more":false}`,
		`{"op":"history","id":"r1","conversation_id":"c1","events":[{"op":"event","conversation_id":"c1","seq":1,"kind":"leave","message_id":"x","sender":"u1","user_id":"u1","created_at":"2026-11-29T07:00:00Z"}]}`,
	}
	for _, f := range badServer {
		if validate(serverSch, []byte(f)) == nil {
			t.Errorf("server frame %s passed the schema", f)
		}
	}
}
