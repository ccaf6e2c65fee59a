package protocol

import (
	"slices"
	"strconv"

	"github.com/chatpipe/chatpipe/internal/jsonenc"
)

// The hot frames are encoded by hand: a command crosses the gateway↔worker
// link and its answer comes back on every message, and encoding/json's
// reflection (and the stack it grows in a command's goroutine) was a sixth
// of the gateway's CPU. The output is what json.Marshal makes of the same
// value, byte for byte (TestAppendMatchesMarshal, FuzzAppendRequest).

// AppendRequest appends the JSON encoding of r to b: json.Marshal(r)'s
// bytes.
func AppendRequest(b []byte, r *Request) []byte {
	b = append(b, `{"op":`...)
	b = AppendString(b, r.Op)
	b = append(b, `,"id":`...)
	b = AppendString(b, r.ID)
	b = appendStringField(b, `,"conversation_id":`, r.ConversationID)
	if len(r.Members) > 0 {
		b = jsonenc.Strings(append(b, `,"members":`...), r.Members)
	}
	b = appendStringField(b, `,"user_id":`, r.UserID)
	b = appendStringField(b, `,"client_message_id":`, r.ClientMessageID)
	b = appendStringField(b, `,"body":`, r.Body)
	if len(r.Cursors) > 0 {
		b = append(b, `,"cursors":{`...)
		keys := make([]string, 0, len(r.Cursors))
		for k := range r.Cursors {
			keys = append(keys, k)
		}
		slices.Sort(keys) // encoding/json sorts map keys
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendString(b, k)
			b = append(b, ':')
			b = strconv.AppendInt(b, r.Cursors[k], 10)
		}
		b = append(b, '}')
	}
	b = appendIntField(b, `,"before_seq":`, r.BeforeSeq)
	b = appendIntField(b, `,"limit":`, int64(r.Limit))
	b = appendIntField(b, `,"seq":`, r.Seq)
	b = appendStringField(b, `,"token":`, r.Token)
	return append(b, '}')
}

// AppendReply appends the JSON encoding of r to b: json.Marshal(r)'s
// bytes.
func AppendReply(b []byte, r *Reply) []byte {
	b = append(b, `{"op":`...)
	b = AppendString(b, r.Op)
	b = appendStringField(b, `,"id":`, r.ID)
	b = appendStringField(b, `,"conversation_id":`, r.ConversationID)
	b = appendIntField(b, `,"seq":`, r.Seq)
	b = appendStringField(b, `,"message_id":`, r.MessageID)
	b = appendStringField(b, `,"client_message_id":`, r.ClientMessageID)
	b = appendStringField(b, `,"code":`, string(r.Code))
	b = appendStringField(b, `,"message":`, r.Message)
	b = appendIntField(b, `,"retry_after_ms":`, r.RetryAfterMS)
	b = appendStringField(b, `,"expires_at":`, r.ExpiresAt)
	return append(b, '}')
}

// AppendEvent appends the JSON encoding of e to b: json.Marshal(e)'s
// bytes. An event frame is encoded once per gateway and written to every
// device of every member.
func AppendEvent(b []byte, e *Event) []byte {
	b = append(b, '{')
	if e.Op != "" {
		b = AppendString(append(b, `"op":`...), e.Op)
		b = append(b, ',')
	}
	b = AppendString(append(b, `"conversation_id":`...), e.ConversationID)
	b = strconv.AppendInt(append(b, `,"seq":`...), e.Seq, 10)
	b = AppendString(append(b, `,"kind":`...), e.Kind)
	b = AppendString(append(b, `,"message_id":`...), e.MessageID)
	b = appendStringField(b, `,"client_message_id":`, e.ClientMessageID)
	b = AppendString(append(b, `,"sender":`...), e.Sender)
	b = appendStringField(b, `,"body":`, e.Body)
	b = appendStringField(b, `,"user_id":`, e.UserID)
	if len(e.Members) > 0 {
		b = jsonenc.Strings(append(b, `,"members":`...), e.Members)
	}
	b = AppendString(append(b, `,"created_at":`...), e.CreatedAt)
	return append(b, '}')
}

// AppendReadMarker appends the JSON encoding of m to b: json.Marshal(m)'s
// bytes.
func AppendReadMarker(b []byte, m *ReadMarker) []byte {
	b = AppendString(append(b, `{"op":`...), m.Op)
	b = AppendString(append(b, `,"conversation_id":`...), m.ConversationID)
	b = strconv.AppendInt(append(b, `,"seq":`...), m.Seq, 10)
	return append(b, '}')
}

// appendStringField appends key and s unless s is empty (omitempty).
func appendStringField(b []byte, key, s string) []byte { return jsonenc.StringField(b, key, s) }

// appendIntField appends key and v unless v is 0 (omitempty).
func appendIntField(b []byte, key string, v int64) []byte { return jsonenc.IntField(b, key, v) }

// AppendString appends s as a JSON string exactly as encoding/json writes
// it (jsonenc.String).
func AppendString(b []byte, s string) []byte { return jsonenc.String(b, s) }
