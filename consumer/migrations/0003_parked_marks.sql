-- The newest version each entity has parked, written in PostgreSQL before the park goes to
-- Redis. A park Redis loses in a crash (its last second with appendfsync everysec) leaves
-- progress behind this mark with nothing parked: the sweeper finds such entities here and
-- asks the relay for the missing range, without waiting for a later event to arrive.
-- Both columns are nullable without defaults: adding them rewrites nothing.
ALTER TABLE inorder_step_progress
    ADD COLUMN parked_generation bigint,
    ADD COLUMN parked_through    bigint;
-- Only entities whose parks are ahead of their progress: few among many.
CREATE INDEX inorder_step_progress_parked_ahead
    ON inorder_step_progress (route, updated_at)
    WHERE (parked_generation, parked_through) > (generation, last_applied);
