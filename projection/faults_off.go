//go:build !chatpipe_faults

package projection

import "time"

// Without the chatpipe_faults build tag the fault point is off.
const faultSleepBeforeCommit time.Duration = 0
