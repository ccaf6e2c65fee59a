-- Records a consumer of the log can never write (a data exception such as a
-- NUL byte in a text field, a value past a Postgres limit, a record that is
-- not JSON): each is kept here, per consumer, in the same transaction as
-- that consumer's stored offset moving past it, so one bad record never
-- stops a partition. Listed by `chatpipe admin dead-letters`.
CREATE TABLE dead_letters (
    consumer        text        NOT NULL,
    topic           text        NOT NULL,
    log_partition   integer     NOT NULL,
    log_offset      bigint      NOT NULL,
    -- The event's place, if the record decodes: a writer loading the
    -- conversation from Postgres must not hand this seq out again.
    conversation_id text,
    seq             bigint,
    sqlstate        text,
    error           text        NOT NULL,
    record_key      bytea,
    record_value    bytea,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, log_partition, log_offset)
);
CREATE INDEX dead_letters_conversation ON dead_letters (conversation_id, seq) WHERE conversation_id IS NOT NULL;
