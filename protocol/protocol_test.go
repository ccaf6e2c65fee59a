package protocol_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/chatpipe/chatpipe/protocol"
)

// anyID marks a case whose echoed id is not checked.
const anyID = "\x00any"

type decodeCase struct {
	name     string
	frame    string
	wantCode protocol.Code // "" means Decode must succeed
	wantID   string        // echoed id; anyID to skip the check
	check    func(t *testing.T, r *protocol.Request)
}

func runDecodeCases(t *testing.T, cases []decodeCase) {
	t.Helper()
	lim := protocol.DefaultLimits()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, id, err := protocol.Decode([]byte(tc.frame), lim)
			if tc.wantID != anyID && id != tc.wantID {
				t.Errorf("echoed id = %q, want %q", id, tc.wantID)
			}
			if tc.wantCode == "" {
				if err != nil {
					t.Fatalf("Decode(%s) error = %v, want success", abbrev(tc.frame), err)
				}
				if r == nil {
					t.Fatal("Decode returned nil request and nil error")
				}
				if r.ID != id {
					t.Errorf("request ID = %q, echoed id = %q", r.ID, id)
				}
				if tc.check != nil {
					tc.check(t, r)
				}
				return
			}
			if err == nil {
				t.Fatalf("Decode(%s) succeeded with %+v, want %s", abbrev(tc.frame), r, tc.wantCode)
			}
			if r != nil {
				t.Errorf("Decode returned a request with an error: %+v", r)
			}
			if err.Code != tc.wantCode {
				t.Errorf("code = %s (%v), want %s", err.Code, err, tc.wantCode)
			}
			if err.Message == "" {
				t.Error("rejection has an empty message")
			}
		})
	}
}

func abbrev(s string) string {
	if len(s) > 120 {
		return fmt.Sprintf("%q…(%d bytes)", s[:120], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// jstr encodes s as a JSON string literal.
func jstr(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// jmembers encodes n distinct valid member ids as a JSON array.
func jmembers(n int) string {
	m := make([]string, n)
	for i := range m {
		m[i] = fmt.Sprintf("u%d", i)
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func TestDecodeNotAnObject(t *testing.T) {
	frames := map[string]string{
		"empty array":        `[]`,
		"array of a request": `[{"op":"leave","id":"r1","conversation_id":"c1"}]`,
		"string":             `"hello"`,
		"number":             `42`,
		"bool":               `true`,
		"null":               `null`,
		"empty frame":        ``,
		"whitespace":         "  \n",
		"truncated object":   `{"id":"r1","op":"leave"`,
		"trailing comma":     `{"id":"r1",}`,
		"single quotes":      `{'id':'r1'}`,
		"two objects":        `{"id":"r1","op":"leave","conversation_id":"c1"} {"id":"r2"}`,
		"garbage":            `op=send&id=r1`,
	}
	var cases []decodeCase
	for name, f := range frames {
		cases = append(cases, decodeCase{name: name, frame: f, wantCode: protocol.CodeBadRequest, wantID: ""})
	}
	runDecodeCases(t, cases)
}

func TestDecodeRequestID(t *testing.T) {
	long := strings.Repeat("r", 129)
	max := strings.Repeat("r", 128)
	runDecodeCases(t, []decodeCase{
		{name: "missing id", frame: `{"op":"leave","conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: ""},
		{name: "empty id", frame: `{"id":"","op":"leave","conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: ""},
		{name: "null id", frame: `{"id":null,"op":"leave","conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: ""},
		{name: "id number", frame: `{"id":7,"op":"leave","conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: ""},
		{name: "id bool", frame: `{"id":true,"op":"leave","conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: ""},
		{name: "id array", frame: `{"id":["r1"],"op":"leave","conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: ""},
		{name: "id object", frame: `{"id":{"v":"r1"},"op":"leave","conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: ""},
		{name: "id 129 bytes", frame: `{"id":"` + long + `","op":"leave","conversation_id":"c1"}`, wantCode: protocol.CodeTooLarge, wantID: anyID},
		{name: "id 128 bytes", frame: `{"id":"` + max + `","op":"leave","conversation_id":"c1"}`, wantID: max},
		{name: "id full alphabet", frame: `{"id":"azAZ09._:-","op":"leave","conversation_id":"c1"}`, wantID: "azAZ09._:-"},
		{name: "id via escapes", frame: `{"id":"\u0072\u0031","op":"leave","conversation_id":"c1"}`, wantID: "r1"},
	})
}

// TestDecodeRequestIDAlphabet: the spec limits every id, request ids
// included (Limits.MaxIDBytes says so), to [A-Za-z0-9._:-].
func TestDecodeRequestIDAlphabet(t *testing.T) {
	var cases []decodeCase
	for name, id := range map[string]string{
		"space":   "r 1",
		"slash":   "r/1",
		"unicode": "ré",
		"emoji":   "r🙂",
		"newline": "r\n1",
		"nul":     "r\x001",
		"quote":   `r"1`,
		"hash":    "r#1",
	} {
		cases = append(cases, decodeCase{
			name:     name,
			frame:    `{"id":` + jstr(id) + `,"op":"leave","conversation_id":"c1"}`,
			wantCode: protocol.CodeBadRequest,
			wantID:   anyID,
		})
	}
	runDecodeCases(t, cases)
}

// TestDecodeRequestIDCaseVariantKey: encoding/json matches struct fields
// case-insensitively while Decode reads the id from the exact key "id", so
// an "ID" key can replace the request id after it was checked.
func TestDecodeRequestIDCaseVariantKey(t *testing.T) {
	long := strings.Repeat("x", 1000)
	runDecodeCases(t, []decodeCase{
		{name: "ID after id", frame: `{"id":"r1","ID":"r2","op":"leave","conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: anyID},
		{name: "Id bad alphabet", frame: `{"id":"r1","Id":"bad id","op":"leave","conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: anyID},
		{name: "iD too long", frame: `{"id":"r1","iD":"` + long + `","op":"leave","conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: anyID},
	})
}

func TestDecodeOp(t *testing.T) {
	runDecodeCases(t, []decodeCase{
		{name: "unknown op", frame: `{"id":"r1","op":"delete","conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: "r1"},
		{name: "op wrong case", frame: `{"id":"r1","op":"LEAVE","conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: "r1"},
		{name: "server op accepted", frame: `{"id":"r1","op":"accepted","conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: "r1"},
		{name: "server op event", frame: `{"id":"r1","op":"event","conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: "r1"},
		{name: "op with spaces", frame: `{"id":"r1","op":" leave","conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: "r1"},
		{name: "missing op", frame: `{"id":"r1","conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: "r1"},
		{name: "empty op", frame: `{"id":"r1","op":"","conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: "r1"},
		{name: "null op", frame: `{"id":"r1","op":null,"conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: "r1"},
		{name: "op number", frame: `{"id":"r1","op":3,"conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: "r1"},
		{name: "op array", frame: `{"id":"r1","op":["leave"],"conversation_id":"c1"}`, wantCode: protocol.CodeBadRequest, wantID: "r1"},
		{name: "only id", frame: `{"id":"r1"}`, wantCode: protocol.CodeBadRequest, wantID: "r1"},
	})
}

func TestDecodeMissingField(t *testing.T) {
	bad := protocol.CodeBadRequest
	runDecodeCases(t, []decodeCase{
		{name: "create/conversation_id", frame: `{"id":"r1","op":"create","members":["u2"]}`, wantCode: bad, wantID: "r1"},
		{name: "create/empty conversation_id", frame: `{"id":"r1","op":"create","conversation_id":"","members":["u2"]}`, wantCode: bad, wantID: "r1"},
		{name: "create/null conversation_id", frame: `{"id":"r1","op":"create","conversation_id":null}`, wantCode: bad, wantID: "r1"},
		{name: "join/conversation_id", frame: `{"id":"r1","op":"join","user_id":"u2"}`, wantCode: bad, wantID: "r1"},
		{name: "join/user_id", frame: `{"id":"r1","op":"join","conversation_id":"c1"}`, wantCode: bad, wantID: "r1"},
		{name: "join/empty user_id", frame: `{"id":"r1","op":"join","conversation_id":"c1","user_id":""}`, wantCode: bad, wantID: "r1"},
		{name: "kick/conversation_id", frame: `{"id":"r1","op":"kick","user_id":"u2"}`, wantCode: bad, wantID: "r1"},
		{name: "kick/user_id", frame: `{"id":"r1","op":"kick","conversation_id":"c1"}`, wantCode: bad, wantID: "r1"},
		{name: "leave/conversation_id", frame: `{"id":"r1","op":"leave"}`, wantCode: bad, wantID: "r1"},
		{name: "send/conversation_id", frame: `{"id":"r1","op":"send","client_message_id":"m1","body":"hi"}`, wantCode: bad, wantID: "r1"},
		{name: "send/client_message_id", frame: `{"id":"r1","op":"send","conversation_id":"c1","body":"hi"}`, wantCode: bad, wantID: "r1"},
		{name: "send/body", frame: `{"id":"r1","op":"send","conversation_id":"c1","client_message_id":"m1"}`, wantCode: bad, wantID: "r1"},
		{name: "send/empty body", frame: `{"id":"r1","op":"send","conversation_id":"c1","client_message_id":"m1","body":""}`, wantCode: bad, wantID: "r1"},
		{name: "send/null body", frame: `{"id":"r1","op":"send","conversation_id":"c1","client_message_id":"m1","body":null}`, wantCode: bad, wantID: "r1"},
		{name: "history/conversation_id", frame: `{"id":"r1","op":"history","limit":10}`, wantCode: bad, wantID: "r1"},
		{name: "sync/empty cursor key", frame: `{"id":"r1","op":"sync","cursors":{"":3}}`, wantCode: bad, wantID: "r1"},
		{name: "create/empty member", frame: `{"id":"r1","op":"create","conversation_id":"c1","members":["u2",""]}`, wantCode: bad, wantID: "r1"},
		{name: "create/null member", frame: `{"id":"r1","op":"create","conversation_id":"c1","members":["u2",null]}`, wantCode: bad, wantID: "r1"},
	})
}

func TestDecodeWrongType(t *testing.T) {
	bad := protocol.CodeBadRequest
	runDecodeCases(t, []decodeCase{
		{name: "body number", frame: `{"id":"r1","op":"send","conversation_id":"c1","client_message_id":"m1","body":5}`, wantCode: bad, wantID: "r1"},
		{name: "body object", frame: `{"id":"r1","op":"send","conversation_id":"c1","client_message_id":"m1","body":{"text":"hi"}}`, wantCode: bad, wantID: "r1"},
		{name: "body array", frame: `{"id":"r1","op":"send","conversation_id":"c1","client_message_id":"m1","body":["hi"]}`, wantCode: bad, wantID: "r1"},
		{name: "members string", frame: `{"id":"r1","op":"create","conversation_id":"c1","members":"u2"}`, wantCode: bad, wantID: "r1"},
		{name: "members of numbers", frame: `{"id":"r1","op":"create","conversation_id":"c1","members":[1,2]}`, wantCode: bad, wantID: "r1"},
		{name: "members object", frame: `{"id":"r1","op":"create","conversation_id":"c1","members":{"u2":true}}`, wantCode: bad, wantID: "r1"},
		{name: "conversation_id number", frame: `{"id":"r1","op":"leave","conversation_id":12}`, wantCode: bad, wantID: "r1"},
		{name: "conversation_id bool", frame: `{"id":"r1","op":"leave","conversation_id":false}`, wantCode: bad, wantID: "r1"},
		{name: "user_id number", frame: `{"id":"r1","op":"join","conversation_id":"c1","user_id":2}`, wantCode: bad, wantID: "r1"},
		{name: "user_id array", frame: `{"id":"r1","op":"kick","conversation_id":"c1","user_id":["u2"]}`, wantCode: bad, wantID: "r1"},
		{name: "client_message_id number", frame: `{"id":"r1","op":"send","conversation_id":"c1","client_message_id":7,"body":"hi"}`, wantCode: bad, wantID: "r1"},
		{name: "cursors array", frame: `{"id":"r1","op":"sync","cursors":["c1"]}`, wantCode: bad, wantID: "r1"},
		{name: "cursors string", frame: `{"id":"r1","op":"sync","cursors":"c1"}`, wantCode: bad, wantID: "r1"},
		{name: "cursor value string", frame: `{"id":"r1","op":"sync","cursors":{"c1":"5"}}`, wantCode: bad, wantID: "r1"},
		{name: "cursor value float", frame: `{"id":"r1","op":"sync","cursors":{"c1":1.5}}`, wantCode: bad, wantID: "r1"},
		{name: "before_seq string", frame: `{"id":"r1","op":"history","conversation_id":"c1","before_seq":"9"}`, wantCode: bad, wantID: "r1"},
		{name: "before_seq overflow", frame: `{"id":"r1","op":"history","conversation_id":"c1","before_seq":1e30}`, wantCode: bad, wantID: "r1"},
		{name: "limit string", frame: `{"id":"r1","op":"history","conversation_id":"c1","limit":"50"}`, wantCode: bad, wantID: "r1"},
		{name: "limit float", frame: `{"id":"r1","op":"history","conversation_id":"c1","limit":1.5}`, wantCode: bad, wantID: "r1"},
	})
}

func TestDecodeIDFieldAlphabet(t *testing.T) {
	bad := map[string]string{
		"space":   "c 1",
		"slash":   "c/1",
		"unicode": "cé",
		"emoji":   "🙂",
		"tab":     "c\t1",
		"nul":     "c\x00",
		"hash":    "c#1",
		"comma":   "c,1",
		"empty":   "",
	}
	var cases []decodeCase
	for name, v := range bad {
		s := jstr(v)
		cases = append(cases,
			decodeCase{name: "conversation_id/" + name, frame: `{"id":"r1","op":"leave","conversation_id":` + s + `}`},
			decodeCase{name: "user_id/" + name, frame: `{"id":"r1","op":"join","conversation_id":"c1","user_id":` + s + `}`},
			decodeCase{name: "members/" + name, frame: `{"id":"r1","op":"create","conversation_id":"c1","members":["u2",` + s + `]}`},
			decodeCase{name: "client_message_id/" + name, frame: `{"id":"r1","op":"send","conversation_id":"c1","client_message_id":` + s + `,"body":"hi"}`},
			decodeCase{name: "cursors key/" + name, frame: `{"id":"r1","op":"sync","cursors":{"c1":1,` + s + `:2}}`},
			decodeCase{name: "history conversation_id/" + name, frame: `{"id":"r1","op":"history","conversation_id":` + s + `}`},
		)
	}
	for i := range cases {
		cases[i].wantCode = protocol.CodeBadRequest
		cases[i].wantID = "r1"
	}
	runDecodeCases(t, cases)
}

func TestDecodeIDFieldLength(t *testing.T) {
	long := jstr(strings.Repeat("a", 129))
	max := strings.Repeat("a", 128)
	tl := protocol.CodeTooLarge
	runDecodeCases(t, []decodeCase{
		{name: "conversation_id 129", frame: `{"id":"r1","op":"leave","conversation_id":` + long + `}`, wantCode: tl, wantID: "r1"},
		{name: "user_id 129", frame: `{"id":"r1","op":"join","conversation_id":"c1","user_id":` + long + `}`, wantCode: tl, wantID: "r1"},
		{name: "member 129", frame: `{"id":"r1","op":"create","conversation_id":"c1","members":["u2",` + long + `]}`, wantCode: tl, wantID: "r1"},
		{name: "client_message_id 129", frame: `{"id":"r1","op":"send","conversation_id":"c1","client_message_id":` + long + `,"body":"hi"}`, wantCode: tl, wantID: "r1"},
		{name: "cursors key 129", frame: `{"id":"r1","op":"sync","cursors":{` + long + `:1}}`, wantCode: tl, wantID: "r1"},
		{name: "history conversation_id 129", frame: `{"id":"r1","op":"history","conversation_id":` + long + `}`, wantCode: tl, wantID: "r1"},
		{
			name:   "all ids 128",
			frame:  `{"id":"r1","op":"send","conversation_id":"` + max + `","client_message_id":"` + max + `","body":"hi"}`,
			wantID: "r1",
			check: func(t *testing.T, r *protocol.Request) {
				if r.ConversationID != max || r.ClientMessageID != max {
					t.Errorf("ids not preserved: %d, %d bytes", len(r.ConversationID), len(r.ClientMessageID))
				}
			},
		},
		{name: "member 128", frame: `{"id":"r1","op":"create","conversation_id":"c1","members":["` + max + `"]}`, wantID: "r1"},
	})
}

func sendFrame(body string) string {
	return `{"id":"r1","op":"send","conversation_id":"c1","client_message_id":"m1","body":` + body + `}`
}

func TestDecodeBody(t *testing.T) {
	wantBody := func(want string) func(*testing.T, *protocol.Request) {
		return func(t *testing.T, r *protocol.Request) {
			if r.Body != want {
				t.Errorf("body = %s, want %s", abbrev(r.Body), abbrev(want))
			}
		}
	}
	b4096 := strings.Repeat("x", 4096)
	e2048 := strings.Repeat("é", 2048) // 4096 bytes, 2048 runes
	runDecodeCases(t, []decodeCase{
		{name: "4096 bytes", frame: sendFrame(jstr(b4096)), wantID: "r1", check: wantBody(b4096)},
		{name: "4097 bytes", frame: sendFrame(jstr(b4096 + "x")), wantCode: protocol.CodeTooLarge, wantID: "r1"},
		{name: "far over", frame: sendFrame(jstr(strings.Repeat("x", 60000))), wantCode: protocol.CodeTooLarge, wantID: "r1"},
		{name: "4096 bytes of 2-byte runes", frame: sendFrame(jstr(e2048)), wantID: "r1", check: wantBody(e2048)},
		{name: "4098 bytes of 2-byte runes", frame: sendFrame(jstr(e2048 + "é")), wantCode: protocol.CodeTooLarge, wantID: "r1"},
		// The limit applies to the decoded body, not to its escaped form.
		{name: "4096 bytes escaped", frame: sendFrame(`"` + strings.Repeat(`\n`, 4096) + `"`), wantID: "r1", check: wantBody(strings.Repeat("\n", 4096))},
		{name: "4097 bytes escaped", frame: sendFrame(`"` + strings.Repeat(`\u0041`, 4097) + `"`), wantCode: protocol.CodeTooLarge, wantID: "r1"},
		{name: "unicode", frame: sendFrame(`"héllo 🙂 \u4e16"`), wantID: "r1", check: wantBody("héllo 🙂 世")},
		{name: "whitespace only", frame: sendFrame(`" "`), wantID: "r1", check: wantBody(" ")},
	})
}

// TestDecodeInvalidUTF8Body: encoding/json silently replaces invalid UTF-8
// (and lone surrogates) in strings with U+FFFD, so Validate's UTF-8 check
// never sees the original bytes when called from Decode.
func TestDecodeInvalidUTF8Body(t *testing.T) {
	// Validate itself rejects an invalid body.
	r := &protocol.Request{Op: protocol.OpSend, ID: "r1", ConversationID: "c1", ClientMessageID: "m1", Body: "ab\xffcd"}
	if e := r.Validate(protocol.DefaultLimits()); e == nil || e.Code != protocol.CodeBadRequest {
		t.Fatalf("Validate(invalid UTF-8 body) = %v, want bad_request", e)
	}
	runDecodeCases(t, []decodeCase{
		{name: "raw 0xff", frame: sendFrame("\"ab\xffcd\""), wantCode: protocol.CodeBadRequest, wantID: "r1"},
		{name: "truncated rune", frame: sendFrame("\"ab\xc3\""), wantCode: protocol.CodeBadRequest, wantID: "r1"},
		{name: "overlong encoding", frame: sendFrame("\"\xc0\xaf\""), wantCode: protocol.CodeBadRequest, wantID: "r1"},
		{name: "encoded surrogate", frame: sendFrame("\"\xed\xa0\x80\""), wantCode: protocol.CodeBadRequest, wantID: "r1"},
		{name: "lone surrogate escape", frame: sendFrame(`"\ud800"`), wantCode: protocol.CodeBadRequest, wantID: "r1"},
	})
}

// TestDecodeNULBody: Postgres text and jsonb cannot hold U+0000, so a body
// with one would be accepted and committed and then never stored. The edge
// refuses it, escaped or raw, anywhere in the body; other control
// characters are stored as sent.
func TestDecodeNULBody(t *testing.T) {
	r := &protocol.Request{Op: protocol.OpSend, ID: "r1", ConversationID: "c1", ClientMessageID: "m1", Body: "a\x00b"}
	if e := r.Validate(protocol.DefaultLimits()); e == nil || e.Code != protocol.CodeBadRequest {
		t.Fatalf("Validate(body with NUL) = %v, want bad_request", e)
	}
	runDecodeCases(t, []decodeCase{
		{name: "escaped inside", frame: sendFrame(`"a\u0000b"`), wantCode: protocol.CodeBadRequest, wantID: "r1"},
		{name: "escaped alone", frame: sendFrame(`"\u0000"`), wantCode: protocol.CodeBadRequest, wantID: "r1"},
		{name: "escaped at the end", frame: sendFrame(`"hi\u0000"`), wantCode: protocol.CodeBadRequest, wantID: "r1"},
		// A raw control byte is not JSON at all: no id can be read.
		{name: "raw NUL byte", frame: sendFrame("\"a\x00b\""), wantCode: protocol.CodeBadRequest, wantID: ""},
		{name: "other controls kept", frame: sendFrame(`"a\u0001\u001f\u007fb"`), wantID: "r1", check: func(t *testing.T, r *protocol.Request) {
			if r.Body != "a\x01\x1f\x7fb" {
				t.Errorf("body = %q", r.Body)
			}
		}},
	})
}

func TestDecodeMembersLimit(t *testing.T) {
	createFrame := func(members string) string {
		return `{"id":"r1","op":"create","conversation_id":"c1","members":` + members + `}`
	}
	nMembers := func(n int) func(*testing.T, *protocol.Request) {
		return func(t *testing.T, r *protocol.Request) {
			if len(r.Members) != n {
				t.Errorf("members = %d, want %d", len(r.Members), n)
			}
		}
	}
	runDecodeCases(t, []decodeCase{
		{name: "99 members plus caller", frame: createFrame(jmembers(99)), wantID: "r1", check: nMembers(99)},
		{name: "100 members plus caller", frame: createFrame(jmembers(100)), wantCode: protocol.CodeTooLarge, wantID: "r1"},
		{name: "101 members", frame: createFrame(jmembers(101)), wantCode: protocol.CodeTooLarge, wantID: "r1"},
		{name: "1000 members", frame: createFrame(jmembers(1000)), wantCode: protocol.CodeTooLarge, wantID: "r1"},
		{name: "no members", frame: createFrame(`[]`), wantID: "r1", check: nMembers(0)},
		{name: "members absent", frame: `{"id":"r1","op":"create","conversation_id":"c1"}`, wantID: "r1", check: nMembers(0)},
		{name: "members null", frame: createFrame(`null`), wantID: "r1", check: nMembers(0)},
	})
}

func TestDecodeNegativeNumbers(t *testing.T) {
	bad := protocol.CodeBadRequest
	runDecodeCases(t, []decodeCase{
		{name: "negative cursor", frame: `{"id":"r1","op":"sync","cursors":{"c1":-1}}`, wantCode: bad, wantID: "r1"},
		{name: "negative before_seq", frame: `{"id":"r1","op":"history","conversation_id":"c1","before_seq":-1}`, wantCode: bad, wantID: "r1"},
		{name: "negative limit", frame: `{"id":"r1","op":"history","conversation_id":"c1","limit":-5}`, wantCode: bad, wantID: "r1"},
		// history clamps limit itself; a large limit is not an error.
		{name: "limit over 200", frame: `{"id":"r1","op":"history","conversation_id":"c1","limit":1000}`, wantID: "r1"},
		{name: "zero cursor", frame: `{"id":"r1","op":"sync","cursors":{"c1":0}}`, wantID: "r1"},
	})
}

func TestDecodeValid(t *testing.T) {
	runDecodeCases(t, []decodeCase{
		{
			name:   "create",
			frame:  `{"op":"create","id":"r1","conversation_id":"c1","members":["u2","u3"]}`,
			wantID: "r1",
			check: func(t *testing.T, r *protocol.Request) {
				want := protocol.Request{Op: protocol.OpCreate, ID: "r1", ConversationID: "c1", Members: []string{"u2", "u3"}}
				if !reflect.DeepEqual(*r, want) {
					t.Errorf("got %+v, want %+v", *r, want)
				}
			},
		},
		{
			name:   "join",
			frame:  `{"op":"join","id":"r2","conversation_id":"c1","user_id":"u4"}`,
			wantID: "r2",
			check: func(t *testing.T, r *protocol.Request) {
				want := protocol.Request{Op: protocol.OpJoin, ID: "r2", ConversationID: "c1", UserID: "u4"}
				if !reflect.DeepEqual(*r, want) {
					t.Errorf("got %+v, want %+v", *r, want)
				}
			},
		},
		{
			name:   "kick",
			frame:  `{"op":"kick","id":"r3","conversation_id":"c1","user_id":"u2"}`,
			wantID: "r3",
			check: func(t *testing.T, r *protocol.Request) {
				want := protocol.Request{Op: protocol.OpKick, ID: "r3", ConversationID: "c1", UserID: "u2"}
				if !reflect.DeepEqual(*r, want) {
					t.Errorf("got %+v, want %+v", *r, want)
				}
			},
		},
		{
			name:   "leave",
			frame:  `{"op":"leave","id":"r4","conversation_id":"room.1:x-y_z"}`,
			wantID: "r4",
			check: func(t *testing.T, r *protocol.Request) {
				want := protocol.Request{Op: protocol.OpLeave, ID: "r4", ConversationID: "room.1:x-y_z"}
				if !reflect.DeepEqual(*r, want) {
					t.Errorf("got %+v, want %+v", *r, want)
				}
			},
		},
		{
			name:   "send",
			frame:  `{"op":"send","id":"r5","conversation_id":"c1","client_message_id":"m-7","body":"hi \"there\"\n"}`,
			wantID: "r5",
			check: func(t *testing.T, r *protocol.Request) {
				want := protocol.Request{Op: protocol.OpSend, ID: "r5", ConversationID: "c1", ClientMessageID: "m-7", Body: "hi \"there\"\n"}
				if !reflect.DeepEqual(*r, want) {
					t.Errorf("got %+v, want %+v", *r, want)
				}
			},
		},
		{
			name:   "sync",
			frame:  `{"op":"sync","id":"r6","cursors":{"c1":106,"c2":7}}`,
			wantID: "r6",
			check: func(t *testing.T, r *protocol.Request) {
				want := protocol.Request{Op: protocol.OpSync, ID: "r6", Cursors: map[string]int64{"c1": 106, "c2": 7}}
				if !reflect.DeepEqual(*r, want) {
					t.Errorf("got %+v, want %+v", *r, want)
				}
			},
		},
		{
			name:   "sync empty cursors",
			frame:  `{"op":"sync","id":"r7","cursors":{}}`,
			wantID: "r7",
			check: func(t *testing.T, r *protocol.Request) {
				if r.Op != protocol.OpSync || len(r.Cursors) != 0 {
					t.Errorf("got %+v", *r)
				}
			},
		},
		{
			name:   "sync cursors absent",
			frame:  `{"op":"sync","id":"r8"}`,
			wantID: "r8",
		},
		{
			name:   "sync large cursor",
			frame:  `{"op":"sync","id":"r9","cursors":{"c1":9223372036854775807}}`,
			wantID: "r9",
			check: func(t *testing.T, r *protocol.Request) {
				if r.Cursors["c1"] != 1<<63-1 {
					t.Errorf("cursor = %d", r.Cursors["c1"])
				}
			},
		},
		{
			name:   "history",
			frame:  `{"op":"history","id":"r10","conversation_id":"c1","before_seq":105,"limit":20}`,
			wantID: "r10",
			check: func(t *testing.T, r *protocol.Request) {
				want := protocol.Request{Op: protocol.OpHistory, ID: "r10", ConversationID: "c1", BeforeSeq: 105, Limit: 20}
				if !reflect.DeepEqual(*r, want) {
					t.Errorf("got %+v, want %+v", *r, want)
				}
			},
		},
		{
			name:   "history defaults",
			frame:  `{"op":"history","id":"r11","conversation_id":"c1"}`,
			wantID: "r11",
			check: func(t *testing.T, r *protocol.Request) {
				if r.BeforeSeq != 0 || r.Limit != 0 {
					t.Errorf("got %+v", *r)
				}
			},
		},
		{
			name:   "unknown fields ignored",
			frame:  `{"op":"leave","id":"r12","conversation_id":"c1","extra":{"nested":[1,2,3]},"v":2}`,
			wantID: "r12",
		},
		{
			name:   "fields of other ops ignored",
			frame:  `{"op":"leave","id":"r13","conversation_id":"c1","body":"x","members":["u9"],"limit":5}`,
			wantID: "r13",
		},
		{
			name:   "whitespace around object",
			frame:  " \n\t{\"op\":\"leave\",\"id\":\"r14\",\"conversation_id\":\"c1\"}\n ",
			wantID: "r14",
		},
	})
}

// TestDecodeForgedSender: the sender is always the authenticated user; a
// "sender" field in a request is ignored and cannot be carried.
func TestDecodeForgedSender(t *testing.T) {
	if _, ok := reflect.TypeFor[protocol.Request]().FieldByName("Sender"); ok {
		t.Fatal("protocol.Request has a Sender field; the sender must come from authentication only")
	}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[protocol.Request]()) {
		if tag := f.Tag.Get("json"); strings.HasPrefix(tag, "sender") {
			t.Fatalf("field %s decodes from json %q", f.Name, tag)
		}
	}
	runDecodeCases(t, []decodeCase{
		{
			name:   "send with sender",
			frame:  `{"op":"send","id":"r1","conversation_id":"c1","client_message_id":"m1","body":"hi","sender":"admin"}`,
			wantID: "r1",
			check: func(t *testing.T, r *protocol.Request) {
				want := protocol.Request{Op: protocol.OpSend, ID: "r1", ConversationID: "c1", ClientMessageID: "m1", Body: "hi"}
				if !reflect.DeepEqual(*r, want) {
					t.Errorf("got %+v, want %+v", *r, want)
				}
			},
		},
		{
			name:   "sender object",
			frame:  `{"op":"leave","id":"r2","conversation_id":"c1","sender":{"id":"admin","role":"owner"}}`,
			wantID: "r2",
		},
	})
}

func TestValidate(t *testing.T) {
	lim := protocol.DefaultLimits()
	members := func(n int) []string {
		m := make([]string, n)
		for i := range m {
			m[i] = fmt.Sprintf("u%d", i)
		}
		return m
	}
	tests := []struct {
		name string
		r    protocol.Request
		want protocol.Code
	}{
		{"create ok", protocol.Request{Op: protocol.OpCreate, ConversationID: "c1", Members: []string{"u2"}}, ""},
		{"create 99 members", protocol.Request{Op: protocol.OpCreate, ConversationID: "c1", Members: members(99)}, ""},
		{"create 100 members", protocol.Request{Op: protocol.OpCreate, ConversationID: "c1", Members: members(100)}, protocol.CodeTooLarge},
		{"create no conversation", protocol.Request{Op: protocol.OpCreate}, protocol.CodeBadRequest},
		{"create bad member", protocol.Request{Op: protocol.OpCreate, ConversationID: "c1", Members: []string{"u 2"}}, protocol.CodeBadRequest},
		{"join ok", protocol.Request{Op: protocol.OpJoin, ConversationID: "c1", UserID: "u2"}, ""},
		{"join no user", protocol.Request{Op: protocol.OpJoin, ConversationID: "c1"}, protocol.CodeBadRequest},
		{"kick ok", protocol.Request{Op: protocol.OpKick, ConversationID: "c1", UserID: "u2"}, ""},
		{"kick long user", protocol.Request{Op: protocol.OpKick, ConversationID: "c1", UserID: strings.Repeat("u", 129)}, protocol.CodeTooLarge},
		{"leave ok", protocol.Request{Op: protocol.OpLeave, ConversationID: "c1"}, ""},
		{"leave slash", protocol.Request{Op: protocol.OpLeave, ConversationID: "c/1"}, protocol.CodeBadRequest},
		{"send ok", protocol.Request{Op: protocol.OpSend, ConversationID: "c1", ClientMessageID: "m1", Body: "hi"}, ""},
		{"send 4096", protocol.Request{Op: protocol.OpSend, ConversationID: "c1", ClientMessageID: "m1", Body: strings.Repeat("x", 4096)}, ""},
		{"send 4097", protocol.Request{Op: protocol.OpSend, ConversationID: "c1", ClientMessageID: "m1", Body: strings.Repeat("x", 4097)}, protocol.CodeTooLarge},
		{"send invalid utf8", protocol.Request{Op: protocol.OpSend, ConversationID: "c1", ClientMessageID: "m1", Body: "\xff"}, protocol.CodeBadRequest},
		{"send no body", protocol.Request{Op: protocol.OpSend, ConversationID: "c1", ClientMessageID: "m1"}, protocol.CodeBadRequest},
		{"send no client_message_id", protocol.Request{Op: protocol.OpSend, ConversationID: "c1", Body: "hi"}, protocol.CodeBadRequest},
		{"sync ok", protocol.Request{Op: protocol.OpSync, Cursors: map[string]int64{"c1": 4}}, ""},
		{"sync nil cursors", protocol.Request{Op: protocol.OpSync}, ""},
		{"sync negative", protocol.Request{Op: protocol.OpSync, Cursors: map[string]int64{"c1": -4}}, protocol.CodeBadRequest},
		{"sync unicode key", protocol.Request{Op: protocol.OpSync, Cursors: map[string]int64{"ç": 4}}, protocol.CodeBadRequest},
		{"history ok", protocol.Request{Op: protocol.OpHistory, ConversationID: "c1", BeforeSeq: 3, Limit: 2}, ""},
		{"read ok", protocol.Request{Op: protocol.OpRead, ConversationID: "c1", Seq: 3}, ""},
		{"read without seq", protocol.Request{Op: protocol.OpRead, ConversationID: "c1"}, protocol.CodeBadRequest},
		{"read negative seq", protocol.Request{Op: protocol.OpRead, ConversationID: "c1", Seq: -2}, protocol.CodeBadRequest},
		{"read without conversation", protocol.Request{Op: protocol.OpRead, Seq: 3}, protocol.CodeBadRequest},
		{"refresh ok", protocol.Request{Op: protocol.OpRefresh, Token: "a.b.c"}, ""},
		{"refresh without token", protocol.Request{Op: protocol.OpRefresh}, protocol.CodeBadRequest},
		{"conversations ok", protocol.Request{Op: protocol.OpConversations}, ""},
		{"conversations negative limit", protocol.Request{Op: protocol.OpConversations, Limit: -1}, protocol.CodeBadRequest},
		{"history negative limit", protocol.Request{Op: protocol.OpHistory, ConversationID: "c1", Limit: -1}, protocol.CodeBadRequest},
		{"no op", protocol.Request{ConversationID: "c1"}, protocol.CodeBadRequest},
		{"unknown op", protocol.Request{Op: "synced"}, protocol.CodeBadRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.r.Validate(lim)
			switch {
			case tc.want == "" && e != nil:
				t.Errorf("Validate = %v, want nil", e)
			case tc.want != "" && e == nil:
				t.Errorf("Validate = nil, want %s", tc.want)
			case tc.want != "" && e.Code != tc.want:
				t.Errorf("Validate = %v, want %s", e, tc.want)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	seeds := []string{
		`{"op":"create","id":"r1","conversation_id":"c1","members":["u2","u3"]}`,
		`{"op":"join","id":"r2","conversation_id":"c1","user_id":"u4"}`,
		`{"op":"kick","id":"r3","conversation_id":"c1","user_id":"u2"}`,
		`{"op":"leave","id":"r4","conversation_id":"c1"}`,
		`{"op":"send","id":"r5","conversation_id":"c1","client_message_id":"m-7","body":"hi"}`,
		`{"op":"sync","id":"r6","cursors":{"c1":106,"c2":7}}`,
		`{"op":"history","id":"r7","conversation_id":"c1","before_seq":105,"limit":20}`,
		`{"op":"send","id":"r8","conversation_id":"c1","client_message_id":"m1","body":"hi","sender":"admin"}`,
		`{"op":"history","id":"r17","conversation_id":"c1","limit":1e2}`,
		`{"op":"history","id":"r18","conversation_id":"c1","limit":2.0}`,
		`{"op":"send","id":"r19","conversation_id":"c1","client_message_id":"m1","body":"a","body":"b"}`,
		`{"op":"send","id":"r20","conversation_id":"c1","client_message_id":"m1","body":null}`,
		`{"op":"sync","id":"r21","cursors":{"c1":1,"c1":2}}`,
		`{"op":"send","id":"r16","conversation_id":"c1","client_message_id":"m1","body":"a\u0000b"}`,
		`{"op":"send","id":"r9","conversation_id":"c1","client_message_id":"m1","body":5}`,
		`{"op":"create","id":"r10","conversation_id":"c1","members":"u2"}`,
		`{"op":"delete","id":"r11"}`,
		`{"id":7}`,
		`{"op":"sync","id":"r12","cursors":{"c1":-1}}`,
		`{"op":"history","id":"r13","conversation_id":"c1","before_seq":1e30}`,
		"{\"op\":\"send\",\"id\":\"r14\",\"conversation_id\":\"c1\",\"client_message_id\":\"m1\",\"body\":\"\xff\"}",
		`{"op":"leave","id":"r15","ID":"r16","conversation_id":"c1"}`,
		`{"op":"leave","id":"r15","ID":"r16","conversation_iD":"c1"}`,
		`{"op":"sync","id":"r22","cursors":{"c 1":1,"c2":-1,"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx":3}}`,
		`[]`,
		`null`,
		`"s"`,
		`42`,
		`{`,
		``,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	lim := protocol.DefaultLimits()
	f.Fuzz(func(t *testing.T, frame []byte) {
		r, id, err := protocol.Decode(frame, lim)
		// The one-parse fast path answers exactly as the lenient path.
		lr, lid, lerr := protocol.DecodeLenient(frame, lim)
		if id != lid || (err == nil) != (lerr == nil) || (err != nil && *err != *lerr) || !reflect.DeepEqual(r, lr) {
			t.Fatalf("Decode and the lenient path disagree on %q:\n fast    %+v %q %v\n lenient %+v %q %v", frame, r, id, err, lr, lid, lerr)
		}
		if err != nil {
			if r != nil {
				t.Fatalf("Decode returned both a request and an error %v", err)
			}
			if err.Code != protocol.CodeBadRequest && err.Code != protocol.CodeTooLarge {
				t.Fatalf("Decode error code = %s (%v), want bad_request or too_large", err.Code, err)
			}
			if len(id) > lim.MaxIDBytes {
				t.Fatalf("echoed id is %d bytes, over the %d-byte limit", len(id), lim.MaxIDBytes)
			}
			return
		}
		if r == nil {
			t.Fatal("Decode returned neither a request nor an error")
		}
		if id == "" {
			t.Fatal("Decode succeeded with an empty id")
		}
		if e := r.Validate(lim); e != nil {
			t.Fatalf("Decode succeeded but Validate fails: %v", e)
		}
		if !utf8.ValidString(r.Body) {
			t.Fatalf("Decode succeeded with a body that is not valid UTF-8: %q", r.Body)
		}
		if strings.ContainsRune(r.Body, 0) {
			t.Fatalf("Decode succeeded with a body holding NUL, which Postgres cannot store: %q", r.Body)
		}
		// What Decode accepts, the log record carries unchanged: encoding
		// and decoding the body as JSON gives it back byte for byte.
		b, _ := json.Marshal(r.Body)
		var back string
		if err := json.Unmarshal(b, &back); err != nil || back != r.Body {
			t.Fatalf("body does not survive a JSON round trip: %q → %q (%v)", r.Body, back, err)
		}
	})
}

// A frame with several faults always gets the same answer, whatever order
// the decoder's maps iterate in.
func TestDecodeAnswersDeterministically(t *testing.T) {
	lim := protocol.DefaultLimits()
	for _, frame := range []string{
		`{"op":"leave","id":"r1","ID":"r2","Op":"x","conversation_iD":"c1","Body":"b"}`,
		`{"op":"sync","id":"r2","cursors":{"c 1":1,"c2":-1,"c3":-2,"c:4":-3}}`,
	} {
		_, _, first := protocol.Decode([]byte(frame), lim)
		if first == nil {
			t.Fatalf("Decode(%s) = nil error, want a rejection", frame)
		}
		for i := 0; i < 200; i++ {
			if _, _, e := protocol.Decode([]byte(frame), lim); e == nil || *e != *first {
				t.Fatalf("Decode(%s) answered %v, then %v", frame, first, e)
			}
		}
	}
}
