-- The ids of the republish requests a gap has sent, oldest first. A result is acted on
-- only when it answers one of them (any writer of the results topic could have written
-- it). Gaps opened before this column have none; their results are matched by the id's
-- form, gap-<gap id>-...
ALTER TABLE inorder_gaps ADD COLUMN request_ids text[] NOT NULL DEFAULT '{}';
-- A constant default: adding it rewrites nothing.
