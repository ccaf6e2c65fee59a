package main

import (
	"time"

	"github.com/chatpipe/chatpipe/gateway"
	"github.com/chatpipe/chatpipe/internal/shardcore"
	"github.com/chatpipe/chatpipe/protocol"
	"github.com/chatpipe/chatpipe/shardworker"
)

// frameRoom is how many bytes a websocket frame needs besides a message
// body: the JSON of a send command around it (op, ids, conversation).
const frameRoom = 1024

// limitFlags are the abuse limits; every default is safe for the internet.
type limitFlags struct {
	userRate, convRate                  *float64
	userBurst, convBurst, maxConns      *int
	frame, body, idBytes, members, sbuf *int
	syncMax, maxConvs                   *int
	origins                             *string
	ping, dedupeMemory, ryw, refusals   *time.Duration
	slowReader                          *time.Duration
	dedupeKeep                          *int
	commit                              commitFlags
	wire                                wireFlags
}

func addLimitFlags(fs *flagSet) limitFlags {
	d := protocol.DefaultLimits()
	fs.check(
		nonZero("rate-user", "no limit"), atLeast("rate-user-burst", 1),
		nonZero("rate-conv", "no limit"), atLeast("rate-conv-burst", 1),
		atLeast("max-conns-per-user", 1), atLeast("max-body-bytes", 1), atLeast("max-id-bytes", 1),
		notBelowFlag("max-frame-bytes", "max-body-bytes", frameRoom, ": a send frame holds the body and its JSON envelope"),
		atLeast("max-members", 2), atLeast("send-buffer", 1), nonZero("max-convs-per-user", "no cap"),
		atLeast("sync-max", 1), positive("ping-interval"), positive("slow-reader"), nonZero("read-your-writes", "no wait"),
		atLeast("dedupe-keep", 1), positive("dedupe-memory"), positive("refusal-memory"))
	return limitFlags{
		userRate:  fs.Float64("rate-user", 20, "commands/s per user on a gateway (negative: no limit)"),
		userBurst: fs.Int("rate-user-burst", 40, "burst of the per-user command limit"),
		convRate:  fs.Float64("rate-conv", 100, "messages/s per conversation, enforced by its writer (negative: no limit)"),
		convBurst: fs.Int("rate-conv-burst", 200, "burst of the per-conversation message limit"),
		maxConns:  fs.Int("max-conns-per-user", 16, "open websockets per user on a gateway"),
		frame:     fs.Int("max-frame-bytes", d.MaxFrameBytes, "largest websocket frame; a larger one closes the connection with 1009"),
		body:      fs.Int("max-body-bytes", d.MaxBodyBytes, "largest message body (bytes of UTF-8)"),
		idBytes:   fs.Int("max-id-bytes", d.MaxIDBytes, "longest id ([A-Za-z0-9._:-])"),
		members:   fs.Int("max-members", d.MaxMembers, "members per conversation, owner included"),
		sbuf:      fs.Int("send-buffer", 1024, "frames queued per connection; pushes that find it full are read back from Postgres as it drains"),
		slowReader: fs.Duration("slow-reader", 10*time.Second,
			"how long a frame waits for room in a connection's full send buffer before the connection is closed with 1008"),
		maxConvs: fs.Int("max-convs-per-user", 5000, "conversations a user may be in; create/join beyond it answers too_large (negative: no cap)"),
		syncMax:  fs.Int("sync-max", 500, "events in one sync reply; more are sent after another sync (synced says more:true)"),
		origins:  fs.String("allowed-origins", "", "browser origins allowed besides the gateway's own host (comma separated host patterns)"),
		ping:     fs.Duration("ping-interval", 30*time.Second, "websocket ping period; a peer that misses a pong is closed"),
		ryw: fs.Duration("read-your-writes", 2*time.Second,
			"how long a session's history/sync/conversations waits for the read model to include that session's own accepted writes before answering unavailable (negative: no wait)"),
		dedupeKeep: fs.Int("dedupe-keep", shardworker.DefaultDedupeKeep,
			"stored send results a writer keeps in memory per conversation; older retries are answered from Postgres"),
		dedupeMemory: fs.Duration("dedupe-memory", shardworker.DefaultDedupeMemory,
			"how long a writer keeps a stored send's result in memory; older retries are answered from Postgres"),
		refusals: fs.Duration("refusal-memory", shardworker.DefaultRefusalMemory,
			"how long a writer answers other attempts of a rejected keyed command with the same rejection (keep it well above --call-timeout: an attempt can be in flight that long)"),
		commit: addCommitFlags(fs),
		wire:   addWireFlags(fs),
	}
}

func (l limitFlags) protocol() protocol.Limits {
	d := protocol.DefaultLimits()
	d.MaxFrameBytes, d.MaxBodyBytes, d.MaxIDBytes, d.MaxMembers = *l.frame, *l.body, *l.idBytes, *l.members
	return d
}

func (l limitFlags) gateway(c *gateway.Config) {
	c.Limits = l.protocol()
	c.UserRate, c.UserBurst, c.MaxConnsPerUser = *l.userRate, *l.userBurst, *l.maxConns
	c.OriginPatterns = splitList(*l.origins)
	c.PingInterval, c.SendBuffer, c.SyncMax, c.MaxConvsPerUser = *l.ping, *l.sbuf, *l.syncMax, *l.maxConvs
	c.Wire, c.CallTimeout = l.wire.config(), *l.wire.call
	c.ReadYourWrites = *l.ryw
	c.SlowReader = *l.slowReader
}

func (l limitFlags) worker(c *shardworker.Config) {
	c.Limits = shardcore.Limits{MaxMembers: *l.members}
	c.Protocol = l.protocol()
	c.ConvRate, c.ConvBurst = *l.convRate, *l.convBurst
	c.DedupeKeep, c.DedupeMemory, c.RefusalMemory = *l.dedupeKeep, *l.dedupeMemory, *l.refusals
	l.commit.worker(c)
	c.Wire = l.wire.config()
}
