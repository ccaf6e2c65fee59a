package shardworker

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/chatpipe/chatpipe/internal/logsink"
	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/logrecord"
)

// loadConvsSQL reads, in one statement (one snapshot), every membership
// event of each conversation plus its last event.
const loadConvsSQL = `
SELECT c, e.seq, e.kind, e.sender, coalesce(e.user_id, ''), coalesce(e.members, '{}'), coalesce(e.to_vshard, -1), e.created_at, e.verdicts
FROM unnest($1::text[]) AS c, LATERAL (
  (SELECT seq, kind, sender, user_id, members, to_vshard, created_at, verdicts FROM events WHERE conversation_id = c AND kind <> 'message')
  UNION ALL
  (SELECT seq, kind, sender, user_id, members, to_vshard, created_at, verdicts FROM events WHERE conversation_id = c ORDER BY seq DESC LIMIT 1)
) AS e
ORDER BY 1, 2`

// deadLettersSQL reads the records persist dead-lettered for these
// conversations. They are committed events that events lacks: a writer
// that ignored them would hand their seq out again, forget a kick, or
// give a retried send a second seq.
const deadLettersSQL = `
SELECT conversation_id, seq, coalesce(record_value, ''::bytea) FROM dead_letters
WHERE consumer = $1 AND conversation_id = ANY($2) AND seq IS NOT NULL
ORDER BY conversation_id, seq`

// loadKeysSQL reads the client_message_ids of each conversation, at most
// $2 of them: a conversation with more gets no filter of its keys
// (shardcore.KnowKeys) and has every new key looked up instead. The
// UNIQUE (conversation_id, client_message_id) index answers it.
const loadKeysSQL = `
SELECT c, k.client_message_id
FROM unnest($1::text[]) AS c, LATERAL (
  SELECT client_message_id FROM events
  WHERE conversation_id = c AND client_message_id IS NOT NULL
  LIMIT $2
) AS k`

// keyFilterLoadMax is the most keys a load reads to give a conversation
// its filter of keys. Reading 10,000 costs one load a few milliseconds;
// a conversation with more keeps a lookup per batch that has a new key.
var keyFilterLoadMax = 10000

const lookupDedupeSQL = `
SELECT e.conversation_id, e.client_message_id, e.seq, e.message_id, e.sender, e.kind, e.created_at
FROM unnest($1::text[], $2::text[]) AS k(c, m)
JOIN events e ON e.conversation_id = k.c AND e.client_message_id = k.m`

// fetchState loads the conversations in convs (new states) and looks up the
// client_message_ids in keys, in one round trip.
func fetchState(ctx context.Context, db *pgxpool.Pool, convs []string, keys []shardcore.DedupeKey) (map[string]*shardcore.Conv, map[shardcore.DedupeKey]shardcore.First, error) {
	st, err := queryState(ctx, db, convs, keys)
	if err != nil {
		return nil, nil, err
	}
	loaded := make(map[string]*shardcore.Conv, len(convs))
	for _, c := range convs {
		loaded[c] = st.conv(c)
	}
	return loaded, st.found, nil
}

// stateRow is one event of a loaded conversation.
type stateRow struct {
	e    *logrecord.Event
	full bool // a whole event (dead-lettered), not just its seq
}

// loadedState is what one round trip read: each conversation's events
// (membership events and its last event from events, merged with
// dead-lettered ones) and the keys found. conv builds a state from it, a
// new one on every call, so that loads merged into one round trip never
// share a *Conv.
type loadedState struct {
	rows  map[string][]stateRow // in seq order
	found map[shardcore.DedupeKey]shardcore.First
	// keys are each loaded conversation's stored client_message_ids, when
	// it has at most keyFilterLoadMax of them.
	keys map[string][]string
}

// conv is a new state of conversation cid as the round trip read it.
func (st *loadedState) conv(cid string) *shardcore.Conv {
	c := shardcore.NewConv()
	for _, r := range st.rows[cid] {
		if r.full || r.e.Kind != logrecord.KindMessage {
			shardcore.Apply(c, r.e)
		} else {
			shardcore.ObserveSeq(c, r.e.Seq)
		}
	}
	if keys, ok := st.keys[cid]; ok {
		shardcore.KnowKeys(c, keys)
	}
	return c
}

// queryState reads the events of convs and looks up keys, in one round
// trip. convs and keys must not repeat.
func queryState(ctx context.Context, db *pgxpool.Pool, convs []string, keys []shardcore.DedupeKey) (*loadedState, error) {
	st := &loadedState{rows: map[string][]stateRow{}, found: map[shardcore.DedupeKey]shardcore.First{}, keys: map[string][]string{}}
	isLoaded := make(map[string]bool, len(convs))
	rows, found := st.rows, st.found
	var b pgx.Batch
	if len(convs) > 0 {
		for _, c := range convs {
			isLoaded[c] = true
		}
		b.Queue(loadConvsSQL, convs).Query(func(rs pgx.Rows) error {
			var cid, kind, sender, user string
			var seq int64
			var members []string
			var to int32
			var at time.Time
			var verdicts []byte // a moved event's, as JSON (NULL: none)
			_, err := pgx.ForEachRow(rs, []any{&cid, &seq, &kind, &sender, &user, &members, &to, &at, &verdicts}, func() error {
				e := &logrecord.Event{Kind: kind, ConversationID: cid, Seq: seq, Sender: sender, UserID: user, Members: members, CreatedAt: at}
				if verdicts != nil {
					if err := json.Unmarshal(verdicts, &e.Verdicts); err != nil {
						return fmt.Errorf("shardworker: %s's moved event at seq %d: verdicts: %w", cid, seq, err)
					}
				}
				if to >= 0 {
					t := int(to)
					e.ToVShard = &t
				}
				rows[cid] = append(rows[cid], stateRow{e: e})
				return nil
			})
			return err
		})
		// The keys are read by a statement of their own, after the one
		// above: in its later snapshot they are a superset of what the
		// events read, which a filter may be (it answers "maybe" for more).
		for _, c := range convs {
			st.keys[c] = nil
		}
		b.Queue(loadKeysSQL, convs, keyFilterLoadMax+1).Query(func(rs pgx.Rows) error {
			var cid, key string
			_, err := pgx.ForEachRow(rs, []any{&cid, &key}, func() error {
				st.keys[cid] = append(st.keys[cid], key)
				return nil
			})
			for c, ks := range st.keys {
				if len(ks) > keyFilterLoadMax {
					delete(st.keys, c)
				}
			}
			return err
		})
	}
	if len(keys) > 0 {
		cs, ms := make([]string, len(keys)), make([]string, len(keys))
		for i, k := range keys {
			cs[i], ms[i] = k.Conv, k.CMID
		}
		b.Queue(lookupDedupeSQL, cs, ms).Query(func(rs pgx.Rows) error {
			var k shardcore.DedupeKey
			var f shardcore.First
			_, err := pgx.ForEachRow(rs, []any{&k.Conv, &k.CMID, &f.Seq, &f.MessageID, &f.Sender, &f.Kind, &f.At}, func() error {
				found[k] = f
				return nil
			})
			return err
		})
	}
	if b.Len() == 0 {
		return st, nil
	}
	all := append([]string(nil), convs...)
	wanted := map[shardcore.DedupeKey]bool{}
	for _, k := range keys {
		all = append(all, k.Conv)
		wanted[k] = true
	}
	b.Queue(deadLettersSQL, logsink.PersistConsumer, all).Query(func(rs pgx.Rows) error {
		var cid string
		var seq int64
		var value []byte
		_, err := pgx.ForEachRow(rs, []any{&cid, &seq, &value}, func() error {
			e, err := logrecord.Unmarshal(value)
			if err != nil || e.ConversationID != cid || e.Seq != seq {
				// Only its place is known: the seq stays taken.
				e = &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: cid, Seq: seq}
				if isLoaded[cid] {
					rows[cid] = append(rows[cid], stateRow{e: e})
				}
				return nil
			}
			if isLoaded[cid] {
				rows[cid] = append(rows[cid], stateRow{e: e, full: true})
			}
			if k := (shardcore.DedupeKey{Conv: cid, CMID: e.ClientMessageID}); e.ClientMessageID != "" && wanted[k] {
				if _, ok := found[k]; !ok {
					found[k] = shardcore.First{Seq: e.Seq, MessageID: e.MessageID, Sender: e.Sender, Kind: e.Kind, At: e.CreatedAt}
				}
			}
			return nil
		})
		return err
	})
	if err := db.SendBatch(ctx, &b).Close(); err != nil {
		return nil, fmt.Errorf("shardworker: load state: %w", err)
	}
	for _, rs := range rows {
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].e.Seq < rs[j].e.Seq })
	}
	return st, nil
}
