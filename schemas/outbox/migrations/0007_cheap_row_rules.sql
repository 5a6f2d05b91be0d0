-- The same rules as 0006, at a fraction of their cost per row (every producer pays it
-- inside the transaction that changes its entity). Measured on one set-based insert of
-- 20,000 rows: 28 us a row with 0006's trigger, 13 us with none, 17 us with this one.
-- Most of the cost was the topic's bounded pattern (`{1,249}` compiles to 249 copies of
-- its class); the length is now read apart. The headers are walked by one path query
-- instead of an SQL function with a subquery (strict: in lax mode a list of strings
-- would be unwrapped and pass), and the rules are one expression: the
-- rule that broke is worked out only for a row that breaks one, so the refusal keeps
-- 0006's SQLSTATE (23514) and constraint names.
--
-- `created_at` is stamped too (the writing transaction's time, as its default was):
-- retention walks rows in id order and stops at the first one too young to go, so a
-- row written with a time in the future held back the purge of every row after it,
-- and one written with a time long past was purged as soon as it was sent. Rows
-- written before this migration with a time in the future are brought back to now.

CREATE OR REPLACE FUNCTION inorder_outbox_stamp() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    broken text;
BEGIN
    IF NOT coalesce(
        NEW.topic ~ '^[A-Za-z0-9._-]+$' AND char_length(NEW.topic) <= 249
        AND NEW.topic NOT IN ('.', '..')
        AND pg_column_size(NEW.headers) <= 65536
        AND pg_column_size(NEW.payload) <= 16777216
        AND jsonb_typeof(NEW.headers) = 'object'
        AND NOT jsonb_path_exists(NEW.headers, 'strict $.* ? (@.type() != "string")', '{}', true),
        true  -- a null breaks a NOT NULL constraint, which says so itself
    ) THEN
        IF NOT (NEW.topic ~ '^[A-Za-z0-9._-]+$' AND char_length(NEW.topic) <= 249
                AND NEW.topic NOT IN ('.', '..')) THEN
            broken := 'outbox_topic_legal';
        ELSIF pg_column_size(NEW.headers) > 65536 THEN
            broken := 'outbox_headers_size';
        ELSIF pg_column_size(NEW.payload) > 16777216 THEN
            broken := 'outbox_payload_size';
        ELSE
            broken := 'outbox_headers_strings';
        END IF;
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"',
                TG_TABLE_NAME, broken
            USING ERRCODE = 'check_violation', CONSTRAINT = broken,
                  TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    NEW.id := nextval(format('%I.outbox_id_seq', TG_TABLE_SCHEMA));
    NEW.xid := pg_current_xact_id();
    NEW.created_at := now();
    NEW.failed_at := NULL;
    NEW.failure_reason := NULL;
    RETURN NEW;
END;
$$;

UPDATE outbox SET created_at = now() WHERE created_at > now();
