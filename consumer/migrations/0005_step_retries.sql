-- Retries of a step that raised. The progress row keeps which step failed last and how
-- many calls of it failed, and when the entity is to be tried again (the sweeper's tick
-- resumes it then). The constant default of `failures` and the nullable columns rewrite
-- nothing.
ALTER TABLE inorder_step_progress
    ADD COLUMN retry_at          timestamptz,
    ADD COLUMN failed_generation bigint,
    ADD COLUMN failed_seq        bigint,
    ADD COLUMN failures          integer NOT NULL DEFAULT 0;
-- Only entities waiting for a retry: few among many.
CREATE INDEX inorder_step_progress_retry
    ON inorder_step_progress (retry_at) WHERE retry_at IS NOT NULL;
-- Every failed call of a step and what it led to (retries.Action), for explain and audit.
CREATE TABLE inorder_step_failures (
    id          bigserial   PRIMARY KEY,
    route       text        NOT NULL,
    entity_id   text        NOT NULL,
    generation  bigint      NOT NULL,
    seq         bigint      NOT NULL,
    event_id    text        NOT NULL,
    event_type  text        NOT NULL,
    attempt     integer     NOT NULL CHECK (attempt >= 1),
    error       text        NOT NULL,
    led_to      text        NOT NULL CHECK (led_to IN ('retry', 'stop', 'dead_letter', 'skip')),
    retry_at    timestamptz,
    failed_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX inorder_step_failures_entity
    ON inorder_step_failures (route, entity_id, generation, seq);
