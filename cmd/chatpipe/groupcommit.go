package main

import (
	"flag"
	"time"

	"github.com/chatpipe/chatpipe/shardworker"
)

// commitFlags tune the shard writers' adaptive group commit
// (shardcore/groupcommit.go).
type commitFlags struct {
	lingerMax *time.Duration
	txnBudget *float64
}

func addCommitFlags(fs *flag.FlagSet) commitFlags {
	checkFlags(fs, positive("txn-budget"))
	return commitFlags{
		lingerMax: fs.Duration("linger-max", shardworker.DefaultLingerMax, "latency budget of the adaptive group commit: the longest a writer waits for its batch to fill (0: never wait)"),
		txnBudget: fs.Float64("txn-budget", shardworker.DefaultTxnBudget, "Kafka transactions/s a worker aims to stay under, shared by its vshards; a writer lingers (up to --linger-max) once its commands arrive faster than its share"),
	}
}

func (f commitFlags) worker(c *shardworker.Config) {
	c.LingerMax, c.TxnBudget = *f.lingerMax, *f.txnBudget
	if c.LingerMax <= 0 {
		c.LingerMax = -1 // in Config, 0 means the default; a flag of 0 means never
	}
}
