"""The consumer's own tables: step progress, step log, skips, external-call attempts, gaps.

Created at start-up when missing (``CREATE ... IF NOT EXISTS`` under an advisory lock),
in the schema the connection's search path names.
"""

from __future__ import annotations

from typing import Any

import psycopg

DDL = """
CREATE TABLE IF NOT EXISTS inorder_dead_letters (
    entity_type   text        NOT NULL,
    entity_id     text        NOT NULL,
    generation    bigint      NOT NULL,
    seq           bigint      NOT NULL,
    event_id      text        NOT NULL,
    reason        text        NOT NULL,
    detail        text        NOT NULL,
    topic         text        NOT NULL,
    kafka_partition integer   NOT NULL,
    kafka_offset  bigint      NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS inorder_dead_letters_entity
    ON inorder_dead_letters (entity_type, entity_id, generation, seq);
CREATE TABLE IF NOT EXISTS inorder_step_progress (
    route          text        NOT NULL,
    entity_id      text        NOT NULL,
    generation     bigint      NOT NULL,
    last_applied   bigint      NOT NULL,      -- 0: waiting for seq 1 of this generation
    held_at        timestamptz,               -- parking cap reached; events went to the held topic
    stopped_at_seq bigint,                    -- needs a person before this seq can be applied
    stop_reason    text,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (route, entity_id)
);
CREATE TABLE IF NOT EXISTS inorder_step_log (
    route      text        NOT NULL,
    entity_id  text        NOT NULL,
    generation bigint      NOT NULL,
    seq        bigint      NOT NULL,
    event_id   text        NOT NULL,
    event_type text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (route, entity_id, generation, seq)
);
CREATE TABLE IF NOT EXISTS inorder_step_skips (
    route      text        NOT NULL,
    entity_id  text        NOT NULL,
    generation bigint      NOT NULL,
    from_seq   bigint      NOT NULL,
    to_seq     bigint      NOT NULL,
    skipped_by text        NOT NULL,
    reason     text        NOT NULL,
    skipped_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS inorder_step_attempts (
    route        text        NOT NULL,
    entity_id    text        NOT NULL,
    generation   bigint      NOT NULL,
    seq          bigint      NOT NULL,
    event_id     text        NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz,
    PRIMARY KEY (route, entity_id, generation, seq)
);

CREATE TABLE IF NOT EXISTS inorder_gaps (
    id              bigserial   PRIMARY KEY,
    route           text        NOT NULL,
    entity_id       text        NOT NULL,
    generation      bigint      NOT NULL,
    from_seq        bigint      NOT NULL,
    to_seq          bigint      NOT NULL,
    event_type      text        NOT NULL,      -- of the first parked event, for metrics
    status          text        NOT NULL CHECK (status IN
                        ('open', 'requested', 'healed', 'unrecoverable', 'skipped')),
    first_seen      timestamptz NOT NULL DEFAULT now(),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    missing         bigint[],                  -- seqs the relay no longer has
    resolved_at     timestamptz,
    resolved_by     text,
    reason          text
);
CREATE UNIQUE INDEX IF NOT EXISTS inorder_gaps_unresolved
    ON inorder_gaps (route, entity_id) WHERE status IN ('open', 'requested', 'unrecoverable');
"""


def create(conn: psycopg.Connection[Any]) -> None:
    """Create every table the consumer, the sweeper and inorder-admin write, if missing."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('inorder_consumer_tables'))")
        conn.execute(DDL)
