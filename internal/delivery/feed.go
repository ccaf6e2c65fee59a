package delivery

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chatpipe/chatpipe/internal/pglisten"
	"github.com/chatpipe/chatpipe/internal/readmodel"
	"github.com/chatpipe/chatpipe/protocol"
)

// Sink is where a Feed delivers: the gateway's connected devices.
type Sink interface {
	// Local reports whether the user has a device connected here.
	Local(user string) bool
	// Any reports whether any device is connected here. While none is,
	// the feed follows the outbox without reading memberships or events:
	// no user of a row it reads is Local.
	Any() bool
	// Deliver queues pushes (frames already encoded, in seq order per
	// conversation) to every connected device of the user, without
	// blocking. One call carries all of a batch's pushes for the user, so
	// a device that takes several frames per message gets them together.
	// It returns how many devices it queued them to.
	Deliver(user string, pushes []Push) int
	// Lost is called when delivery rows were trimmed before this gateway
	// read them: every device here must reconnect and sync.
	Lost(reason string)
}

// Push is one frame for a user's devices: an event, or a read marker the
// user's other device moved forward.
type Push struct {
	Conv  string
	Seq   int64  // the event's seq, or the marker's
	Read  bool   // a read marker
	Frame []byte // the encoded frame
}

// Feed follows the delivery outbox persist writes and pushes each
// batch's events to the local devices of the users who may see them.
//
// A device connected before the feed read a row gets that row's events
// live; a row read before the device connected was committed before it, so
// the device's first sync (which runs after it connected) returns its
// events. Either way nothing falls between catching up and live delivery;
// devices drop duplicates by (conversation_id, seq).
type Feed struct {
	DB   *pgxpool.Pool
	Sink Sink
	Log  *slog.Logger
	// Poll is how often the outbox is read while the feed is not
	// listening for notifications (default 1 s): before its LISTEN took
	// effect, while it reconnects, after a read failed, or with NoListen.
	// While it listens, each committed row's notification wakes it and it
	// reads nothing otherwise.
	Poll time.Duration
	// NoListen turns notifications off: the feed only polls (for
	// connection poolers that do not pass LISTEN through).
	NoListen bool

	last      atomic.Int64 // last outbox id processed
	listening atomic.Bool  // a LISTEN is in effect
	notified  atomic.Int64 // the highest outbox id a notification named
	mustRead  atomic.Bool  // a wake-up that named no id: the outbox must be read
	reads     atomic.Int64 // reads of the outbox
	delivered atomic.Int64
	markers   atomic.Int64
	rowsRead  atomic.Int64
	lost      atomic.Int64
	latency   prometheus.Histogram
}

// NewFeed returns a feed; Run starts it.
func NewFeed(db *pgxpool.Pool, sink Sink, log *slog.Logger) *Feed {
	if log == nil {
		log = slog.Default()
	}
	return &Feed{DB: db, Sink: sink, Log: log, Poll: time.Second,
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "chatpipe_delivery_seconds",
			Help:    "From an event's created_at (its writer's clock) to queueing it for a device.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)})}
}

// Collectors returns the feed's metrics.
func (f *Feed) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "chatpipe_delivery_frames_total", Help: "Event frames queued to devices (an event to a user's two devices counts twice)."},
			func() float64 { return float64(f.delivered.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "chatpipe_delivery_read_markers_total", Help: "Read marker frames queued to devices (one per device)."},
			func() float64 { return float64(f.markers.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "chatpipe_delivery_rows_total", Help: "Delivery outbox rows processed."},
			func() float64 { return float64(f.rowsRead.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "chatpipe_delivery_outbox_reads_total", Help: "Reads of the delivery outbox (woken by a notification, or polling while not listening)."},
			func() float64 { return float64(f.reads.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "chatpipe_delivery_lost_total", Help: "Times outbox rows were trimmed before this gateway read them (devices told to resync)."},
			func() float64 { return float64(f.lost.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "chatpipe_delivery_outbox_position", Help: "Last delivery outbox id processed."},
			func() float64 { return float64(f.last.Load()) }),
		f.latency,
	}
}

// Run follows the outbox from its current end until ctx ends.
func (f *Feed) Run(ctx context.Context) error {
	if f.Poll <= 0 {
		f.Poll = time.Second
	}
	for {
		var last int64
		err := f.DB.QueryRow(ctx, `SELECT last_id FROM delivery_counter`).Scan(&last)
		if err == nil {
			f.last.Store(last)
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		f.Log.Warn("delivery: reading the outbox position failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
	wake := make(chan struct{}, 1)
	if !f.NoListen {
		done := make(chan struct{})
		go func() { defer close(done); f.listen(ctx, wake) }()
		defer func() { <-done }()
	}
	t := time.NewTicker(f.Poll)
	defer t.Stop()
	read, ok := true, true
	for {
		if read && f.skip() {
			// Nobody is connected here, and the notifications name every
			// committed row: move past them without reading. A device
			// that connects later connected after they committed, so its
			// first sync returns their events.
			if n := f.notified.Load(); n > f.last.Load() {
				f.last.Store(n) // (only this goroutine writes last)
			}
			read, ok = false, true
		}
		if read {
			err := f.drain(ctx)
			if ok = err == nil; !ok && ctx.Err() == nil {
				f.Log.Warn("delivery: reading the outbox failed", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
			read = true
		case <-t.C:
			// Listening, every committed row wakes the feed: a tick
			// reads only without a LISTEN or after a failed read.
			read = !ok || !f.listening.Load()
		}
	}
}

// skip reports whether the feed may move past the notified rows without
// reading them: its LISTEN is in effect, no wake-up since the last read
// asked for a read, and no device is connected here.
func (f *Feed) skip() bool {
	if !f.listening.Load() || f.mustRead.Swap(false) {
		return false
	}
	return !f.Sink.Any()
}

// listen signals wake on every delivery notification, and once after each
// LISTEN took effect, until ctx ends. A notification's payload is the
// outbox id its row got (persist's pg_notify); one without an id
// (the LISTEN taking effect, or another sender) asks for a read.
func (f *Feed) listen(ctx context.Context, wake chan<- struct{}) {
	pglisten.Run(ctx, f.DB, pglisten.Delivery, func(payload string) {
		if id, err := strconv.ParseInt(payload, 10, 64); err == nil && id > 0 {
			if id > f.notified.Load() {
				f.notified.Store(id) // (only pglisten's one goroutine calls this)
			}
		} else {
			f.mustRead.Store(true)
		}
		select {
		case wake <- struct{}{}:
		default:
		}
	}, f.listening.Store, f.Log, "delivery: LISTEN connection lost; polling until it is back")
}

type outboxRow struct {
	id       int64
	convs    []string
	from, to []int64
	// Read markers the row's batch moved forward.
	readConvs, readUsers []string
	readSeqs             []int64
}

// drain processes every outbox row after the last one processed.
func (f *Feed) drain(ctx context.Context) error {
	for {
		last := f.last.Load()
		// One statement, one snapshot: the counter and the rows agree, so
		// a counter past the rows seen means rows were trimmed, not that
		// one committed between two reads.
		rows, err := f.DB.Query(ctx, `SELECT c.last_id, o.id, o.conversation_ids, o.from_seqs, o.to_seqs,
			o.read_conversation_ids, o.read_user_ids, o.read_seqs
			FROM delivery_counter c LEFT JOIN LATERAL (
				SELECT * FROM delivery_outbox WHERE id > $1 ORDER BY id LIMIT 200) o ON true
			ORDER BY o.id`, last)
		f.reads.Add(1)
		if err != nil {
			return fmt.Errorf("read outbox: %w", err)
		}
		var batch []outboxRow
		var counter int64
		var id *int64
		var r outboxRow
		if _, err := pgx.ForEachRow(rows, []any{&counter, &id, &r.convs, &r.from, &r.to, &r.readConvs, &r.readUsers, &r.readSeqs}, func() error {
			if id != nil {
				r.id = *id
				batch = append(batch, r)
			}
			return nil
		}); err != nil {
			return fmt.Errorf("read outbox: %w", err)
		}
		if len(batch) == 0 {
			if counter > last {
				// Rows up to counter were committed and are gone: trimmed.
				f.lose(fmt.Sprintf("delivery rows %d..%d were trimmed before this gateway read them", last+1, counter))
				f.last.Store(counter)
			}
			return nil
		}
		if batch[0].id != last+1 {
			f.lose(fmt.Sprintf("delivery rows %d..%d were trimmed before this gateway read them", last+1, batch[0].id-1))
		}
		if err := f.deliver(ctx, batch); err != nil {
			return err
		}
		f.last.Store(batch[len(batch)-1].id)
		f.rowsRead.Add(int64(len(batch)))
		if len(batch) < 200 {
			return nil
		}
	}
}

func (f *Feed) lose(reason string) {
	f.lost.Add(1)
	f.Log.Error("delivery: events may have been missed; closing every connection so devices sync", "reason", reason)
	f.Sink.Lost(reason)
}

// deliver pushes the events of a run of outbox rows, then the read
// markers they moved forward.
func (f *Feed) deliver(ctx context.Context, batch []outboxRow) error {
	byUser := map[string][]Push{}
	var users []string
	if err := f.deliverEvents(ctx, batch, byUser, &users); err != nil {
		return err
	}
	for _, row := range batch {
		for i, user := range row.readUsers {
			if i >= len(row.readConvs) || i >= len(row.readSeqs) || !f.Sink.Local(user) {
				continue
			}
			frame := protocol.EncodeReadMarker(&protocol.ReadMarker{Op: protocol.OpRead, ConversationID: row.readConvs[i], Seq: row.readSeqs[i]})
			if _, ok := byUser[user]; !ok {
				users = append(users, user)
			}
			byUser[user] = append(byUser[user], Push{Conv: row.readConvs[i], Seq: row.readSeqs[i], Read: true, Frame: frame})
		}
	}
	for _, user := range users {
		pushes := byUser[user]
		devices := int64(f.Sink.Deliver(user, pushes)) // each device gets every push
		var markers int64
		for _, p := range pushes {
			if p.Read {
				markers++
			}
		}
		f.delivered.Add(devices * (int64(len(pushes)) - markers))
		f.markers.Add(devices * markers)
	}
	return nil
}

// deliverEvents adds the event frames of a run of outbox rows to byUser,
// for the users connected here who may see them (users lists byUser's keys
// in the order they were added).
func (f *Feed) deliverEvents(ctx context.Context, batch []outboxRow, byUser map[string][]Push, users *[]string) error {
	// One range per conversation across the rows.
	idx := map[string]int{}
	var ranges []readmodel.Range
	for _, row := range batch {
		for i, c := range row.convs {
			if j, ok := idx[c]; ok {
				ranges[j].From, ranges[j].To = min(ranges[j].From, row.from[i]), max(ranges[j].To, row.to[i])
				continue
			}
			idx[c] = len(ranges)
			ranges = append(ranges, readmodel.Range{Conv: c, From: row.from[i], To: row.to[i]})
		}
	}
	if len(ranges) == 0 {
		return nil // read markers only
	}
	if !f.Sink.Any() {
		return nil // nobody here to deliver to (as if no user were Local)
	}
	// Periods overlapping those ranges, kept only for users connected here.
	c, fr, to := rangeArgs(ranges)
	rows, err := f.DB.Query(ctx, `SELECT m.conversation_id, m.user_id, m.joined_seq, m.left_seq
		FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS r(c, f, t)
		JOIN memberships m ON m.conversation_id = r.c AND m.joined_seq <= r.t AND (m.left_seq IS NULL OR m.left_seq >= r.f)`, c, fr, to)
	if err != nil {
		return fmt.Errorf("read memberships: %w", err)
	}
	periods := map[string][]readmodel.Period{}
	var conv, user string
	var joined int64
	var left *int64
	if _, err := pgx.ForEachRow(rows, []any{&conv, &user, &joined, &left}, func() error {
		if f.Sink.Local(user) {
			periods[conv] = append(periods[conv], readmodel.NewPeriod(conv, user, joined, left))
		}
		return nil
	}); err != nil {
		return fmt.Errorf("read memberships: %w", err)
	}
	var wanted []readmodel.Range
	for _, r := range ranges {
		if len(periods[r.Conv]) > 0 {
			wanted = append(wanted, r)
		}
	}
	if len(wanted) == 0 {
		return nil
	}
	c, fr, to = rangeArgs(wanted)
	rows, err = f.DB.Query(ctx, feedEventsSQL, c, fr, to)
	if err != nil {
		return fmt.Errorf("read events: %w", err)
	}
	events, created, err := scanEvents(rows, protocol.OpEvent)
	if err != nil {
		return fmt.Errorf("read events: %w", err)
	}
	now := time.Now()
	for i, e := range events {
		frame := protocol.EncodeEvent(e) // once, for every device
		f.latency.Observe(now.Sub(created[i]).Seconds())
		for _, user := range readmodel.Covering(periods[e.ConversationID], e.Seq) {
			if _, ok := byUser[user]; !ok {
				*users = append(*users, user)
			}
			byUser[user] = append(byUser[user], Push{Conv: e.ConversationID, Seq: e.Seq, Frame: frame})
		}
	}
	return nil
}
