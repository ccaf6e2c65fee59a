package projection

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/pgtest"
	"github.com/chatpipe/chatpipe/logrecord"
)

// countingConn counts the writes to a Postgres connection: each is a flush
// of pgx's buffer, and the client waits for an answer after every one, so
// their number is the number of round trips.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// countingPool is a pool on db's database whose connections count their
// writes in writes. It never pings a connection it hands out (the pool
// does after a second idle), so that only the batches' writes count.
func countingPool(tb testing.TB, db *pgxpool.Pool, writes *atomic.Int64) *pgxpool.Pool {
	tb.Helper()
	cfg := db.Config().Copy()
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, fmt.Errorf("dial: %w", err)
		}
		return countingConn{Conn: c, writes: writes}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// cpuTime is the CPU time (user and system) this process has used; the
// Postgres server is another process and is not in it.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchRecords makes n records at offsets from off on, spread over 8
// conversations: a create opens each conversation, then messages, and
// every 50th record is a join.
func benchRecords(tb testing.TB, n int, off int64) []*kgo.Record {
	tb.Helper()
	at := time.Unix(1_700_000_000, 0).UTC()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		o := off + int64(i)
		e := &logrecord.Event{Kind: logrecord.KindMessage, ConversationID: fmt.Sprintf("c%d", o%8), Seq: o/8 + 1,
			MessageID: fmt.Sprintf("m%d", o), ClientMessageID: fmt.Sprintf("k%d", o), Sender: "u1",
			Body: "hello, this is a chat message of ordinary length", CreatedAt: at.Add(time.Duration(o) * time.Millisecond), VShard: 3, Epoch: 1}
		switch {
		case o < 8:
			e.Kind, e.Members, e.Body = logrecord.KindCreate, []string{"u1", "u2"}, ""
		case o%50 == 0:
			e.Kind, e.UserID, e.Body = logrecord.KindJoin, fmt.Sprintf("u%d", o), ""
		}
		b, err := e.Marshal()
		if err != nil {
			tb.Fatal(err)
		}
		recs[i] = &kgo.Record{Topic: logrecord.DefaultTopic, Partition: 0, Offset: o, Key: []byte(e.Key()), Value: b}
	}
	return recs
}

// BenchmarkHandle measures one batch of records in, read model, delivery
// row and offsets committed out (without persist's event rows), and
// reports the round trips to Postgres per batch.
func BenchmarkHandle(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			var writes atomic.Int64
			base := pgtest.DB(b, pgtest.Options{})
			ctx := context.Background()
			db := countingPool(b, base, &writes)
			p := newTestProjector(b, db)
			// Warm up: connect, prepare the statements, create the conversations.
			if err := p.consumer.Write(ctx, benchRecords(b, max(n, 8), 0)); err != nil {
				b.Fatal(err)
			}
			batches := make([][]*kgo.Record, b.N)
			for i := range batches {
				batches[i] = benchRecords(b, n, int64(i+1)*int64(max(n, 8)))
			}
			writes.Store(0)
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cpuTime(b)
			for _, recs := range batches {
				if err := p.consumer.Write(ctx, recs); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(writes.Load())/float64(b.N), "roundtrips/batch")
			if got, want := p.model.events.Load(), int64(b.N*n+max(n, 8)); got != want {
				b.Fatalf("events applied %d, want %d", got, want)
			}
		})
	}
}
