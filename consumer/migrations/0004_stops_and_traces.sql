-- When an entity was stopped for a person: the start of the review span, and how long a
-- stop has waited. Stops made before this column have none.
ALTER TABLE inorder_step_progress ADD COLUMN stopped_at timestamptz;
-- The trace contexts (W3C traceparent) of a gap's last republish request and of the
-- relay's last answer to it, for the gap's span to link to once it heals.
ALTER TABLE inorder_gaps
    ADD COLUMN request_trace text,
    ADD COLUMN answer_trace  text;
-- All three are nullable without defaults: adding them rewrites nothing.
