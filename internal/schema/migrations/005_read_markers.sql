-- Read markers (log schema v3): a user has read a conversation up to
-- read_seq. The projection keeps the highest one recorded in the log, so
-- a marker never moves back, and names every marker it moved forward in
-- the batch's delivery row so that gateways push it to the user's devices.
CREATE TABLE read_markers (
    conversation_id text        NOT NULL,
    user_id         text        NOT NULL,
    read_seq        bigint      NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, conversation_id)
);

ALTER TABLE delivery_outbox
    ADD COLUMN read_conversation_ids text[]   NOT NULL DEFAULT '{}',
    ADD COLUMN read_user_ids         text[]   NOT NULL DEFAULT '{}',
    ADD COLUMN read_seqs             bigint[] NOT NULL DEFAULT '{}';
