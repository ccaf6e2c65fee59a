// Reading the log's tail up to the takeover marker, for the replay.

package shardworker

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/logrecord"
)

// readTail reads the log tail e asks for: from persist's offset (or the
// start) up to the marker.
func (s *shard) readTail(ctx context.Context, e *shardcore.Effect) ([]*logrecord.Event, error) {
	end := e.To
	if end < 0 {
		var err error
		if end, err = s.partitionEnd(ctx); err != nil {
			return nil, err
		}
	}
	start := kgo.NewOffset().AtStart()
	if !e.FromStart {
		start = kgo.NewOffset().At(e.From)
	}
	if !e.FromStart && e.From >= end {
		return nil, nil
	}
	return readTail(ctx, s.w.cfg.Brokers, s.w.cfg.Topic, s.part, start, end, s.v, faultAcceptBeforeMarker, s.w.cfg.KafkaOpts...)
}

// readTail reads partition part from start up to (not including) the
// marker at end, read_committed, and returns the events of vshard v.
// untilIdle (only for the broken order of the fault tests, which has no
// marker to wait for) stops at the first empty fetch instead.
func readTail(ctx context.Context, brokers []string, topic string, part int32, start kgo.Offset, end int64, v int, untilIdle bool, extra ...kgo.Opt) ([]*logrecord.Event, error) {
	cl, err := kgo.NewClient(append(slices.Clip(extra),
		kgo.SeedBrokers(brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {part: start}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.DisableClientMetrics(), // one short-lived client per takeover
		kgo.FetchMaxWait(200*time.Millisecond),
	)...)
	if err != nil {
		return nil, fmt.Errorf("shardworker: replay consumer: %w", err)
	}
	defer cl.Close()
	want := strconv.Itoa(v)
	var out []*logrecord.Event
	for {
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if untilIdle {
			pctx, cancel = context.WithTimeout(ctx, time.Second)
		}
		fs := cl.PollFetches(pctx)
		idle := pctx.Err() != nil
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("shardworker: replay of partition %d did not reach the marker at %d: %w", part, end, err)
		}
		if untilIdle && idle {
			return out, nil
		}
		if errs := fs.Errors(); len(errs) > 0 {
			return nil, fmt.Errorf("shardworker: replay fetch: %w", errs[0].Err)
		}
		reached := false
		var bad error
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= end {
				reached = true
				return
			}
			if bad != nil || headerValue(r, logrecord.HeaderVShard) != want {
				return
			}
			e, err := logrecord.Unmarshal(r.Value)
			if err != nil {
				// Its seq is unknown: replaying without it could hand the
				// seq out again. The takeover fails (and is retried) until
				// this build can read it (a newer version) or an operator
				// steps in (a malformed record).
				bad = fmt.Errorf("shardworker: replay of vshard %s: record at %d/%d: %w", want, r.Partition, r.Offset, err)
				return
			}
			if !e.HasSeq() {
				return // a takeover or read marker: no seq, no state
			}
			out = append(out, e)
		})
		if bad != nil {
			return nil, bad
		}
		if reached {
			return out, nil
		}
	}
}

func headerValue(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
