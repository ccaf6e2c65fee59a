package logsink

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Stored offsets: reading them, writing them in the batch's transaction,
// and that transaction's one round trip.

// Offsets reads a consumer's stored next offset of each partition of topic.
func Offsets(ctx context.Context, q Querier, consumer, topic string) (map[int32]int64, error) {
	rows, err := q.Query(ctx, `SELECT log_partition, next_offset FROM consumer_offsets WHERE consumer = $1 AND topic = $2`, consumer, topic)
	if err != nil {
		return nil, fmt.Errorf("read %s offsets: %w", consumer, err)
	}
	out := map[int32]int64{}
	var part int32
	var off int64
	if _, err := pgx.ForEachRow(rows, []any{&part, &off}, func() error { out[part] = off; return nil }); err != nil {
		return nil, fmt.Errorf("read %s offsets: %w", consumer, err)
	}
	return out, nil
}

// StoredOffset is one row of consumer_offsets.
type StoredOffset struct {
	Consumer   string
	Partition  int32
	NextOffset int64
	UpdatedAt  time.Time
}

// AllOffsets reads every consumer's stored offsets of topic, ordered by
// consumer and partition.
func AllOffsets(ctx context.Context, q Querier, topic string) ([]StoredOffset, error) {
	rows, err := q.Query(ctx, `SELECT consumer, log_partition, next_offset, updated_at FROM consumer_offsets WHERE topic = $1 ORDER BY consumer, log_partition`, topic)
	if err != nil {
		return nil, fmt.Errorf("read consumer offsets: %w", err)
	}
	var out []StoredOffset
	var o StoredOffset
	if _, err := pgx.ForEachRow(rows, []any{&o.Consumer, &o.Partition, &o.NextOffset, &o.UpdatedAt}, func() error { out = append(out, o); return nil }); err != nil {
		return nil, fmt.Errorf("read consumer offsets: %w", err)
	}
	return out, nil
}

// storeOffsetsSQL moves a consumer's stored next offsets forward, never
// back: $3 and $4 are the partitions and their next offsets.
//
// It is the first statement of every transaction that writes a
// consumer's records (a batch, a dead letter), and it locks the rows it
// upserts, in partition order, until the commit: an existing row by its
// update, a missing one by its insert, which another transaction's
// uncommitted insert of the same key makes wait for that transaction. Two
// members of a group can write one partition at once for a while (one was
// dropped from the group for a slow batch and is still writing it).
// Without the lock the second one's statements would run on a snapshot
// that misses the first one's rows while its inserts wait for them, and
// persist would record its replay as a seq conflict. With it, the second
// batch waits for the first to commit and then sees its rows, whether or
// not the partition had a stored offset before (a SELECT … FOR UPDATE
// would lock only rows that exist, and so not a partition's first batch).
const storeOffsetsSQL = `INSERT INTO consumer_offsets (consumer, topic, log_partition, next_offset)
		SELECT $1, $2, p, o FROM unnest($3::int[], $4::bigint[]) AS t(p, o) ORDER BY p
		ON CONFLICT (consumer, topic, log_partition) DO UPDATE
		SET next_offset = GREATEST(consumer_offsets.next_offset, EXCLUDED.next_offset), updated_at = now()`

// storeOffsets records, inside tx, the next offset of each partition the
// records came from. Offsets only move forward.
func storeOffsets(ctx context.Context, tx pgx.Tx, consumer, topic string, recs []*kgo.Record) error {
	parts, offs := nextOffsetArrays(recs)
	if _, err := tx.Exec(ctx, storeOffsetsSQL, consumer, topic, parts, offs); err != nil {
		return fmt.Errorf("store %s offsets: %w", consumer, err)
	}
	return nil
}

// queueOffsets queues on b the statement storeOffsets runs, so that it goes
// to Postgres with the rest of a batch (see commit), ahead of the batch's
// other statements (see storeOffsetsSQL); read its result with execOffsets.
// parts and offs are nextOffsetArrays of the batch's records.
func queueOffsets(b *pgx.Batch, consumer, topic string, parts []int32, offs []int64) {
	b.Queue(storeOffsetsSQL, consumer, topic, parts, offs)
}

// execOffsets reads the result of the statement queueOffsets queued, which
// must be the next result of br.
func execOffsets(br pgx.BatchResults, consumer string) error {
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("store %s offsets: %w", consumer, err)
	}
	return nil
}

// nextOffsetArrays is, per partition of recs, the offset after its last
// record, as the two arrays storeOffsetsSQL takes.
// recs are in offset order per partition, usually of one partition or few,
// so a short scan finds a partition's slot without a map.
func nextOffsetArrays(recs []*kgo.Record) ([]int32, []int64) {
	var parts []int32
	var offs []int64
	for _, r := range recs {
		i := len(parts) - 1
		for i >= 0 && parts[i] != r.Partition {
			i--
		}
		if i < 0 {
			parts, offs = append(parts, r.Partition), append(offs, 0)
			i = len(parts) - 1
		}
		offs[i] = r.Offset + 1
	}
	return parts, offs
}

// commit runs the statements queued on b as one Postgres transaction, in
// one round trip, and gives their results to read, which must read them in
// order and return the first error. Nothing of b is written unless all of
// it is.
//
// pgx sends a batch as one pipeline ended by a single Sync, and Postgres
// runs the statements of a pipeline up to its Sync as one implicit
// transaction: committed at the Sync if every statement succeeded, rolled
// back (and the statements after a failed one skipped) otherwise. So b must
// not hold BEGIN, COMMIT or a statement that cannot run in a transaction.
// The server commits whatever the client does with the results, so read
// must not fail on results that are fine: an error it makes up is returned
// after the commit (a replay of the records must then be harmless, as it
// must be for a lost connection during a commit anyway).
//
// hold > 0 (fault tests only) runs b in an explicit transaction instead and
// holds it open that long before its commit, so that a kill lands inside it.
func commit(ctx context.Context, db DB, b *pgx.Batch, hold time.Duration, read func(br pgx.BatchResults) error) error {
	if hold > 0 {
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if err := readBatch(tx.SendBatch(ctx, b), read); err != nil {
				return err
			}
			time.Sleep(hold)
			return nil
		})
	}
	return readBatch(db.SendBatch(ctx, b), read)
}

// readBatch reads br with read and closes it; the first error wins.
func readBatch(br pgx.BatchResults, read func(br pgx.BatchResults) error) error {
	err := read(br)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("batch: %w", cerr)
	}
	return err
}
