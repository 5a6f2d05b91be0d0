-- Each writer only its own streams. A role that is not the outbox's owner may insert only
-- the (entity_type, event_type) pairs the owner lists for it here; `*` stands for any
-- entity type or any event type. A worker whose job is batch results could otherwise
-- write another stream's events, a snapshot that moves entities past steps never
-- applied, or the manifest of any batch. `schemas.security.outbox_writes` gives the rows
-- each program needs; the deploy README shows them.
--
-- `role` names a role the writer is a member of (a group role such as inorder_producer
-- serves every login role in it). The owner, and superusers, write without a row: a
-- deployment that writes as the owner sees no change.
--
-- The check runs once per statement over the rows it inserted (a transition table), so
-- a set-based insert pays one lookup, not one per row. A refused statement raises
-- SQLSTATE 42501 (insufficient_privilege), naming the role and the pair, and inserts
-- nothing.
--
-- On upgrade, every role that could already insert into the outbox is listed with
-- `* *` (and may read the list, as every writer must), so nothing changes until the
-- owner narrows it.
CREATE TABLE outbox_writers (
    role        name NOT NULL,
    entity_type text NOT NULL,
    event_type  text NOT NULL,
    PRIMARY KEY (role, entity_type, event_type)
);

DO $$
DECLARE
    writer name;
BEGIN
    FOR writer IN
        SELECT DISTINCT grantee::name
          FROM information_schema.column_privileges
         WHERE table_schema = current_schema() AND table_name = 'outbox'
           AND privilege_type = 'INSERT' AND grantee <> 'PUBLIC'
           AND NOT pg_has_role(grantee::name, (SELECT relowner FROM pg_class
                                                WHERE oid = 'outbox'::regclass), 'MEMBER')
    LOOP
        INSERT INTO outbox_writers (role, entity_type, event_type) VALUES (writer, '*', '*');
        EXECUTE format('GRANT SELECT ON outbox_writers TO %I', writer);
    END LOOP;
END;
$$;

-- The function runs with the search path the migration ran with (the outbox's schema),
-- so its query names outbox_writers plainly and is planned once per session, and no
-- caller's search path can send it to another table.
CREATE FUNCTION inorder_outbox_writers() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    refused record;
BEGIN
    IF pg_has_role((SELECT relowner FROM pg_catalog.pg_class WHERE oid = TG_RELID), 'MEMBER') THEN
        RETURN NULL;
    END IF;
    SELECT r.entity_type, r.event_type INTO refused
      FROM inorder_written r
     WHERE NOT EXISTS (
           SELECT 1 FROM outbox_writers w
            WHERE w.entity_type IN (r.entity_type, '*')
              AND w.event_type IN (r.event_type, '*')
              AND pg_has_role(w.role, 'MEMBER'))
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'role % may not write % events of entity type % to the outbox',
                current_user, refused.event_type, refused.entity_type
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('the outbox''s owner grants it: INSERT INTO %I.outbox_writers '
                                '(role, entity_type, event_type) VALUES (%L, %L, %L)',
                                TG_TABLE_SCHEMA, current_user, refused.entity_type,
                                refused.event_type);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_writers AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS inorder_written
    FOR EACH STATEMENT EXECUTE FUNCTION inorder_outbox_writers();
