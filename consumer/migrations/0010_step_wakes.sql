-- Entities a person's decision (a skip, a review) left with steps to apply. The admin
-- command records the decision and a row here in one transaction; the sweeper drains
-- each entity with the handlers deployed beside the consumers, then deletes the row.
-- The operator's machine runs no handler unless the command is given --run-handlers.
CREATE TABLE IF NOT EXISTS inorder_step_wakes (
    route      text        NOT NULL,
    entity_id  text        NOT NULL,
    decision   text        NOT NULL,
    asked_by   text        NOT NULL,
    asked_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (route, entity_id)
);
