-- The rules 0003 and 0005 added (a legal topic, flat string headers, the size bounds) are
-- checked when a row is written, and only then. As NOT VALID CHECKs they were checked on
-- every UPDATE too, so the relay could not mark failed a row written before them that
-- breaks them (10 MB of headers, a nested header, an illegal topic): its UPDATE was
-- refused, and the relay stopped on that row each time it started. The stamping trigger
-- now refuses such a row on INSERT, with the same SQLSTATE (23514, check_violation) and
-- the same constraint names; rows written earlier are held to the relay's own rules,
-- which fail them one by one. The cheap rules come first: the size of a value is read
-- from its length word, the headers are walked only when they are small.

CREATE OR REPLACE FUNCTION inorder_outbox_stamp() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    broken text;
BEGIN
    IF NOT (NEW.topic ~ '^[A-Za-z0-9._-]{1,249}$' AND NEW.topic NOT IN ('.', '..')) THEN
        broken := 'outbox_topic_legal';
    ELSIF pg_column_size(NEW.headers) > 65536 THEN
        broken := 'outbox_headers_size';
    ELSIF pg_column_size(NEW.payload) > 16777216 THEN
        broken := 'outbox_payload_size';
    ELSIF NOT outbox_headers_ok(NEW.headers) THEN
        broken := 'outbox_headers_strings';
    END IF;
    IF broken IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"',
                TG_TABLE_NAME, broken
            USING ERRCODE = 'check_violation', CONSTRAINT = broken,
                  TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    NEW.id := nextval(format('%I.outbox_id_seq', TG_TABLE_SCHEMA));
    NEW.xid := pg_current_xact_id();
    NEW.failed_at := NULL;
    NEW.failure_reason := NULL;
    RETURN NEW;
END;
$$;

ALTER TABLE outbox
    DROP CONSTRAINT outbox_topic_legal,
    DROP CONSTRAINT outbox_headers_strings,
    DROP CONSTRAINT outbox_headers_size,
    DROP CONSTRAINT outbox_payload_size;
