package logsink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/pgtest"
	"github.com/chatpipe/chatpipe/logrecord"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const testTopic = "chatpipe.log"

// sink is a consumer whose Handle copies record values into a text column,
// so that Postgres itself refuses a NUL byte, as it does for persist.
type sink struct {
	db    *pgxpool.Pool
	c     *Consumer
	calls int
	fail  func(r *kgo.Record) error // an error Handle returns before writing, if any
}

func newSink(t *testing.T) *sink {
	t.Helper()
	db := pgtest.DB(t, pgtest.Options{})
	if _, err := db.Exec(context.Background(), `CREATE TABLE sink (part int, off bigint, body text, PRIMARY KEY (part, off))`); err != nil {
		t.Fatal(err)
	}
	s := &sink{db: db}
	s.c = New(Config{Topic: testTopic, Consumer: "sink", DB: db, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handle: s.handle}, "chatpipe_sink", "lag")
	s.c.joined.Store(true)
	return s
}

func (s *sink) handle(ctx context.Context, b *pgx.Batch, recs []*kgo.Record) (Queued, error) {
	s.calls++
	var parts []int32
	var offs []int64
	var bodies []string
	for _, r := range recs {
		if s.fail != nil {
			if err := s.fail(r); err != nil {
				return Queued{}, fmt.Errorf("sink: record at %d/%d: %w", r.Partition, r.Offset, err)
			}
		}
		parts, offs, bodies = append(parts, r.Partition), append(offs, r.Offset), append(bodies, string(r.Value))
	}
	b.Queue(`INSERT INTO sink SELECT * FROM unnest($1::int[], $2::bigint[], $3::text[])`, parts, offs, bodies)
	return Queued{}, nil
}

// records makes n records per partition in poll order (partition by
// partition), with value "p/o" except where poison says otherwise.
func records(parts, n int, poison map[[2]int][]byte) []*kgo.Record {
	var out []*kgo.Record
	for p := range parts {
		for o := range n {
			v := []byte(fmt.Sprintf("%d/%d", p, o))
			if pv, ok := poison[[2]int{p, o}]; ok {
				v = pv
			}
			out = append(out, &kgo.Record{Topic: testTopic, Partition: int32(p), Offset: int64(o), Key: []byte("k"), Value: v})
		}
	}
	return out
}

type deadLetter struct {
	part     int32
	off      int64
	sqlstate *string
	errText  string
	value    []byte
}

func (s *sink) deadLetters(t *testing.T) []deadLetter {
	t.Helper()
	rows, err := s.db.Query(context.Background(), `SELECT log_partition, log_offset, sqlstate, error, record_value FROM dead_letters
		WHERE consumer = 'sink' AND topic = $1 ORDER BY 1, 2`, testTopic)
	if err != nil {
		t.Fatal(err)
	}
	var out []deadLetter
	var d deadLetter
	if _, err := pgx.ForEachRow(rows, []any{&d.part, &d.off, &d.sqlstate, &d.errText, &d.value}, func() error {
		out = append(out, d)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// check asserts that the sink holds every record but the dead ones exactly
// once, and that the stored offsets are past every record.
func (s *sink) check(t *testing.T, parts, n int, dead map[[2]int]bool) {
	t.Helper()
	ctx := context.Background()
	for p := range parts {
		for o := range n {
			var cnt int
			if err := s.db.QueryRow(ctx, `SELECT count(*) FROM sink WHERE part = $1 AND off = $2`, p, o).Scan(&cnt); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{true: 0, false: 1}[dead[[2]int{p, o}]]; cnt != want {
				t.Errorf("record %d/%d written %d times, want %d", p, o, cnt, want)
			}
		}
	}
	offs, err := Offsets(ctx, s.db, "sink", testTopic)
	if err != nil {
		t.Fatal(err)
	}
	for p := range parts {
		if offs[int32(p)] != int64(n) {
			t.Errorf("stored offset of partition %d = %d, want %d", p, offs[int32(p)], n)
		}
	}
}

// TestPoisonRecordIsDeadLettered: a record Postgres refuses (a NUL byte in
// text, SQLSTATE 22021) goes to dead_letters with its value and error, the
// others are written once, and the partitions move on.
func TestPoisonRecordIsDeadLettered(t *testing.T) {
	s := newSink(t)
	poison := []byte("a\x00b")
	recs := records(2, 10, map[[2]int][]byte{{0, 3}: poison, {1, 7}: poison})
	s.c.handleRetrying(context.Background(), recs)
	s.check(t, 2, 10, map[[2]int]bool{{0, 3}: true, {1, 7}: true})
	dl := s.deadLetters(t)
	if len(dl) != 2 || dl[0].part != 0 || dl[0].off != 3 || dl[1].part != 1 || dl[1].off != 7 {
		t.Fatalf("dead letters = %+v, want 0/3 and 1/7", dl)
	}
	for _, d := range dl {
		if d.sqlstate == nil || *d.sqlstate != "22021" || !bytes.Equal(d.value, poison) || !strings.Contains(d.errText, "0x00") {
			t.Errorf("dead letter %d/%d: sqlstate %v, error %q, value %q", d.part, d.off, d.sqlstate, d.errText, d.value)
		}
	}
	if got := value(t, s.c.deadLetters); got != 2 {
		t.Errorf("dead letters counter = %v, want 2", got)
	}
	if s.calls > 40 {
		t.Errorf("%d Handle calls for 20 records with 2 bad ones: not bisecting?", s.calls)
	}
	if d := s.c.Degraded(context.Background()); !strings.Contains(d, "2 dead letters") {
		t.Errorf("Degraded = %q", d)
	}
	if err := s.c.CaughtUp(0); err != nil {
		t.Errorf("CaughtUp = %v: dead letters do not make a consumer unready", err)
	}

	// The same poll again (a restart before Kafka saw the offsets): no new
	// rows, no second dead letter.
	s.fail = nil
	s2 := &sink{db: s.db}
	s2.c = New(Config{Topic: testTopic, Consumer: "sink", DB: s.db, Log: s.c.cfg.Log, Handle: func(ctx context.Context, b *pgx.Batch, recs []*kgo.Record) (Queued, error) {
		next, err := Offsets(ctx, s.db, "sink", testTopic)
		if err != nil {
			return Queued{}, err
		}
		var todo []*kgo.Record
		for _, r := range recs {
			if r.Offset >= next[r.Partition] {
				todo = append(todo, r)
			}
		}
		if len(todo) == 0 {
			return Queued{}, nil
		}
		return s2.handle(ctx, b, todo)
	}}, "chatpipe_sink", "lag")
	s2.c.handleRetrying(context.Background(), recs)
	s.check(t, 2, 10, map[[2]int]bool{{0, 3}: true, {1, 7}: true})
	if n := len(s.deadLetters(t)); n != 2 {
		t.Errorf("%d dead letters after a replay, want 2", n)
	}
}

// TestMalformedRecordIsDeadLettered: a record no version reads is dead-
// lettered without a SQLSTATE.
func TestMalformedRecordIsDeadLettered(t *testing.T) {
	s := newSink(t)
	s.fail = func(r *kgo.Record) error {
		if string(r.Value) == "garbage" {
			_, err := logrecord.Unmarshal(r.Value)
			return err
		}
		return nil
	}
	s.c.handleRetrying(context.Background(), records(1, 5, map[[2]int][]byte{{0, 0}: []byte("garbage")}))
	s.check(t, 1, 5, map[[2]int]bool{{0, 0}: true})
	if dl := s.deadLetters(t); len(dl) != 1 || dl[0].sqlstate != nil || !strings.Contains(dl[0].errText, "malformed") {
		t.Errorf("dead letters = %+v", dl)
	}
}

// TestTransientErrorIsRetried: an error that is not the records' fault is
// retried, never dead-lettered.
func TestTransientErrorIsRetried(t *testing.T) {
	s := newSink(t)
	left := 4
	s.fail = func(r *kgo.Record) error {
		if r.Offset == 2 && left > 0 {
			left--
			return errors.New("connection reset by peer")
		}
		return nil
	}
	s.c.handleRetrying(context.Background(), records(1, 5, nil))
	s.check(t, 1, 5, nil)
	if dl := s.deadLetters(t); len(dl) != 0 {
		t.Errorf("dead letters = %+v, want none", dl)
	}
}

// TestNewerVersionHalts: a record of a newer schema version is neither
// skipped nor dead-lettered: the consumer stops there, not ready, its
// halted gauge set, until ctx ends; nothing of the batch is written.
func TestNewerVersionHalts(t *testing.T) {
	s := newSink(t)
	s.fail = func(r *kgo.Record) error {
		if r.Offset == 3 {
			_, err := logrecord.Unmarshal([]byte(`{"v":99,"kind":"message"}`))
			return err
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.c.handleRetrying(ctx, records(1, 5, nil)) }()
	deadline := time.Now().Add(10 * time.Second)
	for s.c.CaughtUp(0) == nil {
		if time.Now().After(deadline) {
			t.Fatal("consumer still ready at a record of a newer version")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // past the permanent errors' retries
	if err := s.c.CaughtUp(0); err == nil || !strings.Contains(err.Error(), "upgrade") {
		t.Errorf("CaughtUp = %v", err)
	}
	if got := value(t, s.c.haltedGauge); got != 1 {
		t.Errorf("halted gauge = %v, want 1", got)
	}
	select {
	case <-done:
		t.Fatal("the consumer moved on past a record of a newer version")
	default:
	}
	cancel()
	<-done
	if dl := s.deadLetters(t); len(dl) != 0 {
		t.Errorf("dead letters = %+v, want none", dl)
	}
	var n int
	if err := s.db.QueryRow(context.Background(), `SELECT count(*) FROM sink`).Scan(&n); err != nil || n != 0 {
		t.Errorf("sink holds %d rows (%v), want 0", n, err)
	}
}

// TestClassify pins the error classes.
func TestClassify(t *testing.T) {
	for _, c := range []struct {
		err  error
		want errClass
	}{
		{fmt.Errorf("x: %w", &pgconnError22021), permanent},
		{fmt.Errorf("x: %w", &pgconnError54000), permanent},
		{fmt.Errorf("x: %w", &pgconnError40001), transient},
		{fmt.Errorf("x: %w", &pgconnError23505), transient},
		{errors.New("dial tcp: connection refused"), transient},
		{fmt.Errorf("x: %w", logrecord.ErrMalformed), permanent},
		{fmt.Errorf("x: %w", logrecord.ErrUnsupportedVersion), halt},
	} {
		if got, _ := classify(c.err); got != c.want {
			t.Errorf("classify(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// value reads a counter's or gauge's value.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// TestTooManyDeadLettersStops: when every record fails for good, the fault
// is systemic, not one bad record: past MaxDeadLetters in a minute the
// consumer stops at the record (not ready, halted) instead of setting the
// whole log aside.
func TestTooManyDeadLettersStops(t *testing.T) {
	s := newSink(t)
	s.c.cfg.MaxDeadLetters = 3
	poison := map[[2]int][]byte{}
	for o := range 10 {
		poison[[2]int{0, o}] = []byte("a\x00b")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	s.c.handleRetrying(ctx, records(1, 10, poison)) // returns when ctx ends: it never gets past the fourth
	if n := len(s.deadLetters(t)); n != 3 {
		t.Errorf("%d dead letters, want 3 (the cap)", n)
	}
	if err := s.c.CaughtUp(1 << 40); err == nil || !strings.Contains(err.Error(), "too many dead letters") {
		t.Errorf("CaughtUp = %v, want stopped for too many dead letters", err)
	}
	if got := value(t, s.c.haltedGauge); got != 1 {
		t.Errorf("halted = %v, want 1", got)
	}
	offs, err := Offsets(context.Background(), s.db, "sink", testTopic)
	if err != nil {
		t.Fatal(err)
	}
	if offs[0] != 3 {
		t.Errorf("stored offset %d, want 3: the consumer must stop at the fourth bad record", offs[0])
	}
}

// TestSalvageWritesWhatItCan: a record dead-lettered is written with the
// first salvage whose transaction commits: one that Postgres refuses for
// good (here a division by zero, class 22) is skipped, the next is kept, and
// a record no salvage can write is dead-lettered alone. Each is one dead
// letter, and the partition moves past both.
func TestSalvageWritesWhatItCan(t *testing.T) {
	s := newSink(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := s.db.Exec(ctx, `CREATE TABLE salvaged (off bigint PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	var committed []int64
	s.c.cfg.Salvage = []Salvage{
		{What: "nothing it can", Handle: func(_ context.Context, b *pgx.Batch, recs []*kgo.Record) (Queued, error) {
			b.Queue(`SELECT 1 / 0`)
			return Queued{}, nil
		}},
		{What: "its offset", Handle: func(_ context.Context, b *pgx.Batch, recs []*kgo.Record) (Queued, error) {
			if bytes.Contains(recs[0].Value, []byte("\x01")) {
				b.Queue(`SELECT 'x' || $1::text`, string(recs[0].Value)) // refused like the record itself
			}
			b.Queue(`INSERT INTO salvaged VALUES ($1)`, recs[0].Offset)
			return Queued{Committed: func() { committed = append(committed, recs[0].Offset) }}, nil
		}},
	}
	recs := records(1, 5, map[[2]int][]byte{{0, 1}: []byte("a\x00b"), {0, 3}: []byte("\x01\x00")})
	if err := s.c.Settle(ctx, recs); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := s.db.QueryRow(ctx, `SELECT (SELECT string_agg(off::text, ' ' ORDER BY off) FROM sink) || ' | ' ||
		(SELECT string_agg(off::text, ' ' ORDER BY off) FROM salvaged) || ' | ' ||
		(SELECT string_agg(log_offset::text, ' ' ORDER BY log_offset) FROM dead_letters)`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if want := "0 2 4 | 1 | 1 3"; got != want {
		t.Errorf("written | salvaged | dead letters = %q, want %q", got, want)
	}
	if fmt.Sprint(committed) != "[1]" {
		t.Errorf("salvages committed for offsets %v, want [1]", committed)
	}
	if offs, err := Offsets(ctx, s.db, "sink", testTopic); err != nil || offs[0] != 5 {
		t.Errorf("offsets = %v, %v; want partition 0 at 5", offs, err)
	}
}
