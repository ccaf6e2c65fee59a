package main

import (
	"time"

	"github.com/chatpipe/chatpipe/shardworker"
)

// commitFlags tune the shard writers: their adaptive group commit
// (internal/shardcore/groupcommit.go), and how many take over at once.
type commitFlags struct {
	lingerMax *time.Duration
	txnBudget *float64
	takeovers *int
}

func addCommitFlags(fs *flagSet) commitFlags {
	fs.check(positive("txn-budget"), positive("max-takeovers"))
	return commitFlags{
		lingerMax: fs.Duration("linger-max", shardworker.DefaultLingerMax, "latency budget of the adaptive group commit: the longest a writer waits for its batch to fill (0: never wait)"),
		takeovers: fs.Int("max-takeovers", shardworker.DefaultMaxTakeovers, "vshards a worker takes over at once; the rest of a cold start's or a failover's vshards wait their turn"),
		txnBudget: fs.Float64("txn-budget", shardworker.DefaultTxnBudget, "Kafka transactions/s a worker aims to stay under, shared by its vshards; a writer lingers (up to --linger-max) once its commands arrive faster than its share"),
	}
}

func (f commitFlags) worker(c *shardworker.Config) {
	c.LingerMax, c.TxnBudget, c.MaxTakeovers = *f.lingerMax, *f.txnBudget, *f.takeovers
	if c.LingerMax <= 0 {
		c.LingerMax = -1 // in Config, 0 means the default; a flag of 0 means never
	}
}
