// Package delivery is the read side of chatpipe: it pushes persisted events
// to the devices of the members (Feed) and answers sync and history
// (Store), all from the Postgres read model that persist maintains. Who may see what is decided by membership periods (periods.go,
// pure); the rest is queries.
package delivery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/chatpipe/chatpipe/internal/readmodel"
	"github.com/chatpipe/chatpipe/protocol"
)

// ErrForbidden: the user never was a member of the conversation (or the
// conversation does not exist; the two are not told apart).
var ErrForbidden = errors.New("not a member of this conversation")

// Store answers sync and history.
type Store struct {
	DB *pgxpool.Pool
}

// eventColumns are the columns scanEvent reads, in order.
const eventColumns = `e.conversation_id, e.seq, e.kind, e.message_id, coalesce(e.client_message_id, ''), e.sender,
	coalesce(e.body, ''), coalesce(e.user_id, ''), e.members, e.created_at`

// rangeEvents selects the events of ranges passed as three arrays.
const rangeEvents = `SELECT ` + eventColumns + `
FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS r(c, f, t)
JOIN events e ON e.conversation_id = r.c AND e.seq BETWEEN r.f AND r.t`

// feedEventsSQL reads the events of the ranges passed as three arrays, in
// order of conversation and seq, with one lookup in events' primary key per
// range. The feed asks for the ranges of up to 200 outbox rows at once;
// joined as rangeEvents joins them, hundreds of ranges had the planner hash
// them and scan the whole events table (in parallel workers) on every read,
// a cost that grows with the table, not with the events read. OFFSET 0
// keeps the lateral subquery from being flattened into that join. Sync and
// History keep rangeEvents: their LIMIT can stop its scans early.
const feedEventsSQL = `SELECT ` + eventColumns + `
FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS r(c, f, t)
CROSS JOIN LATERAL (
  SELECT * FROM events WHERE conversation_id = r.c AND seq BETWEEN r.f AND r.t OFFSET 0) e
ORDER BY e.conversation_id, e.seq`

// scanEvents reads eventColumns rows; created holds each event's
// created_at as a time (for latency), in the same order.
func scanEvents(rows pgx.Rows, op string) (out []*protocol.Event, created []time.Time, err error) {
	for rows.Next() {
		e := &protocol.Event{Op: op}
		var at time.Time
		if err := rows.Scan(&e.ConversationID, &e.Seq, &e.Kind, &e.MessageID, &e.ClientMessageID, &e.Sender,
			&e.Body, &e.UserID, &e.Members, &at); err != nil {
			rows.Close()
			return nil, nil, err
		}
		e.CreatedAt = protocol.FormatTime(at)
		out, created = append(out, e), append(created, at)
	}
	return out, created, rows.Err()
}

func rangeArgs(rs []readmodel.Range) (convs []string, from, to []int64) {
	for _, r := range rs {
		convs, from, to = append(convs, r.Conv), append(from, r.From), append(to, r.To)
	}
	return convs, from, to
}

// SyncResult is a sync's answer.
type SyncResult struct {
	Events  []*protocol.Event // ordered by conversation (byte order), then seq
	Cursors map[string]int64  // every conversation of the user: last seq covered
	More    bool              // capped at limit events: sync again with Cursors
	Read    map[string]int64  // the user's read markers of the conversations in Cursors (nil: none)
}

// Sync returns the events of all the user's conversations after each
// cursor (0 if absent), within the user's membership periods and no
// further than the read model has been applied, at most limit of them.
func (s *Store) Sync(ctx context.Context, user string, cursors map[string]int64, limit int) (*SyncResult, error) {
	return s.sync(ctx, user, cursors, nil, limit)
}

// Since is Sync for the conversations in cursors only: the gateway reads
// back with it the events a device's full send buffer did not take. The
// result's Cursors and Read name only those conversations (of them, the
// ones the user was ever a member of).
func (s *Store) Since(ctx context.Context, user string, cursors map[string]int64, limit int) (*SyncResult, error) {
	only := make([]string, 0, len(cursors))
	for c := range cursors {
		only = append(only, c)
	}
	return s.sync(ctx, user, cursors, only, limit)
}

// sync is Sync, or Since when only is not nil.
func (s *Store) sync(ctx context.Context, user string, cursors map[string]int64, only []string, limit int) (*SyncResult, error) {
	res := &SyncResult{Cursors: map[string]int64{}}
	err := pgx.BeginTxFunc(ctx, s.DB, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT m.conversation_id, m.joined_seq, m.left_seq, c.last_seq
			FROM memberships m JOIN conversations c USING (conversation_id)
			WHERE m.user_id = $1 AND ($2::text[] IS NULL OR m.conversation_id = ANY($2))`, user, only)
		if err != nil {
			return err
		}
		var ranges []readmodel.Range
		var conv string
		var joined, last int64
		var left *int64
		_, err = pgx.ForEachRow(rows, []any{&conv, &joined, &left, &last}, func() error {
			p := readmodel.NewPeriod(conv, user, joined, left)
			cur := cursors[conv]
			end := min(p.To, last)
			res.Cursors[conv] = max(res.Cursors[conv], cur, end)
			if r, ok := readmodel.Visible(p, cur, last); ok {
				ranges = append(ranges, r)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if err := s.readMarkers(ctx, tx, user, res); err != nil || len(ranges) == 0 {
			return err
		}
		sort.Slice(ranges, func(i, j int) bool {
			if ranges[i].Conv != ranges[j].Conv {
				return ranges[i].Conv < ranges[j].Conv
			}
			return ranges[i].From < ranges[j].From
		})
		// COLLATE "C" is byte order, the order of Go's string comparison
		// used above and below: under the database's own collation (e.g.
		// en_US, where "a1" < "B1") the page could stop inside a
		// conversation Go thinks comes after others, and their cursors would
		// move past events never returned. The rows come from lookups per
		// range and are sorted anyway, so no index order is lost.
		c, f, t := rangeArgs(ranges)
		rows, err = tx.Query(ctx, rangeEvents+` ORDER BY e.conversation_id COLLATE "C", e.seq LIMIT $4`, c, f, t, limit+1)
		if err != nil {
			return err
		}
		res.Events, _, err = scanEvents(rows, protocol.OpEvent)
		if err != nil || len(res.Events) <= limit {
			return err
		}
		// Capped: the conversation where the page stopped ends at its last
		// event sent; those after it keep the client's cursor.
		res.More = true
		res.Events = res.Events[:limit]
		stop := res.Events[limit-1]
		res.Cursors[stop.ConversationID] = stop.Seq
		for _, r := range ranges {
			if r.Conv > stop.ConversationID {
				res.Cursors[r.Conv] = cursors[r.Conv]
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("delivery: sync for %s: %w", user, err)
	}
	return res, nil
}

// History returns up to limit events of conv before beforeSeq (0: the
// newest), in ascending seq, only those within the user's membership
// periods. ErrForbidden if the user never was a member.
func (s *Store) History(ctx context.Context, user, conv string, beforeSeq int64, limit int) ([]*protocol.Event, error) {
	var out []*protocol.Event
	err := pgx.BeginTxFunc(ctx, s.DB, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT m.joined_seq, m.left_seq, c.last_seq
			FROM memberships m JOIN conversations c USING (conversation_id) WHERE m.user_id = $1 AND m.conversation_id = $2`, user, conv)
		if err != nil {
			return err
		}
		var ranges []readmodel.Range
		var joined, last int64
		var left *int64
		member := false
		_, err = pgx.ForEachRow(rows, []any{&joined, &left, &last}, func() error {
			member = true
			upper := last
			if beforeSeq > 0 {
				upper = min(upper, beforeSeq-1)
			}
			if r, ok := readmodel.Visible(readmodel.NewPeriod(conv, user, joined, left), 0, upper); ok {
				ranges = append(ranges, r)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if !member {
			return ErrForbidden
		}
		if len(ranges) == 0 {
			return nil
		}
		c, f, t := rangeArgs(ranges)
		rows, err = tx.Query(ctx, rangeEvents+` ORDER BY e.seq DESC LIMIT $4`, c, f, t, limit)
		if err != nil {
			return err
		}
		out, _, err = scanEvents(rows, "")
		return err
	})
	if errors.Is(err, ErrForbidden) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("delivery: history of %s for %s: %w", conv, user, err)
	}
	slices.Reverse(out)
	if out == nil {
		out = []*protocol.Event{}
	}
	return out, nil
}

// readMarkers fills res.Read with the user's markers of the conversations
// in res.Cursors.
func (s *Store) readMarkers(ctx context.Context, tx pgx.Tx, user string, res *SyncResult) error {
	if len(res.Cursors) == 0 {
		return nil
	}
	convs := make([]string, 0, len(res.Cursors))
	for c := range res.Cursors {
		convs = append(convs, c)
	}
	rows, err := tx.Query(ctx, `SELECT conversation_id, read_seq FROM read_markers
		WHERE user_id = $1 AND conversation_id = ANY($2)`, user, convs)
	if err != nil {
		return err
	}
	var c string
	var seq int64
	_, err = pgx.ForEachRow(rows, []any{&c, &seq}, func() error {
		if res.Read == nil {
			res.Read = map[string]int64{}
		}
		res.Read[c] = seq
		return nil
	})
	return err
}

// MaxUnread caps the unread count of one conversation in Conversations: a
// larger count is reported as MaxUnread, so that listing costs at most
// that many index entries per conversation.
const MaxUnread = 10000

// Conversations lists the conversations user is a member of now, most
// recently active first, at most limit, each with the user's read marker
// and the number of messages from others after it (within the user's
// current membership, up to the projected last seq; at most MaxUnread).
func (s *Store) Conversations(ctx context.Context, user string, limit int) ([]*protocol.ConversationInfo, error) {
	rows, err := s.DB.Query(ctx, `SELECT c.conversation_id, c.last_seq, c.last_activity_at, coalesce(r.read_seq, 0),
		  (SELECT count(*) FROM (SELECT 1 FROM events e
		     WHERE e.conversation_id = c.conversation_id AND e.kind = 'message' AND e.sender <> $1
		       AND e.seq > GREATEST(coalesce(r.read_seq, 0), m.joined_seq) AND e.seq <= c.last_seq
		     LIMIT $3) u)
		FROM memberships m JOIN conversations c USING (conversation_id)
		LEFT JOIN read_markers r ON r.user_id = $1 AND r.conversation_id = c.conversation_id
		WHERE m.user_id = $1 AND m.left_seq IS NULL
		ORDER BY c.last_activity_at DESC, c.conversation_id LIMIT $2`, user, limit, MaxUnread)
	if err != nil {
		return nil, fmt.Errorf("delivery: conversations of %s: %w", user, err)
	}
	out := []*protocol.ConversationInfo{}
	var c protocol.ConversationInfo
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&c.ConversationID, &c.LastSeq, &at, &c.ReadSeq, &c.Unread}, func() error {
		info := c
		info.LastActivityAt = protocol.FormatTime(at)
		out = append(out, &info)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("delivery: conversations of %s: %w", user, err)
	}
	return out, nil
}

// OpenMemberships counts, for each of users, the conversations other than
// except they are a member of now (as far as the read model has been
// applied). Leaving out the conversation at hand keeps a repeated join of a
// member answerable at the cap.
func (s *Store) OpenMemberships(ctx context.Context, users []string, except string) (map[string]int, error) {
	rows, err := s.DB.Query(ctx, `SELECT user_id, count(*) FROM memberships
		WHERE user_id = ANY($1) AND left_seq IS NULL AND conversation_id <> $2 GROUP BY user_id`, users, except)
	if err != nil {
		return nil, fmt.Errorf("delivery: count memberships: %w", err)
	}
	out := map[string]int{}
	var u string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&u, &n}, func() error { out[u] = n; return nil }); err != nil {
		return nil, fmt.Errorf("delivery: count memberships: %w", err)
	}
	return out, nil
}

// Covered returns, for each of convs the read model knows, the seq up to
// which the read model has been applied. persist writes a conversation's
// last_seq in the transaction that stores its events and applies them, so
// history, sync and conversations answer everything up to that seq.
func (s *Store) Covered(ctx context.Context, convs []string) (map[string]int64, error) {
	rows, err := s.DB.Query(ctx, `SELECT conversation_id, last_seq FROM conversations WHERE conversation_id = ANY($1)`, convs)
	if err != nil {
		return nil, fmt.Errorf("delivery: read model position: %w", err)
	}
	out := make(map[string]int64, len(convs))
	var c string
	var seq int64
	if _, err := pgx.ForEachRow(rows, []any{&c, &seq}, func() error { out[c] = seq; return nil }); err != nil {
		return nil, fmt.Errorf("delivery: read model position: %w", err)
	}
	return out, nil
}
