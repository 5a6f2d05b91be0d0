-- Entities stopped for a person or held are few among many progress rows: the
-- steps_needs_review gauge, `inorder-admin review list` and `held list` read them
-- through these small partial indexes instead of scanning every entity.
CREATE INDEX inorder_step_progress_stopped
    ON inorder_step_progress (route, entity_id) WHERE stopped_at_seq IS NOT NULL;
CREATE INDEX inorder_step_progress_held
    ON inorder_step_progress (held_at) WHERE held_at IS NOT NULL;

-- An operator's batch decisions are one of three actions (schemas.batches.Action).
ALTER TABLE inorder_batch_actions
    ADD CONSTRAINT inorder_batch_actions_action_check
    CHECK (action IN ('release_incomplete', 'confirmed_applied', 'retried'));
