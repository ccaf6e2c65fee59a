package logsink

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/chatpipe/chatpipe/internal/kafkatest"
)

// lingerTopic starts a broker with a one-partition topic for the test and
// a producer to it; the test's cleanup stops both.
func lingerTopic(ctx context.Context, t *testing.T) (brokers []string, topic string, prod *kgo.Client) {
	t.Helper()
	brokers, topic = []string{kafkatest.Broker(t).Addr()}, "linger"
	return brokers, topic, kafkatest.Topic(ctx, t, brokers, topic)
}

// TestLingerFillsTheBatch: a consumer lingering after a poll takes the
// records that arrive meanwhile into the same batch, stops once the batch
// is full, and returns what it has when the wait is over, with no fetch
// error for the wait's end.
func TestLingerFillsTheBatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	brokers, topic, prod := lingerTopic(ctx, t)
	produce := func(i int) {
		if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte(fmt.Sprint(i))}).FirstErr(); err != nil {
			t.Error(err)
		}
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	c := New(Config{Consumer: "test", MaxBatch: 6, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, "test", "")

	produce(0)
	fs := cons.PollRecords(ctx, c.cfg.MaxBatch)
	if n := fs.NumRecords(); n != 1 {
		t.Fatalf("first poll: %d records, want 1", n)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; i <= 8; i++ {
			time.Sleep(10 * time.Millisecond)
			produce(i)
		}
	}()
	fs = c.linger(ctx, cons, fs, 30*time.Second)
	if n := fs.NumRecords(); n != c.cfg.MaxBatch {
		t.Errorf("lingering for a full batch: %d records, want %d", n, c.cfg.MaxBatch)
	}
	<-done
	// Three more are buffered or on their way; nothing else comes.
	rest := cons.PollRecords(ctx, c.cfg.MaxBatch)
	rest = c.linger(ctx, cons, rest, 300*time.Millisecond)
	if n := fs.NumRecords() + rest.NumRecords(); n != 9 {
		t.Errorf("after the wait ran out: %d records in all, want 9", n)
	}
	if errs := rest.Errors(); len(errs) != 0 {
		t.Errorf("the wait's end showed as fetch errors: %v", errs)
	}
}

// fetchCounter counts the fetch requests a client writes.
type fetchCounter struct{ n atomic.Int64 }

func (h *fetchCounter) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, _ error) {
	if key == kmsg.Fetch.Int16() {
		h.n.Add(1)
	}
}

// TestLingerFetchesFewTimes: a consumer lingering while records trickle
// in, one a millisecond, takes them in at most two fetches per
// lingerStep, not in a fetch per record (as it did while it polled
// through the wait: 283 fetches for 284 records here).
func TestLingerFetchesFewTimes(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	brokers, topic, prod := lingerTopic(ctx, t)
	var fetches fetchCounter
	cons, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.WithHooks(&fetches))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	c := New(Config{Consumer: "test", MaxBatch: 100000, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, "test", "")

	const d = 300 * time.Millisecond
	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		n := 0
		defer func() { done <- n }()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte(fmt.Sprint(n))}).FirstErr(); err != nil {
				t.Error(err)
				return
			}
			n++
		}
	}()
	fs := cons.PollRecords(ctx, c.cfg.MaxBatch)
	before := fetches.n.Load()
	fs = c.linger(ctx, cons, fs, d)
	during := fetches.n.Load() - before
	close(stop)
	produced := <-done
	steps := int64((d + lingerStep - 1) / lingerStep)
	t.Logf("%d records produced, %d taken, %d fetches while lingering %v", produced, fs.NumRecords(), during, d)
	if limit := 2*steps + 1; during > limit {
		t.Errorf("lingering %v took %d fetches, want at most %d (two per %v, and the one out at the start)", d, during, limit, lingerStep)
	}
	if fs.NumRecords() < 2 {
		t.Errorf("lingering %v while records arrived took %d records in all, want more than the first poll's", d, fs.NumRecords())
	}
	if errs := fs.Errors(); len(errs) != 0 {
		t.Errorf("the wait's end showed as fetch errors: %v", errs)
	}
}
