-- Publication by transaction-id cursor (as PgQ batches events): every row carries the
-- id of the transaction that wrote it, the relay keeps one cursor per slice of entities,
-- and nothing is written per row when it is sent.
--
-- Nothing here rewrites the table. The column is added with a constant default, which
-- PostgreSQL keeps in the catalogue instead of writing into every row; the only step
-- that reads the whole table is the index build at the end (about 2 s per million rows,
-- with writers waiting). On a large outbox, the function, the column and the index can
-- be created beforehand, the index CONCURRENTLY, while writers go on (see the README's
-- upgrade notes); this file then finds them in place.

-- The slice of an entity: a fixed hash of its key into 16 slices. It is an expression of
-- the index, not a stored column, so adding it rewrites nothing. Changing the function
-- would move rows between slices behind the relay's cursors: it never changes.
CREATE OR REPLACE FUNCTION outbox_slice(entity_type text, entity_id text) RETURNS smallint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
    RETURN (hashtextextended(entity_type || ':' || entity_id, 0) & 15)::smallint;

-- Rows written before this migration get transaction id 0: behind every cursor. Those
-- still unpublished are listed below and sent first. New rows get their own
-- transaction's id; producers never write this column.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS xid xid8 NOT NULL DEFAULT '0';
ALTER TABLE outbox ALTER COLUMN xid SET DEFAULT pg_current_xact_id();

-- Rows to send ahead of the cursors, in id order, once each: those found unsent here,
-- and any an operator puts back (a corrected failed row, a rebased outbox).
CREATE TABLE outbox_resend (
    id bigint PRIMARY KEY REFERENCES outbox (id) ON DELETE CASCADE
);
INSERT INTO outbox_resend (id)
    SELECT id FROM outbox WHERE published_at IS NULL AND failed_at IS NULL;

-- Publication state now lives in the cursors, not in the rows. Rows marked failed, few
-- and rarely written, keep an index of their own for the gauge and the runbook.
CREATE INDEX outbox_failed_idx ON outbox (id) WHERE failed_at IS NOT NULL;
DROP INDEX outbox_pending_idx;
DROP INDEX outbox_published_at_idx;
ALTER TABLE outbox DROP COLUMN published_at, DROP COLUMN publish_count;

-- One cursor per slice, leased to one relay at a time. A row of the slice has been sent
-- when (xid, id) is at or behind the cursor, unless its transaction is one of `running`
-- (still open when the cursor passed it); of those, rows up to the matching entry of
-- `running_pos` have been sent.
CREATE TABLE outbox_relay_slices (
    slice       smallint    PRIMARY KEY CHECK (slice BETWEEN 0 AND 15),
    cursor_xid  xid8        NOT NULL DEFAULT '0',
    cursor_id   bigint      NOT NULL DEFAULT 9223372036854775807,
    running     xid8[]      NOT NULL DEFAULT '{}',
    running_pos bigint[]    NOT NULL DEFAULT '{}',
    owner       text,                        -- the relay holding the lease, if any
    lease_until timestamptz,
    advanced_at timestamptz,
    CHECK (cardinality(running) = cardinality(running_pos))
);
INSERT INTO outbox_relay_slices (slice) SELECT generate_series(0, 15);

-- Relays alive, for sharing the slices fairly among them.
CREATE TABLE outbox_relays (
    relay_id   text        PRIMARY KEY,
    seen_until timestamptz NOT NULL
);

-- Whether a row has been sent: the one definition every reader of the outbox uses.
CREATE FUNCTION outbox_published(o outbox) RETURNS boolean
    LANGUAGE sql STABLE
    RETURN o.failed_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM outbox_resend l WHERE l.id = o.id)
       AND EXISTS (
           SELECT 1 FROM outbox_relay_slices s
            WHERE s.slice = outbox_slice(o.entity_type, o.entity_id)
              AND (o.xid, o.id) <= (s.cursor_xid, s.cursor_id)
              AND (NOT o.xid = ANY (s.running)
                   OR o.id <= s.running_pos[array_position(s.running, o.xid)]));

CREATE INDEX IF NOT EXISTS outbox_slice_xid_idx
    ON outbox (outbox_slice(entity_type, entity_id), xid, id);
