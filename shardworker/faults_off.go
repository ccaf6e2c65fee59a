//go:build !chatpipe_faults

package shardworker

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Without the chatpipe_faults build tag every fault point is off and
// compiled away.
const (
	faultSleepBeforeCommit  time.Duration = 0
	faultAcceptBeforeMarker               = false
	faultAcceptDelay        time.Duration = 0
	faultRecommitAfterAbort               = false
	faultLoaderSlow         time.Duration = 0
)

func markCommit() {}

func holdCommit() {}

// noteMergedLoads and faultPump do nothing without the fault points.
func noteMergedLoads([]*loadReq) {}

func (l *loader) faultPump() {}

// partitionEnd, vshardConversations and recommitAfterAbort exist only in
// fault-test builds.
func (s *shard) recommitAfterAbort([]*kgo.Record) error {
	return errors.New("shardworker: fault points are not compiled in")
}

func (s *shard) partitionEnd(context.Context) (int64, error) {
	return 0, errors.New("shardworker: fault points are not compiled in")
}

func (s *shard) vshardConversations(context.Context) ([]string, error) {
	return nil, errors.New("shardworker: fault points are not compiled in")
}
