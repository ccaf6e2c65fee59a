-- A record persist stores again (after a crash, or when migration 007 moved
-- its offsets back) found its conflict again and recorded it a second time:
-- seq_conflicts had no key. A record is one row, named by its log position;
-- persist now records a conflict only when its record has no row yet, and
-- this keeps the first row of each record seen twice.
DELETE FROM seq_conflicts a
USING seq_conflicts b
WHERE a.log_partition = b.log_partition AND a.log_offset = b.log_offset
  AND (a.seen_at, a.ctid) > (b.seen_at, b.ctid);

-- Not unique: a persist of an earlier version, still running while this is
-- applied, records a conflict it finds again a second time, as it did, and
-- does not fail the batch.
CREATE INDEX seq_conflicts_record ON seq_conflicts (log_partition, log_offset);
