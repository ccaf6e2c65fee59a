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
	b = jsonenc.StringField(b, `,"conversation_id":`, r.ConversationID)
	if len(r.Members) > 0 {
		b = jsonenc.Strings(append(b, `,"members":`...), r.Members)
	}
	b = jsonenc.StringField(b, `,"user_id":`, r.UserID)
	b = jsonenc.StringField(b, `,"client_message_id":`, r.ClientMessageID)
	b = jsonenc.StringField(b, `,"body":`, r.Body)
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
	b = jsonenc.IntField(b, `,"before_seq":`, r.BeforeSeq)
	b = jsonenc.IntField(b, `,"limit":`, int64(r.Limit))
	b = jsonenc.IntField(b, `,"seq":`, r.Seq)
	b = jsonenc.StringField(b, `,"token":`, r.Token)
	return append(b, '}')
}

// AppendReply appends the JSON encoding of r to b: json.Marshal(r)'s
// bytes.
func AppendReply(b []byte, r *Reply) []byte {
	b = append(b, `{"op":`...)
	b = AppendString(b, r.Op)
	b = jsonenc.StringField(b, `,"id":`, r.ID)
	b = jsonenc.StringField(b, `,"conversation_id":`, r.ConversationID)
	b = jsonenc.IntField(b, `,"seq":`, r.Seq)
	b = jsonenc.StringField(b, `,"message_id":`, r.MessageID)
	b = jsonenc.StringField(b, `,"client_message_id":`, r.ClientMessageID)
	b = jsonenc.StringField(b, `,"code":`, string(r.Code))
	b = jsonenc.StringField(b, `,"message":`, r.Message)
	b = jsonenc.IntField(b, `,"retry_after_ms":`, r.RetryAfterMS)
	b = jsonenc.StringField(b, `,"expires_at":`, r.ExpiresAt)
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
	b = jsonenc.StringField(b, `,"client_message_id":`, e.ClientMessageID)
	b = AppendString(append(b, `,"sender":`...), e.Sender)
	b = jsonenc.StringField(b, `,"body":`, e.Body)
	b = jsonenc.StringField(b, `,"user_id":`, e.UserID)
	if len(e.Members) > 0 {
		b = jsonenc.Strings(append(b, `,"members":`...), e.Members)
	}
	b = AppendString(append(b, `,"created_at":`...), e.CreatedAt)
	return append(b, '}')
}

// EncodeEvent is AppendEvent into a new buffer sized for e (its keys and
// values, escapes aside): the frame the feed, and a backlog's read-back,
// hands to every device.
func EncodeEvent(e *Event) []byte {
	n := 160 + len(e.Op) + len(e.ConversationID) + len(e.Kind) + len(e.MessageID) + len(e.ClientMessageID) +
		len(e.Sender) + len(e.Body) + len(e.UserID) + len(e.CreatedAt)
	for _, m := range e.Members {
		n += len(m) + 3
	}
	return AppendEvent(make([]byte, 0, n), e)
}

// EncodeReadMarker is AppendReadMarker into a new buffer sized for m.
func EncodeReadMarker(m *ReadMarker) []byte {
	return AppendReadMarker(make([]byte, 0, 64+len(m.Op)+len(m.ConversationID)), m)
}

// AppendReadMarker appends the JSON encoding of m to b: json.Marshal(m)'s
// bytes.
func AppendReadMarker(b []byte, m *ReadMarker) []byte {
	b = AppendString(append(b, `{"op":`...), m.Op)
	b = AppendString(append(b, `,"conversation_id":`...), m.ConversationID)
	b = strconv.AppendInt(append(b, `,"seq":`...), m.Seq, 10)
	return append(b, '}')
}

// AppendString appends s as a JSON string exactly as encoding/json writes
// it (jsonenc.String).
func AppendString(b []byte, s string) []byte { return jsonenc.String(b, s) }
