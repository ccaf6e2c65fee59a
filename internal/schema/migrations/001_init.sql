-- Every committed event of the log, exactly once. The log (chatpipe.log) is
-- the source of truth; this table is its queryable copy.
CREATE TABLE events (
    conversation_id   text        NOT NULL,
    seq               bigint      NOT NULL,
    kind              text        NOT NULL,
    message_id        text        NOT NULL,
    client_message_id text,
    sender            text        NOT NULL,
    body              text,
    user_id           text,
    members           text[],
    created_at        timestamptz NOT NULL,
    vshard            integer     NOT NULL,
    epoch             bigint      NOT NULL,
    log_partition     integer     NOT NULL,
    log_offset        bigint      NOT NULL,
    PRIMARY KEY (conversation_id, seq)
);

-- Dedupe: one message per (conversation, client_message_id).
CREATE UNIQUE INDEX events_client_message_id
    ON events (conversation_id, client_message_id)
    WHERE client_message_id IS NOT NULL;

-- Membership events, read when a writer loads a conversation.
CREATE INDEX events_membership ON events (conversation_id, seq) WHERE kind <> 'message';

-- Consumers of the log keep their next offset here, written in the same
-- transaction as the rows they produce.
CREATE TABLE consumer_offsets (
    consumer      text        NOT NULL,
    topic         text        NOT NULL,
    log_partition integer     NOT NULL,
    next_offset   bigint      NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, log_partition)
);

-- A record whose (conversation_id, seq) or (conversation_id,
-- client_message_id) is taken by a different message: a broken invariant.
-- Never overwritten; kept here for operators.
CREATE TABLE seq_conflicts (
    conversation_id     text        NOT NULL,
    seq                 bigint      NOT NULL,
    existing_message_id text,
    incoming_message_id text        NOT NULL,
    log_partition       integer     NOT NULL,
    log_offset          bigint      NOT NULL,
    seen_at             timestamptz NOT NULL DEFAULT now()
);
