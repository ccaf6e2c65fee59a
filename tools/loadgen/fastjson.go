package loadgen

import (
	"encoding/json"
	"errors"
	"strconv"
	"unicode/utf8"

	"github.com/chatpipe/chatpipe/protocol"
)

// The hot path's JSON: server frames are flat objects of strings, numbers
// and booleans, and loadgen's own requests and records are known shapes,
// so both are scanned and appended by hand. Anything the fast path does
// not cover (an escape in a string, a nested value, a syntax error) falls
// back to encoding/json, which stays the reference.

var errSlow = errors.New("loadgen: not a flat frame")

// decodeFrame decodes a server frame into f.
func decodeFrame(b []byte, f *frame) error {
	if err := decodeFlat(b, f); err == nil {
		return nil
	}
	*f = frame{}
	return json.Unmarshal(b, f)
}

func decodeFlat(b []byte, f *frame) error {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return errSlow
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return trailing(b, i+1)
	}
	for {
		ks, ke, j, ok := scanString(b, i)
		if !ok {
			return errSlow
		}
		i = skipWS(b, j)
		if i >= len(b) || b[i] != ':' {
			return errSlow
		}
		i = skipWS(b, i+1)
		if i >= len(b) {
			return errSlow
		}
		key := b[ks:ke]
		var err error
		switch b[i] {
		case '"':
			vs, ve, j, ok := scanString(b, i)
			if !ok {
				return errSlow
			}
			setString(f, key, b[vs:ve])
			i = j
		case 't', 'f', 'n':
			i, err = scanLiteral(b, i, f, key)
		case '{', '[':
			return errSlow // cursors, members: rare, left to encoding/json
		default:
			i, err = scanInt(b, i, f, key)
		}
		if err != nil {
			return err
		}
		i = skipWS(b, i)
		if i >= len(b) {
			return errSlow
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			return trailing(b, i+1)
		default:
			return errSlow
		}
	}
}

func trailing(b []byte, i int) error {
	if skipWS(b, i) != len(b) {
		return errSlow
	}
	return nil
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
		i++
	}
	return i
}

// scanString scans the string starting at b[i] == '"' and returns its
// contents' bounds and the index after it; ok is false for an escape,
// a control character or invalid UTF-8 (the slow path handles those).
func scanString(b []byte, i int) (start, end, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, 0, 0, false
	}
	start = i + 1
	ascii := true
	for j := start; j < len(b); j++ {
		c := b[j]
		switch {
		case c == '"':
			if !ascii && !utf8.Valid(b[start:j]) {
				return 0, 0, 0, false
			}
			return start, j, j + 1, true
		case c == '\\' || c < 0x20:
			return 0, 0, 0, false
		case c >= 0x80:
			ascii = false
		}
	}
	return 0, 0, 0, false
}

func scanLiteral(b []byte, i int, f *frame, key []byte) (int, error) {
	for _, lit := range []string{"true", "false", "null"} {
		if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
			if string(key) == "more" {
				f.More = lit == "true"
			}
			return i + len(lit), nil
		}
	}
	return 0, errSlow
}

// scanInt scans a JSON number; seq and retry_after_ms must be integers.
func scanInt(b []byte, i int, f *frame, key []byte) (int, error) {
	j := i
	for j < len(b) && (b[j] == '-' || b[j] == '+' || b[j] == '.' || b[j] == 'e' || b[j] == 'E' || (b[j] >= '0' && b[j] <= '9')) {
		j++
	}
	if j == i {
		return 0, errSlow
	}
	var dst *int64
	switch string(key) {
	case "seq":
		dst = &f.Seq
	case "retry_after_ms":
		dst = &f.RetryAfterMS
	default:
		return j, nil // a number the run does not read
	}
	v, err := strconv.ParseInt(string(b[i:j]), 10, 64)
	if err != nil {
		return 0, errSlow
	}
	*dst = v
	return j, nil
}

// common values, so that decoding them allocates nothing.
var interned = map[string]string{}

func init() {
	for _, s := range []string{"event", "accepted", "rejected", "synced", "message", "create", "join", "kick", "leave",
		"unavailable", "rate_limited", "forbidden", "not_found", "conflict", "bad_request"} {
		interned[s] = s
	}
}

func intern(v []byte) string {
	if s, ok := interned[string(v)]; ok { // no allocation for the lookup
		return s
	}
	return string(v)
}

func setString(f *frame, key, v []byte) {
	switch string(key) {
	case "op":
		f.Op = intern(v)
	case "id":
		f.ID = string(v)
	case "conversation_id":
		f.ConversationID = string(v)
	case "message_id":
		f.MessageID = string(v)
	case "client_message_id":
		f.ClientMessageID = string(v)
	case "code":
		f.Code = intern(v)
	case "message":
		f.Message = string(v)
	case "kind":
		f.Kind = intern(v)
	case "sender":
		f.Sender = string(v)
	case "body":
		f.Body = string(v)
	case "user_id":
		f.UserID = string(v)
	}
}

func appendField(b []byte, key, v string) []byte {
	b = append(b, ',', '"')
	b = append(b, key...)
	b = append(b, '"', ':')
	return protocol.AppendString(b, v)
}

func appendIntField(b []byte, key string, v int64) []byte {
	b = append(b, ',', '"')
	b = append(b, key...)
	b = append(b, '"', ':')
	return strconv.AppendInt(b, v, 10)
}

// appendRequest appends the request frame of o's attempt id.
func appendRequest(b []byte, o *op, id string) []byte {
	r := protocol.Request{Op: o.kind, ID: id, ConversationID: o.conv, ClientMessageID: o.cmid}
	switch o.kind {
	case "create":
		r.Members = o.members
	case "send":
		r.Body = o.body
	case "join", "kick":
		r.UserID = o.target
	case "sync":
		r.Cursors = o.cursors
	}
	return protocol.AppendRequest(b, &r)
}

// appendAccepted appends a's line of accepted.jsonl (as json.Marshal would).
func appendAccepted(b []byte, a *Accepted) []byte {
	b = append(b, `{"op":`...)
	b = protocol.AppendString(b, a.Op)
	b = appendField(b, "c", a.Conv)
	b = appendIntField(b, "s", a.Seq)
	b = appendField(b, "m", a.MessageID)
	if a.ClientMessageID != "" {
		b = appendField(b, "k", a.ClientMessageID)
	}
	b = appendField(b, "u", a.Sender)
	if a.UserID != "" {
		b = appendField(b, "uid", a.UserID)
	}
	b = appendField(b, "d", a.Device)
	b = appendIntField(b, "t0", a.Due)
	b = appendIntField(b, "ts", a.Sent)
	b = appendIntField(b, "ta", a.At)
	b = appendIntField(b, "n", int64(a.Attempts))
	if a.Dup {
		b = append(b, `,"dup":true`...)
	}
	if a.Probe {
		b = append(b, `,"probe":true`...)
	}
	return append(b, '}')
}

// appendDelivered appends x's line of delivered.jsonl (as json.Marshal would).
func appendDelivered(b []byte, x *Delivered) []byte {
	b = append(b, `{"d":`...)
	b = protocol.AppendString(b, x.Device)
	b = appendField(b, "c", x.Conv)
	b = appendIntField(b, "s", x.Seq)
	b = appendField(b, "kind", x.Kind)
	b = appendField(b, "m", x.MessageID)
	b = appendField(b, "u", x.Sender)
	b = appendIntField(b, "ta", x.At)
	return append(b, '}')
}
