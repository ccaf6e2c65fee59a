package projection

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/pgtest"
	"github.com/chatpipe/chatpipe/internal/readmodel"
	"github.com/chatpipe/chatpipe/logrecord"
)

// randomMovedLog is a valid log of conversation c, as a writer decides
// it: a create, then messages, joins of non-members and kicks or leaves
// of members, moved at a random seq, whose later events are on the new
// partition.
func randomMovedLog(r *rand.Rand) (old, moved []*logrecord.Event) {
	at := time.Unix(1, 0).UTC()
	users := []string{"u1", "u2", "u3", "u4", "u5"}
	member := map[string]bool{"u1": true}
	create := &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: "c", Seq: 1, MessageID: "m1", Sender: "u1", CreatedAt: at}
	for _, u := range users[1:] {
		if r.IntN(2) == 0 {
			create.Members = append(create.Members, u)
			member[u] = true
		}
	}
	n := 4 + r.IntN(20)
	movedAt := 2 + r.IntN(n-1)
	evs := []*logrecord.Event{create}
	for seq := int64(2); seq <= int64(n); seq++ {
		e := &logrecord.Event{ConversationID: "c", Seq: seq, MessageID: fmt.Sprintf("m%d", seq), Sender: "u1", CreatedAt: at}
		u := users[r.IntN(len(users))]
		switch {
		case seq == int64(movedAt):
			to := 9
			e.Kind, e.ToVShard = logrecord.KindMoved, &to
		case r.IntN(3) == 0:
			e.Kind, e.Body = logrecord.KindMessage, "hi"
		case member[u] && u != "u1":
			e.Kind, e.UserID = logrecord.KindKick, u
			if r.IntN(2) == 0 {
				e.Kind, e.Sender = logrecord.KindLeave, u
			}
			member[u] = false
		case !member[u]:
			e.Kind, e.UserID = logrecord.KindJoin, u
			member[u] = true
		default:
			e.Kind, e.Body = logrecord.KindMessage, "hi"
		}
		evs = append(evs, e)
	}
	return evs[:movedAt], evs[movedAt:]
}

// TestGapFillMatchesLogPeriods: the projection's gap fill (gapSQL) writes
// the membership periods of the stored events in SQL; the rule it keeps is
// readmodel.LogPeriods's. For random moved conversations applied new
// partition first (the case that fills the gap), the read model's periods
// are exactly those LogPeriods folds from the same events.
func TestGapFillMatchesLogPeriods(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, seed))
	db := pgtest.DB(t, pgtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 40 {
		if _, err := db.Exec(ctx, `TRUNCATE events, memberships, conversations, consumer_offsets, delivery_outbox`); err != nil {
			t.Fatal(err)
		}
		old, moved := randomMovedLog(r)
		oldRecs := storeAsPersist(t, ctx, db, 0, old)
		movedRecs := storeAsPersist(t, ctx, db, 1, moved)
		p := newTestProjector(t, db)
		for _, b := range [][]*kgo.Record{movedRecs, oldRecs} {
			if err := p.consumer.Write(ctx, b); err != nil {
				t.Fatal(err)
			}
		}
		var want []string
		for u, ps := range readmodel.LogPeriods(append(append([]*logrecord.Event(nil), old...), moved...))["c"] {
			for _, p := range ps {
				to := "open"
				if p.To != math.MaxInt64 {
					to = fmt.Sprint(p.To)
				}
				want = append(want, fmt.Sprintf("%s:%d-%s", u, p.From, to))
			}
		}
		slices.Sort(want)
		rows, err := db.Query(ctx, `SELECT user_id || ':' || joined_seq || '-' || coalesce(left_seq::text, 'open')
			FROM memberships WHERE conversation_id = 'c'`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			var log []string
			for _, e := range append(append([]*logrecord.Event(nil), old...), moved...) {
				log = append(log, fmt.Sprintf("%d:%s %s%s", e.Seq, e.Kind, e.UserID, fmt.Sprint(e.Members)))
			}
			t.Fatalf("case %d (moved at seq %d): memberships %v, LogPeriods %v; log %v", i, len(old), got, want, log)
		}
	}
}

// TestBatchChecksOnlyWhatMayHaveAHole: a batch queues gapSQL only for the
// conversations whose seqs do not follow, without a hole, what this read
// model's committed batches projected (or seq 0, for one it has not
// seen); a batch that was not committed teaches it nothing.
func TestBatchChecksOnlyWhatMayHaveAHole(t *testing.T) {
	m := New()
	msg := func(conv string, seq int64) *logrecord.Event {
		return &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: conv, Seq: seq, MessageID: fmt.Sprint(conv, seq), Sender: "u1", Body: "hi"}
	}
	checked := func(events []*logrecord.Event, commit bool) string {
		t.Helper()
		var b pgx.Batch
		q := m.Queue(&b, events)
		if commit {
			q.Committed()
		}
		for _, qq := range b.QueuedQueries {
			if qq.SQL == gapSQL {
				return fmt.Sprint(qq.Arguments...)
			}
		}
		return "none"
	}
	create := &logrecord.Event{Kind: logrecord.KindCreate, ConversationID: "a", Seq: 1, MessageID: "a1", Sender: "u1", Members: []string{"u2"}}
	for i, c := range []struct {
		events []*logrecord.Event
		commit bool
		want   string
	}{
		{[]*logrecord.Event{create, msg("a", 2), msg("b", 3)}, true, "[b] [3]"}, // b's first seen seq is 3
		{[]*logrecord.Event{msg("b", 4), msg("a", 3), msg("a", 4)}, true, "none"},
		{[]*logrecord.Event{msg("a", 6)}, false, "[a] [6]"}, // 5 is missing
		{[]*logrecord.Event{msg("a", 5)}, false, "none"},
		{[]*logrecord.Event{msg("a", 6)}, false, "[a] [6]"},                 // 5 was not committed
		{[]*logrecord.Event{msg("a", 4), msg("a", 7)}, true, "[a a] [4 7]"}, // every row of a, 4 too
		{[]*logrecord.Event{msg("a", 8)}, false, "none"},                    // the filled hole is below 7
	} {
		if got := checked(c.events, c.commit); got != c.want {
			t.Errorf("batch %d: gapSQL queued for %s, want %s", i, got, c.want)
		}
	}
}
