// Package loadgen drives a running chatpipe stack over real websockets with
// an open-loop, constant arrival rate and records what it saw.
//
// A run creates its own users and conversations (1:1 and groups of up to
// 100 members), connects several devices per user, and sends messages on a
// fixed schedule: message k is due at start + k/rate whatever the servers
// answer, so a slow server shows up as latency instead of a lower offered
// rate (no coordinated omission). Latency is measured from the due time.
// `unavailable`, `rate_limited` and timeouts are re-sent with the same ids
// after retry_after_ms plus full-jitter exponential backoff, within a
// budget (a share of the first attempts) and an attempt limit, and counted
// apart from the offered load; some sends are deliberately duplicated from
// a second device, and some members leave or are kicked (then re-added)
// while messages flow. A run may be one shard of a plan (Shard, ShardPlan);
// Merge combines shards' run directories into one.
//
// Everything the run saw goes into its run directory: every accepted answer
// (accepted.jsonl), every final rejection (rejected.jsonl), every event
// delivered to every device (delivered.jsonl), the plan and the stack's
// endpoints (run.json), the counters no stream holds (counters.json), and
// at the end report.json, report.md and plot.svg — whose totals are read
// back from those files, so a run that failed in a later phase still
// reports what it did. Files
// other than the append-only record streams are written to a temp name
// beside the target and renamed into place; runs.ledger beside the run
// directories records each run (started, finished, failed, died — with the
// phase where it stopped). The loadcheck package (tools/loadcheck) verifies a run directory
// against the world.
package loadgen
