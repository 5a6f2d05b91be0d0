-- Each event the consumer wrote to the held topic, and where it put it. `held replay`
-- sends back exactly these copies, read at their offsets, each once: anything else in
-- the held topic (written by another client) is never replayed. A replay interrupted
-- midway leaves 'replaying', and the next replay of the entity takes it up again.
CREATE TABLE IF NOT EXISTS inorder_held_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    route       text        NOT NULL,
    entity_id   text        NOT NULL,
    generation  bigint      NOT NULL,
    seq         bigint      NOT NULL,
    event_id    text        NOT NULL,
    held_topic  text        NOT NULL,
    held_partition integer  NOT NULL,
    held_offset bigint      NOT NULL,
    held_at     timestamptz NOT NULL DEFAULT now(),
    status      text        NOT NULL DEFAULT 'held'
        CHECK (status IN ('held', 'replaying', 'replayed')),
    replayed_at timestamptz,
    replayed_by text,
    UNIQUE (held_topic, held_partition, held_offset)
);
CREATE INDEX IF NOT EXISTS inorder_held_events_waiting
    ON inorder_held_events (route, entity_id) WHERE status <> 'replayed';
