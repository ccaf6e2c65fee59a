// Package logrecord defines the committed log's record format (spec/log-record.md):
// the JSON value, the headers, the key, and how a conversation maps to a
// virtual shard and a Kafka partition. It is pure: no I/O.
package logrecord

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"
)

// Version is the schema version written in every record's "v" field.
const Version = 1

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

// Marshal encodes the record value.
func (e *Event) Marshal() ([]byte, error) {
	e.V = Version
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("logrecord: encode %s event: %w", e.Kind, err)
	}
	return b, nil
}

// Unmarshal decodes a record value and checks its version and kind.
func Unmarshal(b []byte) (*Event, error) {
	var e Event
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("logrecord: decode: %w", err)
	}
	if e.V != Version {
		return nil, fmt.Errorf("logrecord: unsupported schema version %d", e.V)
	}
	switch e.Kind {
	case KindCreate, KindJoin, KindKick, KindLeave, KindMessage:
		if e.ConversationID == "" || e.Seq <= 0 {
			return nil, fmt.Errorf("logrecord: %s event without conversation_id or seq", e.Kind)
		}
	case KindTakeover:
	default:
		return nil, fmt.Errorf("logrecord: unknown kind %q", e.Kind)
	}
	return &e, nil
}

// VShard maps a conversation to its virtual shard: fnv1a64(conversation_id) mod v.
func VShard(conversationID string, v int) int {
	h := fnv.New64a()
	h.Write([]byte(conversationID))
	return int(h.Sum64() % uint64(v))
}

// Partition maps a virtual shard to its Kafka partition: vshard mod p.
func Partition(vshard, p int) int32 {
	return int32(vshard % p)
}

// TransactionalID is the Kafka transactional.id of a virtual shard's writer.
func TransactionalID(vshard int) string {
	return "chatpipe-vshard-" + strconv.Itoa(vshard)
}
