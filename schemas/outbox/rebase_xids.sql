-- Rebase the outbox onto this cluster's transaction ids, after the outbox was moved here
-- by a logical dump (pg_dump, logical replication) from another cluster. Transaction ids
-- are per cluster: the copied rows carry the old cluster's ids, which may run ahead of
-- this one's, and then the relay refuses to start.
--
-- Run it once, with no relay running, in one transaction (psql -1 -f). Rows already
-- sent stay sent; rows not yet sent are listed to go first, before anything written
-- from now on; the cursors start again from the beginning.
INSERT INTO outbox_resend (id)
    SELECT id FROM outbox o WHERE NOT outbox_published(o) AND failed_at IS NULL
    ON CONFLICT DO NOTHING;
UPDATE outbox SET xid = '0' WHERE xid <> '0';
UPDATE outbox_relay_slices
   SET cursor_xid = '0', cursor_id = 9223372036854775807, running = '{}', running_pos = '{}',
       owner = NULL, lease_until = NULL;
