// The transactional producer: opening it, and producing and committing a batch or marker.

package shardworker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/logrecord"
)

// openProducer opens the session's transactional producer. Its id is
// initialised (fencing the previous producer and aborting its open
// transaction) by the marker's transaction, the first thing it does.
func (s *shard) openProducer() error {
	if s.cl != nil {
		s.cl.Close()
		s.cl = nil
	}
	cl, err := kgo.NewClient(append(slices.Clip(s.w.cfg.KafkaOpts),
		kgo.SeedBrokers(s.w.cfg.Brokers...),
		kgo.TransactionalID(logrecord.TransactionalID(s.v)),
		kgo.TransactionTimeout(s.w.cfg.TxnTimeout),
		// One client per vshard: thousands per worker, each sending the
		// broker its own KIP-714 metrics (12 % of a worker's CPU during a
		// cold start of 1,371 vshards); the worker's /metrics has them.
		kgo.DisableClientMetrics(),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.DefaultProduceTopic(s.w.cfg.Topic),
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(s.w.cfg.CommitTimeout),
		kgo.MaxBufferedRecords(s.w.cfg.MaxBatch*2),
	)...)
	if err != nil {
		return fmt.Errorf("shardworker: producer: %w", err)
	}
	s.cl = cl
	return nil
}

// commitEvents produces e's events in one transaction and commits it,
// returning each event's offset.
func (s *shard) commitEvents(e *shardcore.Effect) ([]int64, error) {
	if s.cl == nil || e.Open { // the broken order of the fault tests opens late
		if err := s.openProducer(); err != nil {
			return nil, err
		}
	}
	recs := make([]*kgo.Record, len(e.Events))
	for i, ev := range e.Events {
		r, err := s.record(ev)
		if err != nil {
			return nil, err
		}
		recs[i] = r
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.w.cfg.CommitTimeout)
	defer cancel()
	start := time.Now()
	if err := s.commit(ctx, s.cl, recs, e.Marker, e.Confirm); err != nil {
		return nil, err
	}
	if !e.Marker {
		s.w.commitSeconds.Observe(time.Since(start).Seconds())
		s.w.stats.Commits.Add(1)
		n := 0
		for _, ev := range e.Events {
			if ev.HasSeq() {
				n++
			}
		}
		s.w.stats.Events.Add(int64(n))
		s.hot.count(time.Now(), e.Events)
	}
	offs := make([]int64, len(recs))
	for i, r := range recs {
		offs[i] = r.Offset
	}
	return offs, nil
}

func (s *shard) record(e *logrecord.Event) (*kgo.Record, error) {
	val, err := e.Marshal()
	if err != nil {
		return nil, err
	}
	r := &kgo.Record{Key: []byte(e.Key()), Value: val, Partition: s.part, Topic: s.w.cfg.Topic}
	for _, h := range e.Headers() {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: h[0], Value: []byte(h[1])})
	}
	return r, nil
}

// commit produces recs in one transaction and commits it. Any produce error
// aborts the whole transaction (a commit after a failed produce would
// commit what did succeed). An error from EndTransaction may still mean the
// transaction committed: the caller treats every error as an unknown
// outcome. marker: recs is a takeover marker (the fault tests' sleep before
// the commit holds batches open, not takeovers).
func (s *shard) commit(ctx context.Context, cl *kgo.Client, recs []*kgo.Record, marker, confirm bool) error {
	if err := cl.BeginTransaction(); err != nil {
		return fmt.Errorf("shardworker: begin transaction: %w", err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	wg.Add(len(recs))
	for _, r := range recs {
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
			wg.Done()
		})
	}
	if err := cl.Flush(ctx); err != nil {
		// Flush gave up at ctx's deadline. A record still buffered then
		// (waiting, say, for partition metadata that a restarting broker
		// does not give yet) fails only once the client gives up on it,
		// which can take longer than any stop may wait: close the client,
		// which fails every buffered record at once, and let the next
		// session open a new one. The open transaction is the broker's to
		// abort (its timeout, or that next producer's InitProducerID).
		cl.Close()
		if s.cl == cl {
			s.cl = nil
		}
		wg.Wait()
		if firstErr != nil && !errors.Is(firstErr, kgo.ErrClientClosed) {
			err = firstErr // (a record's own error, from before the close)
		}
		s.countFence(err)
		return fmt.Errorf("shardworker: produce: %w", err)
	}
	wg.Wait() // (every promise has run once Flush returns nil)
	if firstErr != nil {
		s.countFence(firstErr)
		_ = cl.AbortBufferedRecords(ctx)
		_ = cl.EndTransaction(ctx, kgo.TryAbort)
		return fmt.Errorf("shardworker: produce: %w", firstErr)
	}
	if faultSleepBeforeCommit > 0 && !marker {
		markCommit()
		time.Sleep(faultSleepBeforeCommit)
		holdCommit()
	}
	if confirm {
		// The produce initialised the transactional.id (fencing every
		// older producer); only now is a look at the owner row proof that
		// no newer owner initialised it before: one that did first had
		// its row written before that.
		if still, err := s.stillOwner(); err != nil || !still {
			_ = cl.EndTransaction(ctx, kgo.TryAbort)
			if err == nil {
				err = errors.New("the owner row names another writer")
			}
			return fmt.Errorf("shardworker: confirm ownership before the marker: %w", err)
		}
	}
	// EndTransaction gets a context of its own: a cancelled or expired one
	// leaves the outcome unknown without even asking the broker (franz-go
	// advises against cancelling it), and after a long pause the broker's
	// answer — fenced or committed — is exactly what the writer must learn.
	ectx, ecancel := context.WithTimeout(context.Background(), s.w.cfg.CommitTimeout)
	defer ecancel()
	if err := cl.EndTransaction(ectx, kgo.TryCommit); err != nil {
		s.countFence(err)
		s.w.stats.UnknownCommits.Add(1)
		if faultRecommitAfterAbort && !marker && s.recommitAfterAbort(recs) == nil {
			return nil
		}
		return fmt.Errorf("shardworker: commit: %w", err)
	}
	return nil
}

func (s *shard) countFence(err error) {
	if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
		s.w.stats.FencedWrites.Add(1)
		s.log.Warn("writes fenced: another writer took this vshard over", "err", err)
	}
}
