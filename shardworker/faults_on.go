//go:build chatpipe_faults

package shardworker

import (
	"context"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/chatpipe/chatpipe/shardcore"
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
	// faultAcceptBeforeMarker reverses the takeover order ON PURPOSE:
	// replay, accept (after faultAcceptDelay), and fence the previous
	// writer only with the first commit. Tests use it to show that the
	// invariant checks catch the duplicate seqs this causes.
	faultAcceptBeforeMarker = os.Getenv("CHATPIPE_FAULT_ACCEPT_BEFORE_MARKER") != ""
	faultAcceptDelay        = envDuration("CHATPIPE_FAULT_ACCEPT_DELAY")
)

func markCommit() {
	if faultCommitMark != "" {
		os.WriteFile(faultCommitMark, nil, 0o644)
	}
}

func envDuration(name string) time.Duration {
	d, _ := time.ParseDuration(os.Getenv(name))
	return d
}

// replayWithoutMarker is the BROKEN takeover order of the fault tests:
// replay up to the partition's current end without fencing anyone, wait
// faultAcceptDelay, then accept. The previous writer can commit in between
// and the seqs it used get assigned again.
func (s *shard) replayWithoutMarker() (map[string]*shardcore.Conv, int, int64, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.w.cfg.ReplayTimeout)
	defer cancel()
	adm, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(s.w.cfg.Brokers...)}, s.w.cfg.KafkaOpts...)...)
	if err != nil {
		return nil, 0, 0, err
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
		return nil, 0, 0, err
	}
	end := resp.Topics[0].Partitions[0].Offset
	convs, n, err := s.replay(end)
	if err != nil {
		return nil, 0, 0, err
	}
	// Load every conversation now, as a replay-everything writer would, so
	// the state is that of this moment and not of the first command.
	rows, err := s.w.cfg.DB.Query(ctx, `SELECT DISTINCT conversation_id FROM events WHERE vshard = $1`, s.v)
	if err != nil {
		return nil, 0, 0, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, 0, 0, err
	}
	var missing []string
	for _, id := range ids {
		if convs[id] == nil {
			missing = append(missing, id)
		}
	}
	loaded, _, err := fetchState(ctx, s.w.cfg.DB, missing, nil)
	if err != nil {
		return nil, 0, 0, err
	}
	for id, c := range loaded {
		convs[id] = c
	}
	s.log.Warn("FAULT: accepting without a takeover marker", "replayed_to", end)
	time.Sleep(faultAcceptDelay)
	return convs, n, end, nil
}
