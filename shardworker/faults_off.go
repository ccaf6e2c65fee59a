//go:build !chatpipe_faults

package shardworker

import "time"

// Without the chatpipe_faults build tag every fault point is off and
// compiled away.
const (
	faultSleepBeforeCommit  time.Duration = 0
	faultAcceptBeforeMarker               = false
	faultAcceptDelay        time.Duration = 0
)

func markCommit() {}
