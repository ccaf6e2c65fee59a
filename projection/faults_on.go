//go:build chatpipe_faults

package projection

import (
	"os"
	"time"
)

// faultSleepBeforeCommit holds every Postgres transaction open before its
// commit, so that a kill in the fault tests lands in the middle of a batch.
// Compiled only with -tags chatpipe_faults.
var faultSleepBeforeCommit, _ = time.ParseDuration(os.Getenv("CHATPIPE_FAULT_PROJECTION_SLEEP_BEFORE_COMMIT"))
