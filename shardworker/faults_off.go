//go:build !chatpipe_faults

package shardworker

import (
	"errors"
	"time"

	"github.com/chatpipe/chatpipe/shardcore"
)

// Without the chatpipe_faults build tag every fault point is off and
// compiled away.
const (
	faultSleepBeforeCommit  time.Duration = 0
	faultAcceptBeforeMarker               = false
	faultAcceptDelay        time.Duration = 0
)

func markCommit() {}

// replayWithoutMarker exists only in fault-test builds.
func (s *shard) replayWithoutMarker() (map[string]*shardcore.Conv, int, int64, error) {
	return nil, 0, 0, errors.New("shardworker: fault points are not compiled in")
}
