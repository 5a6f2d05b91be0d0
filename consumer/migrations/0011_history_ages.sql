-- Block-range indexes on the times the sweeper forgets history by
-- (INORDER_HISTORY_RETENTION_S): rows are written in time order, so a BRIN index finds
-- the old blocks at almost no cost to each write (a B-tree would be updated on every
-- step applied).
CREATE INDEX IF NOT EXISTS inorder_step_log_applied_at
    ON inorder_step_log USING brin (applied_at);
CREATE INDEX IF NOT EXISTS inorder_step_attempts_completed_at
    ON inorder_step_attempts USING brin (completed_at);
CREATE INDEX IF NOT EXISTS inorder_step_failures_failed_at
    ON inorder_step_failures USING brin (failed_at);
CREATE INDEX IF NOT EXISTS inorder_dead_letters_recorded_at
    ON inorder_dead_letters USING brin (recorded_at);
