// Package shardcore is the shard writer's decision core: membership checks,
// dedupe by (conversation_id, client_message_id) and the next seq of a
// conversation. It is pure and deterministic: no I/O, no clock, no goroutines.
//
// Decide looks at a conversation's state and a command and returns what to do
// without changing anything. Apply is the only way state changes; the live
// path applies the events it is about to commit, and replay applies the events
// it reads back from the committed log, so the two cannot drift. When a commit
// fails or its outcome is unknown, the driver throws the state away and
// replays: the log is the truth.
//
// Decide requires that the driver has resolved dedupe for the command first:
// the conversation's Dedupe map must hold the command's client_message_id if
// the durable state has it (see NeedsDedupeLookup: a conversation loaded
// with its filter of known keys, Conv.Known, needs no lookup for a key the
// filter rules out). An answer that wrote
// nothing and is final for its key (a rejection, or a join of a current
// member: Decision.Keep) leaves no trace in the log; a driver that
// remembers it as the key's Verdict passes it to DecideWith, so that the
// key's other attempts get it again.
package shardcore
