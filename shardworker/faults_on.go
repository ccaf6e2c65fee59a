//go:build chatpipe_faults

package shardworker

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/chatpipe/chatpipe/internal/shardcore"
)

// Fault points for the fault-injection tests, compiled only into binaries
// built with -tags chatpipe_faults and driven by environment variables.
var (
	// faultSleepBeforeCommit holds every transaction open between its
	// produces and its commit, so a kill or a pause lands in that window.
	faultSleepBeforeCommit = envDuration("CHATPIPE_FAULT_SLEEP_BEFORE_COMMIT")
	// faultCommitMark is a file created whenever a transaction enters that
	// sleep, so a test can pause the process while one is open.
	faultCommitMark = os.Getenv("CHATPIPE_FAULT_COMMIT_MARK")
	// faultCommitHold is a file that, while it exists, keeps a
	// transaction that has entered that sleep from going on to its
	// commit, so a test can pause the process with one surely open.
	faultCommitHold = os.Getenv("CHATPIPE_FAULT_COMMIT_HOLD")
	// faultAcceptBeforeMarker reverses the takeover order ON PURPOSE:
	// replay, accept (after faultAcceptDelay), and fence the previous
	// writer only with the first commit. Tests use it to show that the
	// invariant checks catch the duplicate seqs this causes.
	faultAcceptBeforeMarker = os.Getenv("CHATPIPE_FAULT_ACCEPT_BEFORE_MARKER") != ""
	faultAcceptDelay        = envDuration("CHATPIPE_FAULT_ACCEPT_DELAY")
	// faultRecommitAfterAbort is a BROKEN recovery ON PURPOSE: a commit
	// the broker refused (the transaction timed out while the process was
	// paused, or a newer owner fenced it) is committed again with a fresh
	// producer of the same transactional.id, without asking etcd who owns
	// the vshard. Re-initialising fences the new owner, and the stale
	// batch takes seqs the new owner has handed out. Tests use it to show
	// the pause-past-the-transaction-timeout test catches it.
	faultRecommitAfterAbort = os.Getenv("CHATPIPE_FAULT_RECOMMIT_AFTER_ABORT") != ""
	// faultLoaderSlow makes the writers' shared state loads (loader.go)
	// wait: every load queues, and once per that long one round trip
	// answers all the loads queued, so that the loads of every writer of
	// the worker that come within it are merged.
	faultLoaderSlow = envDuration("CHATPIPE_FAULT_LOADER_SLOW")
)

// faultPump answers the loads queued, in one round trip, once per
// faultLoaderSlow, until the loader stops. Under faultLoaderSlow no load
// makes its round trip itself (maxTrips is 0).
func (l *loader) faultPump() {
	t := time.NewTicker(faultLoaderSlow)
	defer t.Stop()
	for {
		select {
		case <-l.done:
			return
		case <-t.C:
		}
		l.mu.Lock()
		batch := l.takeLocked()
		l.mu.Unlock()
		if len(batch) > 0 {
			l.answer(batch)
		}
	}
}

// noteMergedLoads logs, under faultLoaderSlow, every conversation that
// several loads of one round trip ask for, so a test can tell that two
// writers' loads of it were merged.
func noteMergedLoads(batch []*loadReq) {
	if faultLoaderSlow == 0 {
		return
	}
	n, keyed := map[string]int{}, map[string]int{}
	for _, r := range batch {
		for _, c := range r.convs {
			n[c]++
			if slices.ContainsFunc(r.keys, func(k shardcore.DedupeKey) bool { return k.Conv == c }) {
				keyed[c]++ // a load for commands, not only to look at a move
			}
		}
	}
	for c, k := range n {
		if k > 1 {
			slog.Warn("PLANTED FAULT: one round trip loads a conversation for several writers", "conversation", c, "loads", k, "for_commands", keyed[c])
		}
	}
}

// recommitAfterAbort commits recs again with a new producer (see
// faultRecommitAfterAbort), setting their offsets.
func (s *shard) recommitAfterAbort(recs []*kgo.Record) error {
	if err := s.openProducer(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.w.cfg.CommitTimeout)
	defer cancel()
	if err := s.cl.BeginTransaction(); err != nil {
		return err
	}
	for _, r := range recs {
		again := &kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: r.Headers}
		res := s.cl.ProduceSync(ctx, again)
		if err := res.FirstErr(); err != nil {
			_ = s.cl.EndTransaction(ctx, kgo.TryAbort)
			return err
		}
		r.Offset = again.Offset
	}
	if err := s.cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		return err
	}
	s.log.Warn("PLANTED FAULT: committed a refused batch again with a fresh producer", "records", len(recs))
	return nil
}

func markCommit() {
	if faultCommitMark != "" {
		os.WriteFile(faultCommitMark, nil, 0o644)
	}
}

// holdCommit waits while the faultCommitHold file exists.
func holdCommit() {
	for faultCommitHold != "" {
		if _, err := os.Stat(faultCommitHold); err != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func envDuration(name string) time.Duration {
	d, _ := time.ParseDuration(os.Getenv(name))
	return d
}

// partitionEnd is the partition's last stable offset now: where the
// BROKEN takeover order of the fault tests replays to, without fencing
// anyone. The previous writer can commit after it and the seqs it used get
// assigned again.
func (s *shard) partitionEnd(ctx context.Context) (int64, error) {
	adm, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(s.w.cfg.Brokers...)}, s.w.cfg.KafkaOpts...)...)
	if err != nil {
		return 0, err
	}
	defer adm.Close()
	req := kmsg.NewPtrListOffsetsRequest()
	req.IsolationLevel = 1
	t := kmsg.NewListOffsetsRequestTopic()
	t.Topic = s.w.cfg.Topic
	p := kmsg.NewListOffsetsRequestTopicPartition()
	p.Partition, p.Timestamp = s.part, -1
	t.Partitions = append(t.Partitions, p)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, adm)
	if err != nil {
		return 0, err
	}
	return resp.Topics[0].Partitions[0].Offset, nil
}

// vshardConversations lists every conversation of the vshard in Postgres,
// so the broken order loads them all now, as a replay-everything writer
// would, and its state is that of this moment and not of the first command.
func (s *shard) vshardConversations(ctx context.Context) ([]string, error) {
	rows, err := s.w.cfg.DB.Query(ctx, `SELECT DISTINCT conversation_id FROM events WHERE vshard = $1`, s.v)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
