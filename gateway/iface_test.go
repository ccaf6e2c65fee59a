package gateway

import (
	"github.com/chatpipe/chatpipe/delivery"
	"github.com/chatpipe/chatpipe/lease"
	"github.com/chatpipe/chatpipe/wire"
)

// The production types satisfy the gateway's interfaces.
var _ Owners = (*lease.Watcher)(nil)

var _ Link = (*wire.Client)(nil)

var _ ReadModel = (*delivery.Store)(nil)
