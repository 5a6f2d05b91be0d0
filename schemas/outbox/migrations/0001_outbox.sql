-- The transactional outbox: one row per event, written in the same transaction
-- as the state change it describes. Any language may insert with plain SQL; the
-- CHECK constraints hold every row to the envelope contract (schemas/json).
CREATE TABLE IF NOT EXISTS outbox (
    id            bigserial   PRIMARY KEY,   -- scan order for the relay only, never event order
    topic         text        NOT NULL CHECK (char_length(topic) BETWEEN 1 AND 249),
    entity_type   text        NOT NULL CHECK (entity_type ~ '^[a-z][a-z0-9_]{0,62}$'),
    entity_id     text        NOT NULL CHECK (char_length(entity_id) BETWEEN 1 AND 256),
    generation    bigint      NOT NULL DEFAULT 1 CHECK (generation >= 1),
    seq           bigint      NOT NULL CHECK (seq >= 1),
    event_type    text        NOT NULL CHECK (char_length(event_type) <= 128
                                  AND event_type ~ '^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$'),
    event_id      text        NOT NULL CHECK (char_length(event_id) BETWEEN 1 AND 256),
    payload       jsonb       NOT NULL CHECK (jsonb_typeof(payload) = 'object'),
    headers       jsonb       NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(headers) = 'object'),
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz,               -- null until Kafka acknowledged delivery
    publish_count integer     NOT NULL DEFAULT 0,
    failed_at     timestamptz,               -- set by the relay when the row cannot be sent
    failure_reason text,
    CONSTRAINT outbox_event_id_key UNIQUE (event_id),
    CONSTRAINT outbox_entity_seq_key UNIQUE (entity_type, entity_id, generation, seq)
);

-- The relay claims pending rows in id order; this index holds only those.
CREATE INDEX IF NOT EXISTS outbox_pending_idx ON outbox (id)
    WHERE published_at IS NULL AND failed_at IS NULL;

-- Retention deletes the oldest published rows first.
CREATE INDEX IF NOT EXISTS outbox_published_at_idx ON outbox (published_at)
    WHERE published_at IS NOT NULL;

-- Wake the relay when rows commit, instead of it polling. One notification per
-- statement (PostgreSQL folds identical ones within a transaction).
CREATE OR REPLACE FUNCTION inorder_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('inorder_outbox', TG_TABLE_SCHEMA);
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS outbox_notify ON outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION inorder_outbox_notify();
