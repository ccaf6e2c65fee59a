//go:build !chatpipe_faults

package projection

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Without the chatpipe_faults build tag the fault points are off.
const faultSleepBeforeCommit time.Duration = 0

func (p *Projector) faultHold(context.Context, []*kgo.Record) error { return nil }
