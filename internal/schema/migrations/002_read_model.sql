-- The read model, maintained by the projection consumer exactly once (its
-- offsets live in consumer_offsets under consumer 'projection', written in
-- the same transaction as these rows).

-- Membership periods: a user is a member of a conversation from joined_seq
-- (the create or join event) through left_seq (the kick or leave event,
-- inclusive: a removed user still receives and may read their removal).
-- A user who rejoins has one row per period.
CREATE TABLE memberships (
    conversation_id text   NOT NULL,
    user_id         text   NOT NULL,
    joined_seq      bigint NOT NULL,
    left_seq        bigint,
    PRIMARY KEY (conversation_id, user_id, joined_seq)
);
CREATE INDEX memberships_user ON memberships (user_id, conversation_id);

-- One row per conversation: how far the projection has applied it. sync and
-- history never read past last_seq, so what they return agrees with the
-- membership periods above.
CREATE TABLE conversations (
    conversation_id  text        PRIMARY KEY,
    last_seq         bigint      NOT NULL,
    last_activity_at timestamptz NOT NULL
);

-- Delivery: one row per projection batch, naming each conversation's seq
-- range it made visible. Ids come from delivery_counter, whose single row is
-- locked until the projection's transaction commits, so ids are gap-free and
-- become visible in id order: a gateway that has read up to id n and then
-- sees n+2 but not n+1 cannot happen.
CREATE TABLE delivery_outbox (
    id               bigint      PRIMARY KEY,
    conversation_ids text[]      NOT NULL,
    from_seqs        bigint[]    NOT NULL,
    to_seqs          bigint[]    NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE delivery_counter (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    last_id   bigint  NOT NULL
);
INSERT INTO delivery_counter (singleton, last_id) VALUES (true, 0);
