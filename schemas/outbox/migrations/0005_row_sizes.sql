-- What one row may hold, checked where it is written: a writer learns at once that a row
-- can never be a Kafka message, instead of the relay failing it later. The bounds are far
-- above any message (Kafka's own cap is a few MiB): they stop a runaway writer, and the
-- relay still fails a row over INORDER_MAX_MESSAGE_BYTES without loading it.
-- pg_column_size reads a value's length, not the value: the check costs no parsing.
-- New rows only (NOT VALID), as the other checks added after the table.
ALTER TABLE outbox
    ADD CONSTRAINT outbox_headers_size CHECK (pg_column_size(headers) <= 65536) NOT VALID,
    ADD CONSTRAINT outbox_payload_size CHECK (pg_column_size(payload) <= 16777216) NOT VALID;
