package main

import (
	"time"

	"github.com/chatpipe/chatpipe/internal/link"
)

// wireFlags tune the gateway↔worker links (link.Config) and how long a
// gateway waits for one attempt at a worker.
type wireFlags struct {
	write, ping, read, call *time.Duration
	queue                   *int
	link                    *linkFlags
}

func addWireFlags(fs *flagSet) wireFlags {
	fs.check(positive("wire-write-timeout"), positive("wire-ping"), positive("call-timeout"),
		aboveFlag("wire-read-timeout", "wire-ping", ": a link is pinged before it can time out"),
		atLeast("wire-queue", 65))
	return wireFlags{
		write: fs.Duration("wire-write-timeout", link.DefaultWriteTimeout, "deadline of every write on a gateway↔worker link; a write that misses it closes the link"),
		ping:  fs.Duration("wire-ping", link.DefaultPingInterval, "how often a gateway pings each of its worker links"),
		read:  fs.Duration("wire-read-timeout", link.DefaultReadTimeout, "a gateway↔worker link on which nothing was read for this long is closed (keep it a few --wire-ping)"),
		call:  fs.Duration("call-timeout", 15*time.Second, "how long a gateway waits for one attempt at a worker; the worker drops a command still queued past it (answered unavailable, nothing written)"),
		link:  addLinkFlags(fs),
		queue: fs.Int("wire-queue", link.DefaultQueueLen, "answers a worker queues on one gateway link (a link whose queue is full is closed); a gateway keeps at most this less 64 requests in flight per link"),
	}
}

func (f wireFlags) config() link.Config {
	c := link.Config{WriteTimeout: *f.write, PingInterval: *f.ping, ReadTimeout: *f.read, QueueLen: *f.queue}
	f.link.apply(&c)
	return c
}
