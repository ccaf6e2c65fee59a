package gateway

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/chatpipe/chatpipe/protocol"
)

// The gateway's counters and Prometheus metrics.

// opMetrics are one op's series of the commands counter (accepted) and
// of the latency histogram.
type opMetrics struct {
	accepted prometheus.Counter
	latency  prometheus.Observer
}

// ops are the op label's values (opLabel).
var ops = []string{protocol.OpCreate, protocol.OpJoin, protocol.OpKick, protocol.OpLeave, protocol.OpSend,
	protocol.OpSync, protocol.OpHistory, protocol.OpConversations, protocol.OpRead, protocol.OpRefresh, "invalid"}

// Results of chatpipe_gateway_commands_total.
const (
	resultAccepted    = "accepted"
	resultRejected    = "rejected"
	resultUnavailable = "unavailable"
)

// opLabel is the op label of a frame: its op when the frame decoded to a
// known one, else "invalid" (a client cannot add label values).
func (g *Gateway) opLabel(req *protocol.Request) string {
	if req != nil {
		if _, ok := g.byOp[req.Op]; ok {
			return req.Op
		}
	}
	return "invalid"
}

// count counts a frame's answer in chatpipe_gateway_commands_total; code
// is the rejection code ("" when accepted).
func (g *Gateway) count(op string, code protocol.Code) {
	if code == "" {
		g.byOp[op].accepted.Inc()
		return
	}
	result := resultRejected
	if code == protocol.CodeUnavailable {
		result = resultUnavailable
	}
	g.commands.WithLabelValues(op, result, string(code)).Inc()
}

// observe records the time since start, when a frame of op was read, in
// chatpipe_gateway_command_seconds.
func (g *Gateway) observe(op string, start time.Time) {
	g.byOp[op].latency.Observe(time.Since(start).Seconds())
}

// replyCode is a reply's rejection code, "" when it was accepted.
func replyCode(rep *protocol.Reply) protocol.Code {
	if rep.Op == protocol.OpAccepted {
		return ""
	}
	return rep.Code
}

// Unowned returns how many vshards have no live owner in the gateway's
// view: commands for them wait, then answer unavailable.
func (g *Gateway) Unowned() int {
	n := 0
	for s := 0; s < g.cfg.VShards+g.cfg.Dedicated; s++ {
		if _, _, ok := g.cfg.Owners.Route(s); !ok {
			n++
		}
	}
	return n
}

// Stats returns the counters.
func (g *Gateway) Stats() *Stats { return &g.stats }

// Collectors returns the gateway's Prometheus metrics.
func (g *Gateway) Collectors() []prometheus.Collector {
	counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "chatpipe_gateway_connections", Help: "Open websocket connections."},
			func() float64 { return float64(g.stats.Connections.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "chatpipe_gateway_unowned_vshards", Help: "Vshards without a live owner in this gateway's view of etcd."},
			func() float64 { return float64(g.Unowned()) }),
		counter("chatpipe_gateway_unauthorized_total", "Upgrades refused with 401.", &g.stats.Unauthorized),
		counter("chatpipe_gateway_slow_readers_closed_total", "Connections closed with 1008 because their send buffer stayed full.", &g.slowClosed),
		counter("chatpipe_gateway_backlogs_total", "Times pushes found a connection's send buffer full and the session read them back from the read model instead.", &g.backlogged),
		counter("chatpipe_gateway_read_your_writes_timeouts_total", "Reads answered unavailable because the read model did not include the session's own write in time.", &g.rywTimeouts),
		counter("chatpipe_gateway_ws_messages_total", "Websocket messages written to devices, each one flush (a batching connection's message carries several frames).", &g.wsMessages),
		counter("chatpipe_gateway_ws_frames_total", "Frames written to devices in those messages: answers, events, read markers.", &g.wsFrames),
		g.commands,
		g.latency,
	}
}
