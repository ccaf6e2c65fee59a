-- A moved record of log schema v4 carries the verdicts its writer still
-- remembered for the conversation's keys (answers of keyed commands that
-- wrote nothing), as the record's JSON array. The writer the conversation
-- moves to reads them with the moved event and answers another attempt of
-- such a key the same.
ALTER TABLE events ADD COLUMN verdicts jsonb;
