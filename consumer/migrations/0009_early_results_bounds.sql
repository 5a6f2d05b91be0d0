-- Results of batches whose manifest has not come yet are bounded per route (count and
-- bytes) and expire: the sweeper dead-letters those older than the route's
-- `early_results_ttl_s`, oldest first, with the result's envelope (kept here; rows kept
-- before this migration have none, and are dead-lettered as their payload).
ALTER TABLE inorder_batch_early_results ADD COLUMN IF NOT EXISTS message bytea;
CREATE INDEX IF NOT EXISTS inorder_batch_early_results_age
    ON inorder_batch_early_results (route, received_at);
