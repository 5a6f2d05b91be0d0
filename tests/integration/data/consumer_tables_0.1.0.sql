-- The consumer's tables exactly as release 0.1.0 created them at start-up
-- (consumer/tables.py, run at every start), before they had versioned migrations.
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

CREATE TABLE IF NOT EXISTS inorder_batches (
    route          text        NOT NULL,
    batch_id       text        NOT NULL,
    generation     bigint      NOT NULL,
    expected_count integer     NOT NULL CHECK (expected_count >= 0),
    digest         text        NOT NULL,   -- of batch_id, expected_count, positions, item keys
    on_incomplete  text        NOT NULL CHECK (on_incomplete IN ('assemble_incomplete', 'hold')),
    deadline_s     integer     NOT NULL,
    deadline_at    timestamptz NOT NULL,
    status         text        NOT NULL CHECK (status IN
                       ('waiting', 'complete', 'incomplete', 'held', 'inconsistent', 'halted')),
    reason         text,
    revision       integer     NOT NULL DEFAULT 0,   -- assemblies written so far
    accepted_at    timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (route, batch_id)
);
CREATE INDEX IF NOT EXISTS inorder_batches_waiting
    ON inorder_batches (route, deadline_at) WHERE status = 'waiting';
CREATE TABLE IF NOT EXISTS inorder_batch_items (
    route       text        NOT NULL,
    batch_id    text        NOT NULL,
    position    integer     NOT NULL CHECK (position >= 1),
    item_key    text        NOT NULL,
    input       jsonb,
    state       text        NOT NULL DEFAULT 'pending' CHECK (state IN
                    ('pending', 'done', 'failed', 'abandoned', 'needs_review')),
    result_ref  text,
    error       text,
    attempts    integer     NOT NULL DEFAULT 1,
    finished_at text,                      -- as the worker reported it; never used for order
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (route, batch_id, position)
);
CREATE TABLE IF NOT EXISTS inorder_batch_early_results (
    route       text        NOT NULL,
    batch_id    text        NOT NULL,
    event_id    text        NOT NULL,
    attempt     bigint      NOT NULL,
    event_type  text        NOT NULL,
    payload     jsonb       NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (route, batch_id, event_id)
);
CREATE TABLE IF NOT EXISTS inorder_batch_actions (
    route     text        NOT NULL,
    batch_id  text        NOT NULL,
    position  integer,
    action    text        NOT NULL,
    done_by   text        NOT NULL,
    reason    text        NOT NULL,
    done_at   timestamptz NOT NULL DEFAULT now()
);
