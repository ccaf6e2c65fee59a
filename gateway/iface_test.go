package gateway

import (
	"github.com/chatpipe/chatpipe/lease"
)

// The production types satisfy the gateway's interfaces.
var _ Owners = (*lease.Watcher)(nil)
