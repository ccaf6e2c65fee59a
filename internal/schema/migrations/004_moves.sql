-- A moved event (log schema v2) ends a conversation's stay in a vshard:
-- to_vshard is the vshard that writes its next events. A writer loading a
-- conversation reads it with the other non-message events.
ALTER TABLE events ADD COLUMN to_vshard integer;
