-- persist applies the read model (memberships, conversations, read markers,
-- the delivery outbox) in the transaction that stores a batch's events; the
-- projection consumer that did it apart is gone. persist resumes each
-- partition where the projection had stopped, if that is earlier, so that
-- every record the projection had not applied is applied (persist skips the
-- event rows it stored already; the read model's changes are idempotent).
-- A partition persist stored that the projection never reached, where the
-- projection ran at all, is read again from the start. Upgrade with persist
-- and the projection both stopped (docs/operations.md).
UPDATE consumer_offsets p
SET next_offset = j.next_offset, updated_at = now()
FROM consumer_offsets j
WHERE p.consumer = 'persist' AND j.consumer = 'projection'
  AND j.topic = p.topic AND j.log_partition = p.log_partition
  AND j.next_offset < p.next_offset;

DELETE FROM consumer_offsets p
WHERE p.consumer = 'persist'
  AND EXISTS (SELECT 1 FROM consumer_offsets j WHERE j.consumer = 'projection' AND j.topic = p.topic)
  AND NOT EXISTS (SELECT 1 FROM consumer_offsets j
                  WHERE j.consumer = 'projection' AND j.topic = p.topic AND j.log_partition = p.log_partition);

DELETE FROM consumer_offsets WHERE consumer = 'projection';
