//go:build chatpipe_faults

package projection

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// faultSleepBeforeCommit holds every Postgres transaction open before its
// commit, so that a kill in the fault tests lands in the middle of a batch.
// Compiled only with -tags chatpipe_faults.
var faultSleepBeforeCommit, _ = time.ParseDuration(os.Getenv("CHATPIPE_FAULT_PROJECTION_SLEEP_BEFORE_COMMIT"))

// faultHoldFile names a file that holds back batches: while it exists, a
// batch with a record of a partition it lists (partition numbers separated
// by spaces) waits before it is applied. A test uses it to make the
// projection apply one partition's records after another's, as a lagging
// group member would. Compiled only with -tags chatpipe_faults.
var faultHoldFile = os.Getenv("CHATPIPE_FAULT_PROJECTION_HOLD")

// faultHold waits while faultHoldFile holds back a partition of recs, or
// until ctx ends.
func (p *Projector) faultHold(ctx context.Context, recs []*kgo.Record) error {
	if faultHoldFile == "" {
		return nil
	}
	for logged := false; ; logged = true {
		b, err := os.ReadFile(faultHoldFile)
		if err != nil {
			return nil
		}
		held := slices.ContainsFunc(recs, func(r *kgo.Record) bool {
			return slices.Contains(strings.Fields(string(b)), strconv.Itoa(int(r.Partition)))
		})
		if !held {
			return nil
		}
		if !logged {
			p.cfg.Log.Warn("PLANTED FAULT: holding back a batch", "file", faultHoldFile, "partitions", strings.TrimSpace(string(b)), "records", len(recs))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
