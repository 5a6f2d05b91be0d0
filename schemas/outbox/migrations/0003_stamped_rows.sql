-- The columns only inorder writes are set by the table itself, whatever a writer sends:
-- `xid` (the relay's cursor order: a row copied in with another transaction's id, or a
-- far-future one, would move its slice's cursor past every row written after it, and
-- those would never be sent), `id` (the order within a transaction, which the cursor
-- also keeps) and the failure marks. A trigger holds for every way of writing a row
-- (INSERT, COPY, ORM or plain SQL, any role); ENABLE ALWAYS keeps it on where a restore
-- or a logical replica sets session_replication_role to replica.
--
-- A row copied from another database gets a new id and this transaction's id, so it
-- is sent (again) after the copy commits: a duplicate the consumers drop, never a loss.
-- The rebase script (schemas/outbox/rebase_xids.sql) updates, and is not affected.

ALTER TABLE outbox ALTER COLUMN id DROP DEFAULT;

CREATE FUNCTION inorder_outbox_stamp() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.id := nextval(format('%I.outbox_id_seq', TG_TABLE_SCHEMA));
    NEW.xid := pg_current_xact_id();
    NEW.failed_at := NULL;
    NEW.failure_reason := NULL;
    RETURN NEW;
END;
$$;

CREATE TRIGGER outbox_stamp BEFORE INSERT ON outbox
    FOR EACH ROW EXECUTE FUNCTION inorder_outbox_stamp();
ALTER TABLE outbox ENABLE ALWAYS TRIGGER outbox_stamp;

-- Headers become Kafka headers: a flat object of strings.
CREATE FUNCTION outbox_headers_ok(h jsonb) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
    RETURN jsonb_typeof(h) = 'object'
       AND NOT EXISTS (SELECT 1 FROM jsonb_each(h) e WHERE jsonb_typeof(e.value) <> 'string');

-- New rows only (NOT VALID): rows written before are held to the same rules by the
-- relay, which marks those that break them failed, one by one.
ALTER TABLE outbox
    ADD CONSTRAINT outbox_topic_legal
        CHECK (topic ~ '^[A-Za-z0-9._-]{1,249}$' AND topic NOT IN ('.', '..')) NOT VALID,
    ADD CONSTRAINT outbox_headers_strings CHECK (outbox_headers_ok(headers)) NOT VALID;
