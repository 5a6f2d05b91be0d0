-- Each live relay says how long it keeps sent rows (INORDER_RETENTION_S). The sweeper
-- reads the shortest at start-up and checks it outlives the longest a step route keeps a
-- parked event (its park TTL) plus the worst-case gap repair: a park still waiting
-- could otherwise ask for rows already purged. A relay of an earlier release leaves it
-- empty, and is not counted.
ALTER TABLE outbox_relays ADD COLUMN IF NOT EXISTS retention_s double precision;
