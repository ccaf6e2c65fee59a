package delivery

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/chatpipe/chatpipe/internal/pgtest"
)

// sink is a gateway with a fixed number of devices for each user.
type sink struct {
	devices map[string]int
	got     map[string][]Push
}

func (s *sink) Local(user string) bool { return s.devices[user] > 0 }
func (s *sink) Any() bool {
	for _, n := range s.devices {
		if n > 0 {
			return true
		}
	}
	return false
}
func (s *sink) Lost(string) {}
func (s *sink) Deliver(user string, pushes []Push) int {
	s.got[user] = append(s.got[user], pushes...)
	return s.devices[user]
}

// The feed counts one frame per device it was queued to: a read marker
// for a user with two devices here is two frames, and one for a user with
// no device here none. (A batch of read markers only needs no Postgres.)
func TestFeedCountsFramesPerDevice(t *testing.T) {
	s := &sink{devices: map[string]int{"u1": 2, "u2": 1}, got: map[string][]Push{}}
	f := NewFeed(nil, s, nil)
	batch := []outboxRow{
		{id: 1, readUsers: []string{"u1", "u2", "u3"}, readConvs: []string{"c1", "c1", "c1"}, readSeqs: []int64{4, 5, 6}},
		{id: 2, readUsers: []string{"u1"}, readConvs: []string{"c2"}, readSeqs: []int64{7}},
	}
	if err := f.deliver(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	if got := f.markers.Load(); got != 2*2+1 {
		t.Errorf("read marker frames counted %d, want 5 (u1's two markers to two devices, u2's one to one)", got)
	}
	if got := f.delivered.Load(); got != 0 {
		t.Errorf("event frames counted %d, want 0", got)
	}
	if len(s.got["u1"]) != 2 || len(s.got["u2"]) != 1 || len(s.got["u3"]) != 0 {
		t.Errorf("pushes delivered: %v", s.got)
	}
	for _, p := range s.got["u1"] {
		if !p.Read || len(p.Frame) == 0 {
			t.Errorf("u1 got %+v, want a read marker frame", p)
		}
	}
}

// A gateway with no device connected follows the outbox without asking
// Postgres for the memberships or events of its rows: nobody here could
// be delivered them. (The feed has no database here: a read would fail.)
func TestFeedWithNoDevicesReadsNoEvents(t *testing.T) {
	s := &sink{devices: map[string]int{}, got: map[string][]Push{}}
	f := NewFeed(nil, s, nil)
	batch := []outboxRow{
		{id: 1, convs: []string{"c1", "c2"}, from: []int64{1, 4}, to: []int64{3, 4}},
		{id: 2, convs: []string{"c1"}, from: []int64{4}, to: []int64{4}, readUsers: []string{"u1"}, readConvs: []string{"c1"}, readSeqs: []int64{4}},
	}
	if err := f.deliver(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	if f.delivered.Load() != 0 || f.markers.Load() != 0 || len(s.got) != 0 {
		t.Errorf("delivered %d events and %d markers (%v) with no device here", f.delivered.Load(), f.markers.Load(), s.got)
	}
}

// TestFeedReadsEventsByRange: the feed reads the events of up to 200
// outbox rows at once, hundreds of ranges. Its read must look each range
// up in events' primary key, not scan the table: a scan costs the whole
// table on every read, however few events the ranges hold.
func TestFeedReadsEventsByRange(t *testing.T) {
	ctx := context.Background()
	db := pgtest.DB(t, pgtest.Options{})
	// 600 conversations of 150 events each, as a stack holds after a
	// minute of load, and statistics, as autovacuum gathers them.
	if _, err := db.Exec(ctx, `INSERT INTO events (conversation_id, seq, kind, message_id, sender, body, created_at, vshard, epoch, log_partition, log_offset)
		SELECT 'c' || c, s, 'message', 'c' || c || '-' || s, 'u', repeat('x', 100), now(), 0, 1, 0, 0
		FROM generate_series(1, 600) c, generate_series(1, 150) s`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `ANALYZE events`); err != nil {
		t.Fatal(err)
	}
	var convs []string
	var from, to []int64
	for c := 1; c <= 600; c++ { // the newest 9 events of each
		convs, from, to = append(convs, fmt.Sprintf("c%d", c)), append(from, 142), append(to, 150)
	}
	rows, err := db.Query(ctx, `EXPLAIN `+feedEventsSQL, convs, from, to)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	var line string
	if _, err := pgx.ForEachRow(rows, []any{&line}, func() error { plan = append(plan, line); return nil }); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if strings.Contains(text, "Seq Scan on events") || !strings.Contains(text, "events_pkey") {
		t.Fatalf("the feed's read of 600 ranges does not look them up in events_pkey:\n%s", text)
	}
}
