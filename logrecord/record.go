// Package logrecord defines the committed log's record format (docs/log-record.md):
// the JSON value, the headers, the key, and how a conversation maps to a
// virtual shard and a Kafka partition. It is pure: no I/O.
package logrecord

import (
	"encoding/json"
	"errors"
	"fmt"
	jsonv2 "github.com/go-json-experiment/json"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/chatpipe/chatpipe/internal/jsonenc"
)

// Version is the newest schema version this build reads and writes. A
// record carries the lowest version that can read it (VersionOf): version
// 2 added the moved kind, version 3 the read kind and version 4 a moved
// record's verdicts, so only moved records say 2 (4 when they carry
// verdicts) and read records 3, and an older consumer reads every other
// record and stops at the first it cannot.
const Version = 4

// VersionOf is the schema version a record of kind is written with (a
// moved record with verdicts: 4, see Event.Version).
func VersionOf(kind string) int {
	switch kind {
	case KindMoved:
		return 2
	case KindRead:
		return 3
	}
	return 1
}

// DefaultTopic is the committed log's topic name.
const DefaultTopic = "chatpipe.log"

// Kinds of records.
const (
	KindCreate   = "create"
	KindJoin     = "join"
	KindKick     = "kick"
	KindLeave    = "leave"
	KindMessage  = "message"
	KindTakeover = "takeover"
	// KindMoved ends a conversation's stay in a vshard: it takes the
	// conversation's next seq, and the events after it are written by
	// vshard to_vshard (version 2).
	KindMoved = "moved"
	// KindRead records a read marker: user_id has read the conversation up
	// to read_seq (version 3). It takes no seq of the conversation: a
	// marker is not an event of the conversation, and the highest one
	// recorded stands.
	KindRead = "read"
)

// Header names carried by every record.
const (
	HeaderVShard = "vshard"
	HeaderEpoch  = "epoch"
	HeaderKind   = "kind"
)

// Event is one record value of the committed log.
type Event struct {
	V               int       `json:"v"`
	Kind            string    `json:"kind"`
	ConversationID  string    `json:"conversation_id,omitempty"`
	Seq             int64     `json:"seq,omitempty"`
	MessageID       string    `json:"message_id,omitempty"`
	ClientMessageID string    `json:"client_message_id,omitempty"`
	Sender          string    `json:"sender,omitempty"`
	Body            string    `json:"body,omitempty"`
	Members         []string  `json:"members,omitempty"`
	UserID          string    `json:"user_id,omitempty"`
	CreatedAt       time.Time `json:"created_at"`
	VShard          int       `json:"vshard"`
	Epoch           int64     `json:"epoch"`
	Worker          string    `json:"worker,omitempty"`
	// ToVShard is where a moved conversation's next events are written.
	ToVShard *int `json:"to_vshard,omitempty"`
	// ReadSeq is a read record's marker.
	ReadSeq int64 `json:"read_seq,omitempty"`
	// Verdicts (moved, version 4) are the answers the writer gave keyed
	// commands of the conversation without writing anything that it
	// still remembered: the writer the conversation moves to gives
	// another attempt of such a key the same answer (docs/protocol.md,
	// "Attempts in flight").
	Verdicts []Verdict `json:"verdicts,omitempty"`
}

// Verdict is one remembered answer a moved record carries: to sender's op
// with client_message_id, at At, a rejection (Code and Message), or, with
// no Code, an acceptance that wrote nothing at Seq (a join of a member).
type Verdict struct {
	ClientMessageID string    `json:"client_message_id"`
	Sender          string    `json:"sender"`
	Op              string    `json:"op"`
	Code            string    `json:"code,omitempty"`
	Message         string    `json:"message,omitempty"`
	Seq             int64     `json:"seq,omitempty"`
	At              time.Time `json:"at"`
}

// Version is the schema version e is written with: VersionOf its kind, or
// 4 for a moved record that carries verdicts.
func (e *Event) Version() int {
	if e.Kind == KindMoved && len(e.Verdicts) > 0 {
		return 4
	}
	return VersionOf(e.Kind)
}

// HasSeq reports whether the record is an event of its conversation, with
// a seq of its own: every kind but the takeover marker and the read marker.
func (e *Event) HasSeq() bool {
	return e.Kind != KindTakeover && e.Kind != KindRead
}

// Key is the record key: the conversation id, or vshard/<n> for a takeover marker.
func (e *Event) Key() string {
	if e.Kind == KindTakeover {
		return "vshard/" + strconv.Itoa(e.VShard)
	}
	return e.ConversationID
}

// Headers returns the record headers as key/value pairs in a fixed order.
func (e *Event) Headers() [][2]string {
	return [][2]string{
		{HeaderVShard, strconv.Itoa(e.VShard)},
		{HeaderEpoch, strconv.FormatInt(e.Epoch, 10)},
		{HeaderKind, e.Kind},
	}
}

// Marshal encodes the record value. The writer encodes every record it
// commits, so it is written by hand, not by reflection (a twentieth of a
// worker's CPU): the bytes are json.Marshal's (TestAppendJSONMatchesMarshal,
// FuzzAppendJSON), and so are the refusals (a created_at that RFC 3339
// cannot hold).
func (e *Event) Marshal() ([]byte, error) {
	e.V = e.Version()
	b := make([]byte, 0, 256+len(e.Body))
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(e.V), 10)
	b = append(b, `,"kind":`...)
	b = jsonenc.String(b, e.Kind)
	b = jsonenc.StringField(b, `,"conversation_id":`, e.ConversationID)
	b = jsonenc.IntField(b, `,"seq":`, e.Seq)
	b = jsonenc.StringField(b, `,"message_id":`, e.MessageID)
	b = jsonenc.StringField(b, `,"client_message_id":`, e.ClientMessageID)
	b = jsonenc.StringField(b, `,"sender":`, e.Sender)
	b = jsonenc.StringField(b, `,"body":`, e.Body)
	if len(e.Members) > 0 {
		b = jsonenc.Strings(append(b, `,"members":`...), e.Members)
	}
	b = jsonenc.StringField(b, `,"user_id":`, e.UserID)
	b = append(b, `,"created_at":"`...)
	// (time.Time's MarshalJSON is AppendText's bytes in quotes, with the
	// same checks: a 4-digit year, a zone within a day)
	b, err := e.CreatedAt.AppendText(b)
	if err != nil {
		return nil, fmt.Errorf("logrecord: encode %s event: %w", e.Kind, err)
	}
	b = append(b, `","vshard":`...)
	b = strconv.AppendInt(b, int64(e.VShard), 10)
	b = append(b, `,"epoch":`...)
	b = strconv.AppendInt(b, e.Epoch, 10)
	b = jsonenc.StringField(b, `,"worker":`, e.Worker)
	if e.ToVShard != nil {
		b = strconv.AppendInt(append(b, `,"to_vshard":`...), int64(*e.ToVShard), 10)
	}
	b = jsonenc.IntField(b, `,"read_seq":`, e.ReadSeq)
	if len(e.Verdicts) > 0 {
		// Only moved records carry them, a few at most: by reflection.
		v, err := json.Marshal(e.Verdicts)
		if err != nil {
			return nil, fmt.Errorf("logrecord: encode a moved record's verdicts: %w", err)
		}
		b = append(append(b, `,"verdicts":`...), v...)
	}
	return append(b, '}'), nil
}

// ErrUnsupportedVersion marks a record whose schema version is newer than
// this build understands (a newer writer, e.g. during a rolling upgrade).
// Such a record is not bad: a consumer must stop until it is upgraded, and
// must never skip it.
var ErrUnsupportedVersion = errors.New("logrecord: unsupported (newer) schema version")

// ErrMalformed marks a record that no version of this build can read: not
// JSON, no or an impossible version, an unknown kind of this version, or an
// event without its conversation_id or seq. It will never decode.
var ErrMalformed = errors.New("logrecord: malformed record")

// Unmarshal decodes a record value and checks its version and kind. Its
// errors wrap ErrUnsupportedVersion or ErrMalformed.
//
// The version is read first, on its own: a newer version may change the
// type of any other field, and must be reported as newer, not as malformed.
func Unmarshal(b []byte) (*Event, error) {
	// Fast path, one parse: a strict decoder (exact field names, no unknown
	// or repeated member, valid UTF-8) reads what this build writes.
	// Anything it refuses — another version, a field this build does not
	// know — is read by unmarshalLenient, which answers the same for every
	// record the fast path reads (TestUnmarshalFastPathAgrees).
	var e Event
	if len(b) > 0 && b[0] == '{' && jsonv2.Unmarshal(b, &e, jsonv2.RejectUnknownMembers(true)) == nil && e.V >= 1 && e.V <= Version {
		if err := e.check(); err != nil {
			return nil, err
		}
		return &e, nil
	}
	return unmarshalLenient(b)
}

// unmarshalLenient is Unmarshal for any record value: the version first,
// then the event as encoding/json reads it.
func unmarshalLenient(b []byte) (*Event, error) {
	var v struct {
		V *int `json:"v"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("%w: decode: %w", ErrMalformed, err)
	}
	switch {
	case v.V == nil:
		return nil, fmt.Errorf("%w: no schema version", ErrMalformed)
	case *v.V > Version:
		return nil, fmt.Errorf("%w: %d (this build reads up to %d)", ErrUnsupportedVersion, *v.V, Version)
	case *v.V < 1:
		return nil, fmt.Errorf("%w: schema version %d", ErrMalformed, *v.V)
	}
	var e Event
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("%w: decode: %w", ErrMalformed, err)
	}
	if err := e.check(); err != nil {
		return nil, err
	}
	return &e, nil
}

// check is what a decoded event of this version must hold.
func (e *Event) check() error {
	switch e.Kind {
	case KindCreate, KindJoin, KindKick, KindLeave, KindMessage:
		if e.ConversationID == "" || e.Seq <= 0 {
			return fmt.Errorf("%w: %s event without conversation_id or seq", ErrMalformed, e.Kind)
		}
	case KindMoved:
		if e.V < 2 || e.ConversationID == "" || e.Seq <= 0 || e.ToVShard == nil || *e.ToVShard < 0 {
			return fmt.Errorf("%w: moved event without version 2, conversation_id, seq or to_vshard", ErrMalformed)
		}
		if len(e.Verdicts) > 0 && e.V < 4 {
			return fmt.Errorf("%w: moved event with verdicts in version %d", ErrMalformed, e.V)
		}
	case KindRead:
		if e.V < 3 || e.ConversationID == "" || e.Seq != 0 || e.UserID == "" || e.ReadSeq <= 0 {
			return fmt.Errorf("%w: read record without version 3, conversation_id, user_id or read_seq, or with a seq", ErrMalformed)
		}
	case KindTakeover:
	default:
		// A new kind comes with a new version; in this one it is a bug.
		return fmt.Errorf("%w: unknown kind %q in version %d", ErrMalformed, e.Kind, e.V)
	}
	return nil
}

// VShard maps a conversation to its virtual shard: fnv1a64(conversation_id) mod v.
func VShard(conversationID string, v int) int {
	h := fnv.New64a()
	h.Write([]byte(conversationID))
	return int(h.Sum64() % uint64(v))
}

// Partition maps a hashed virtual shard to its Kafka partition: vshard
// mod p. Layout.Partition maps dedicated vshards too.
func Partition(vshard, p int) int32 {
	return int32(vshard % p)
}

// Layout is a deployment's fixed shape: VShards hashed vshards
// (0…VShards-1) over Partitions partitions, and Dedicated vshards beyond
// them (VShards…VShards+Dedicated-1), each with a partition of its own
// after the hashed ones. A conversation is routed to a dedicated vshard
// only by an override in the owner table; the log says where it is (its
// last moved record).
type Layout struct {
	VShards, Partitions, Dedicated int
}

// Partition is vshard v's partition: v mod Partitions for a hashed
// vshard, Partitions + (v - VShards) for a dedicated one.
func (l Layout) Partition(v int) int32 {
	if v >= l.VShards {
		return int32(l.Partitions + v - l.VShards)
	}
	return int32(v % l.Partitions)
}

// TopicPartitions is how many partitions the log's topic has.
func (l Layout) TopicPartitions() int { return l.Partitions + l.Dedicated }

// AllVShards is how many vshards have an owner row.
func (l Layout) AllVShards() int { return l.VShards + l.Dedicated }

// MayHold reports whether vshard v may be where conversation cid is
// written: its hashed vshard, or any dedicated one. Only these writers
// need to hear of cid's override.
func (l Layout) MayHold(v int, cid string) bool {
	return l.IsDedicated(v) || v == VShard(cid, l.VShards)
}

// IsDedicated reports whether v is a dedicated vshard.
func (l Layout) IsDedicated(v int) bool { return v >= l.VShards && v < l.VShards+l.Dedicated }

// TransactionalID is the Kafka transactional.id of a virtual shard's writer.
func TransactionalID(vshard int) string {
	return "chatpipe-vshard-" + strconv.Itoa(vshard)
}
