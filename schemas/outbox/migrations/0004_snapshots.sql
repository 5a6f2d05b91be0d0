-- Snapshots: an entity's whole state at its version, written as `<entity_type>.snapshot`
-- with seq = that version (``inorder-producer snapshot``). The change event of that
-- version may still be here, so the version's uniqueness now holds per kind: one change
-- event and at most one snapshot per (entity, generation, seq). A second snapshot of an
-- unchanged entity is refused by it, which makes taking snapshots again harmless.
--
-- The new index keeps the old one's leading columns, so the relay's range reads use it
-- as before; it takes the old constraint's name, which a duplicate's error names. The
-- build reads the whole table once (writers wait meanwhile, about 2 s per million rows);
-- on a large outbox it can be made beforehand, CONCURRENTLY, under the name
-- outbox_entity_version_key, and this file then only swaps the names.
CREATE UNIQUE INDEX IF NOT EXISTS outbox_entity_version_key ON outbox
    (entity_type, entity_id, generation, seq, (event_type = entity_type || '.snapshot'));
ALTER TABLE outbox DROP CONSTRAINT outbox_entity_seq_key;
ALTER INDEX outbox_entity_version_key RENAME TO outbox_entity_seq_key;

-- Snapshots a consumer asks for: the sweeper writes one when a step entity's gap can no
-- longer be republished and its route takes snapshots as a baseline;
-- `inorder-producer snapshot STREAM --requested` takes those of its stream and marks them.
CREATE TABLE outbox_snapshot_requests (
    id           bigserial   PRIMARY KEY,
    entity_type  text        NOT NULL,
    entity_id    text        NOT NULL,
    reason       text        NOT NULL,
    requested_by text        NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now(),
    taken_at     timestamptz
);
-- One open request per entity: asking again while one waits adds nothing.
CREATE UNIQUE INDEX outbox_snapshot_requests_open
    ON outbox_snapshot_requests (entity_type, entity_id) WHERE taken_at IS NULL;
