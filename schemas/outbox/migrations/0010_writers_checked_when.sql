-- The writers' check is skipped before its function is called for the roles it lets
-- through anyway. A role that may grant INSERT on the outbox (its owner, a superuser, a
-- role given INSERT WITH GRANT OPTION) can already give any role the right to write, so
-- its own writes are not checked: the trigger's condition asks PostgreSQL's privilege
-- check, which costs next to nothing, where calling the function for the owner cost a
-- tenth of a one-row INSERT, paid by every `emit()`. Every other role is checked as
-- before, by the same function.
DROP TRIGGER outbox_writers ON outbox;

CREATE TRIGGER outbox_writers AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS inorder_written
    FOR EACH STATEMENT
    WHEN (NOT pg_catalog.has_table_privilege('outbox'::regclass, 'INSERT WITH GRANT OPTION'))
    EXECUTE FUNCTION inorder_outbox_writers();
