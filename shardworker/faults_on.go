//go:build chatpipe_faults

package shardworker

import (
	"os"
	"time"
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
