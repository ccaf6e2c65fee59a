//go:build chatpipe_faults

package main

import (
	"os"
	"strconv"
	"time"
)

// exportBeforeRename holds chunk CHATPIPE_FAULT_EXPORT_STALL_CHUNK written
// but not renamed for a minute, so a test can kill the export mid-chunk.
// Compiled only with -tags chatpipe_faults.
var exportBeforeRename = func(chunk int) {
	if s := os.Getenv("CHATPIPE_FAULT_EXPORT_STALL_CHUNK"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n == chunk {
			os.WriteFile(os.Getenv("CHATPIPE_FAULT_EXPORT_STALL_MARK"), nil, 0o644)
			time.Sleep(time.Minute)
		}
	}
}
