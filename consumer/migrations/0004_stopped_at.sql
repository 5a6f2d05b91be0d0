-- When an entity was stopped for a person: the start of the review span, and how long a
-- stop has waited. Nullable without a default: adding it rewrites nothing; stops made
-- before it have none.
ALTER TABLE inorder_step_progress ADD COLUMN stopped_at timestamptz;
