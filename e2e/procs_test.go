package e2e

import (
	"fmt"
	"time"
)

// shortLease is the environment of a worker that a fault test kills,
// pauses or cuts off from etcd to have its lease run out (not
// TestStarvedKeepAlive's, whose point is the margin): its lease lives shortTTL
// (--lease-ttl), not the default 10 s, so what the test waits for comes
// sooner. The worker still stops accepting a margin (1 s) before the
// lease's local deadline, and a new owner still fences what the old one
// left open.
var shortLease = fmt.Sprintf("CHATPIPE_LEASE_TTL=%d", int(shortTTL/time.Second))

// shortTTL is the lease of the workers started with shortLease.
const shortTTL = 4 * time.Second
