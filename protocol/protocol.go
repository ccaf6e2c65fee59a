// Package protocol is the public websocket contract (docs/protocol.md): the
// client's requests, their validation, and the server's replies. It is pure:
// decoding and validation only, no I/O.
package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	jsonv2 "github.com/go-json-experiment/json"
)

// Ops a client may send.
const (
	OpCreate  = "create"
	OpJoin    = "join"
	OpKick    = "kick"
	OpLeave   = "leave"
	OpSend    = "send"
	OpSync    = "sync"
	OpHistory = "history"
	// OpConversations lists the caller's conversations, most recently
	// active first (an op added to the v1 contract).
	OpConversations = "conversations"
	// OpRead records that the caller has read a conversation up to seq
	// (a read marker; an op added to the v1 contract). The server also
	// pushes a frame of this op to the user's devices when their marker
	// moves forward (ReadMarker).
	OpRead = "read"
	// OpRefresh replaces the token of an open connection (an op added to
	// the v1 contract): the new token's sub must be the connection's user.
	OpRefresh = "refresh"
)

// SubprotocolBatch is the websocket subprotocol a client may ask for at the
// upgrade (Sec-WebSocket-Protocol): the server then sends several server
// frames in one message, separated by a newline ("\n"; a frame never
// contains one). A client that asks for nothing gets one frame per
// message. Client → server messages are one frame each either way.
const SubprotocolBatch = "chatpipe.v1.batch"

// Server ops.
const (
	OpAccepted = "accepted"
	OpRejected = "rejected"
	OpEvent    = "event"
	OpSynced   = "synced"
)

// Code is a client-facing rejection code.
type Code string

// Rejection codes of docs/protocol.md.
const (
	CodeBadRequest   Code = "bad_request"
	CodeUnauthorized Code = "unauthorized"
	CodeForbidden    Code = "forbidden"
	CodeNotFound     Code = "not_found"
	CodeConflict     Code = "conflict"
	CodeTooLarge     Code = "too_large"
	CodeRateLimited  Code = "rate_limited"
	CodeUnavailable  Code = "unavailable"
)

// Error is a rejection with a client-facing code.
type Error struct {
	Code         Code
	Message      string
	RetryAfterMS int64
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Errorf builds an *Error.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Limits bound what a request may carry. The zero value is not useful; use
// DefaultLimits.
type Limits struct {
	MaxFrameBytes int // a larger frame closes the connection with 1009
	MaxBodyBytes  int // body, in bytes of UTF-8
	MaxIDBytes    int // conversation, user, client message and request ids
	MaxMembers    int // members per conversation, owner included
	MaxHistory    int // history page size clamp
}

// DefaultLimits are the limits of docs/protocol.md.
func DefaultLimits() Limits {
	return Limits{MaxFrameBytes: 64 << 10, MaxBodyBytes: 4 << 10, MaxIDBytes: 128, MaxMembers: 100, MaxHistory: 200}
}

// Request is one client command. Fields not used by its op are ignored.
// A "sender" or "user_id" claiming to be someone else is never trusted: the
// sender of every command is the authenticated user.
type Request struct {
	Op              string           `json:"op"`
	ID              string           `json:"id"`
	ConversationID  string           `json:"conversation_id,omitempty"`
	Members         []string         `json:"members,omitempty"`
	UserID          string           `json:"user_id,omitempty"`
	ClientMessageID string           `json:"client_message_id,omitempty"`
	Body            string           `json:"body,omitempty"`
	Cursors         map[string]int64 `json:"cursors,omitempty"`
	BeforeSeq       int64            `json:"before_seq,omitempty"`
	Limit           int              `json:"limit,omitempty"`
	// Seq is read's marker: the caller has read the conversation up to it.
	Seq int64 `json:"seq,omitempty"`
	// Token is refresh's new bearer token.
	Token string `json:"token,omitempty"`
}

// Decode parses and validates one frame. On error it returns the request id
// when one could be read (empty when the frame is not a JSON object) and an
// *Error with code bad_request or too_large.
func Decode(frame []byte, lim Limits) (*Request, string, *Error) {
	// Fast path, one parse: a strict decoder (exact field names, no unknown
	// or repeated member, valid UTF-8 and surrogates) accepts the frames
	// clients send. Whatever it refuses is decided by decodeLenient, which
	// gives the same answer the strict path would for every frame it
	// accepts (FuzzDecode checks the two agree) and finds the id to echo.
	var r Request
	if len(frame) > 0 && frame[0] == '{' && jsonv2.Unmarshal(frame, &r, jsonv2.RejectUnknownMembers(true)) == nil {
		if e := CheckID("id", r.ID, lim); e != nil {
			return nil, "", e
		}
		if e := r.Validate(lim); e != nil {
			return nil, r.ID, e
		}
		return &r, r.ID, nil
	}
	return decodeLenient(frame, lim)
}

// decodeLenient is Decode for any frame: unknown fields are ignored, and a
// rejection names the request id when one can be read.
func decodeLenient(frame []byte, lim Limits) (*Request, string, *Error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(frame, &raw); err != nil || raw == nil {
		return nil, "", Errorf(CodeBadRequest, "frame is not a JSON object")
	}
	// encoding/json matches field names case-insensitively, last key
	// winning: an "ID" or "Body" key must not replace a checked field.
	// The map has no order: name the smallest offending key, so that the
	// same frame always gets the same answer.
	bad := ""
	for k := range raw {
		if l := strings.ToLower(k); l != k && fieldNames[l] && (bad == "" || k < bad) {
			bad = k
		}
	}
	if bad != "" {
		return nil, "", Errorf(CodeBadRequest, "field names are case-sensitive: %q", bad)
	}
	var id string
	if rid, ok := raw["id"]; ok {
		if err := json.Unmarshal(rid, &id); err != nil {
			return nil, "", Errorf(CodeBadRequest, "id must be a string")
		}
	}
	if e := CheckID("id", id, lim); e != nil {
		return nil, "", e
	}
	// encoding/json replaces invalid UTF-8 and lone surrogate escapes with
	// U+FFFD, which would store an altered message: reject them instead.
	if !utf8.Valid(frame) || hasLoneSurrogate(frame) {
		return nil, id, Errorf(CodeBadRequest, "frame is not valid UTF-8")
	}
	var r Request
	if err := json.Unmarshal(frame, &r); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, id, Errorf(CodeBadRequest, "field %s has the wrong type", te.Field)
		}
		return nil, id, Errorf(CodeBadRequest, "malformed request: %v", err)
	}
	if e := r.Validate(lim); e != nil {
		return nil, id, e
	}
	return &r, id, nil
}

// fieldNames are the JSON names of Request's fields.
var fieldNames = map[string]bool{
	"op": true, "id": true, "conversation_id": true, "members": true, "user_id": true,
	"client_message_id": true, "body": true, "cursors": true, "before_seq": true, "limit": true, "seq": true,
	"token": true,
}

// hasLoneSurrogate reports whether a JSON text has a \uD800–\uDFFF escape
// that is not half of a surrogate pair.
func hasLoneSurrogate(b []byte) bool {
	for i := 0; i+5 < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		if b[i+1] != 'u' {
			i++ // skip the escaped character
			continue
		}
		v, ok := hex4(b[i+2 : i+6])
		if !ok {
			continue
		}
		switch {
		case v >= 0xD800 && v < 0xDC00:
			if i+11 < len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
				if w, ok := hex4(b[i+8 : i+12]); ok && w >= 0xDC00 && w < 0xE000 {
					i += 11
					continue
				}
			}
			return true
		case v >= 0xDC00 && v < 0xE000:
			return true
		}
		i += 5
	}
	return false
}

func hex4(b []byte) (rune, bool) {
	var v rune
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			v = v<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return v, true
}

// Validate checks the fields its op needs.
func (r *Request) Validate(lim Limits) *Error {
	needConv := func() *Error { return CheckID("conversation_id", r.ConversationID, lim) }
	// client_message_id is the idempotency key of every write: required
	// for send, optional for the membership ops.
	switch r.Op {
	case OpCreate, OpJoin, OpKick, OpLeave:
		if r.ClientMessageID != "" {
			if e := CheckID("client_message_id", r.ClientMessageID, lim); e != nil {
				return e
			}
		}
	}
	switch r.Op {
	case OpCreate:
		if e := needConv(); e != nil {
			return e
		}
		if len(r.Members)+1 > lim.MaxMembers {
			return Errorf(CodeTooLarge, "more than %d members", lim.MaxMembers)
		}
		for _, m := range r.Members {
			if e := CheckID("members[]", m, lim); e != nil {
				return e
			}
		}
	case OpJoin, OpKick:
		if e := needConv(); e != nil {
			return e
		}
		return CheckID("user_id", r.UserID, lim)
	case OpLeave:
		return needConv()
	case OpSend:
		if e := needConv(); e != nil {
			return e
		}
		if e := CheckID("client_message_id", r.ClientMessageID, lim); e != nil {
			return e
		}
		if r.Body == "" {
			return Errorf(CodeBadRequest, "missing body")
		}
		if len(r.Body) > lim.MaxBodyBytes {
			return Errorf(CodeTooLarge, "body longer than %d bytes", lim.MaxBodyBytes)
		}
		if e := CheckText("body", r.Body); e != nil {
			return e
		}
	case OpSync:
		// Of several bad cursors, the smallest key is named, so that a
		// frame always gets the same answer whatever the map's order.
		var bad *Error
		badKey := ""
		for c, s := range r.Cursors {
			e := CheckID("cursors key", c, lim)
			if e == nil && s < 0 {
				e = Errorf(CodeBadRequest, "cursor of %s is negative", c)
			}
			if e != nil && (bad == nil || c < badKey) {
				bad, badKey = e, c
			}
		}
		if bad != nil {
			return bad
		}
	case OpRead:
		if e := needConv(); e != nil {
			return e
		}
		if r.Seq < 1 {
			return Errorf(CodeBadRequest, "read needs a seq of at least 1")
		}
	case OpRefresh:
		if r.Token == "" {
			return Errorf(CodeBadRequest, "missing token")
		}
	case OpConversations:
		if r.Limit < 0 {
			return Errorf(CodeBadRequest, "limit must not be negative")
		}
	case OpHistory:
		if e := needConv(); e != nil {
			return e
		}
		if r.BeforeSeq < 0 || r.Limit < 0 {
			return Errorf(CodeBadRequest, "before_seq and limit must not be negative")
		}
	case "":
		return Errorf(CodeBadRequest, "missing op")
	default:
		return Errorf(CodeBadRequest, "unknown op %q", r.Op)
	}
	return nil
}

// CheckText validates free text (a message body) against what every sink
// stores: valid UTF-8 (no lone surrogate survives decoding as anything but
// U+FFFD, which Decode refuses before this) and no NUL character, which
// Postgres text and jsonb cannot hold. A frame that passes is stored as it
// was sent, byte for byte, in the log, in Postgres and in every event frame.
func CheckText(field, v string) *Error {
	if !utf8.ValidString(v) {
		return Errorf(CodeBadRequest, "%s is not valid UTF-8", field)
	}
	if strings.IndexByte(v, 0) >= 0 {
		return Errorf(CodeBadRequest, "%s contains a NUL character (U+0000), which cannot be stored", field)
	}
	return nil
}

// CheckID validates an id: 1..MaxIDBytes bytes of [A-Za-z0-9._:-].
func CheckID(field, v string, lim Limits) *Error {
	if v == "" {
		return Errorf(CodeBadRequest, "missing %s", field)
	}
	if len(v) > lim.MaxIDBytes {
		return Errorf(CodeTooLarge, "%s longer than %d bytes", field, lim.MaxIDBytes)
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-'
		if !ok {
			return Errorf(CodeBadRequest, "%s has a character outside [A-Za-z0-9._:-]", field)
		}
	}
	return nil
}

// Reply is a server frame answering a request: accepted or rejected.
type Reply struct {
	Op              string `json:"op"`
	ID              string `json:"id,omitempty"`
	ConversationID  string `json:"conversation_id,omitempty"`
	Seq             int64  `json:"seq,omitempty"`
	MessageID       string `json:"message_id,omitempty"`
	ClientMessageID string `json:"client_message_id,omitempty"`
	Code            Code   `json:"code,omitempty"`
	Message         string `json:"message,omitempty"`
	RetryAfterMS    int64  `json:"retry_after_ms,omitempty"`
	// ExpiresAt is set in the answer to refresh: the new token's exp
	// (FormatTime).
	ExpiresAt string `json:"expires_at,omitempty"`
}

// Event is an event as clients see it: pushed as an `event` frame (Op set)
// and listed in `history` pages (Op empty).
type Event struct {
	Op              string   `json:"op,omitempty"`
	ConversationID  string   `json:"conversation_id"`
	Seq             int64    `json:"seq"`
	Kind            string   `json:"kind"`
	MessageID       string   `json:"message_id"`
	ClientMessageID string   `json:"client_message_id,omitempty"`
	Sender          string   `json:"sender"`
	Body            string   `json:"body,omitempty"`
	UserID          string   `json:"user_id,omitempty"`
	Members         []string `json:"members,omitempty"`
	CreatedAt       string   `json:"created_at"`
}

// TimeFormat is created_at's format: RFC 3339 in UTC with up to microsecond
// precision.
const TimeFormat = "2006-01-02T15:04:05.999999Z07:00"

// FormatTime formats t as created_at.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeFormat) }

// Synced ends a sync: every conversation of the user with the last seq the
// sync covered. More is set when the reply was capped: sync again with
// these cursors.
type Synced struct {
	Op      string           `json:"op"`
	ID      string           `json:"id"`
	Cursors map[string]int64 `json:"cursors"`
	More    bool             `json:"more,omitempty"`
	// Read holds the user's read markers of the conversations in Cursors
	// that have one.
	Read map[string]int64 `json:"read,omitempty"`
}

// HistoryPage answers history: events in ascending seq.
type HistoryPage struct {
	Op             string   `json:"op"`
	ID             string   `json:"id"`
	ConversationID string   `json:"conversation_id"`
	Events         []*Event `json:"events"`
}

// ConversationInfo is one entry of a conversations reply.
type ConversationInfo struct {
	ConversationID string `json:"conversation_id"`
	LastSeq        int64  `json:"last_seq"`
	LastActivityAt string `json:"last_activity_at"`
	// ReadSeq is the caller's read marker (0: none yet).
	ReadSeq int64 `json:"read_seq"`
	// Unread counts the messages of other senders after the marker, within
	// the caller's current membership, up to LastSeq.
	Unread int64 `json:"unread"`
}

// ReadMarker is pushed to a user's devices when their read marker of a
// conversation moves forward (op read, no id). Keep the highest per
// conversation: it may repeat or arrive out of order.
type ReadMarker struct {
	Op             string `json:"op"`
	ConversationID string `json:"conversation_id"`
	Seq            int64  `json:"seq"`
}

// ConversationList answers conversations: the caller's current
// conversations, most recently active first.
type ConversationList struct {
	Op            string              `json:"op"`
	ID            string              `json:"id"`
	Conversations []*ConversationInfo `json:"conversations"`
}

// Rejected builds a rejected reply for request id.
func Rejected(id string, e *Error) *Reply {
	return &Reply{Op: OpRejected, ID: id, Code: e.Code, Message: e.Message, RetryAfterMS: e.RetryAfterMS}
}
