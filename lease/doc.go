// Package lease keeps shard ownership in etcd (docs/operations.md,
// "Ownership"; the keys are in keys.go): the deployment's fixed config, one
// lease per worker with a single keep-alive for all its shards, one owner row
// per virtual shard changed only by compare-and-swap with epoch+1, a watched
// view of those rows, and an elected coordinator that spreads shards over
// live workers.
//
// A lease is not a lock. The owner row's revision and Kafka's producer epoch
// for the shard's transactional.id are the fences; the lease only decides
// who should be the writer.
package lease
