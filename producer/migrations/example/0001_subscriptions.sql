-- The example subscription service's own tables. Each entity row carries the
-- version columns the outbox pattern needs: version (the entity's seq, bumped
-- by every change) and generation (bumped when the id is re-created).
CREATE TABLE IF NOT EXISTS subscriptions (
    id          text        PRIMARY KEY,
    generation  bigint      NOT NULL DEFAULT 1,
    version     bigint      NOT NULL DEFAULT 1,
    deleted     boolean     NOT NULL DEFAULT false,
    plan        text        NOT NULL,
    price_cents integer     NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS seat_ledgers (
    id          text        PRIMARY KEY,
    generation  bigint      NOT NULL DEFAULT 1,
    version     bigint      NOT NULL DEFAULT 1,
    deleted     boolean     NOT NULL DEFAULT false,
    seats       integer     NOT NULL CHECK (seats >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
