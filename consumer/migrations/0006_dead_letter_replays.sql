-- Dead letters an operator can list, replay and discard. Each letter gets an id (the
-- identity fills the rows there are: this one change rewrites the table, which holds
-- only what was refused), its event type, where its copy is in the dead-letter topic and
-- whether that copy was cut to size, how many times its event was replayed before, and
-- where it stands (status; a replay interrupted midway leaves 'replaying', and the next
-- replay takes it up again).
ALTER TABLE inorder_dead_letters
    ADD COLUMN id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ADD COLUMN event_type       text,
    ADD COLUMN letter_topic     text,
    ADD COLUMN letter_partition integer,
    ADD COLUMN letter_offset    bigint,
    ADD COLUMN cut              boolean NOT NULL DEFAULT false,
    ADD COLUMN replays          integer NOT NULL DEFAULT 0,
    ADD COLUMN status           text    NOT NULL DEFAULT 'new'
        CHECK (status IN ('new', 'replaying', 'replayed', 'discarded'));
CREATE INDEX inorder_dead_letters_open
    ON inorder_dead_letters (reason, recorded_at) WHERE status IN ('new', 'replaying');
CREATE INDEX inorder_dead_letters_event ON inorder_dead_letters (event_id);
-- A person's decisions on letters, with who and why (letters.Decision).
CREATE TABLE inorder_dead_letter_decisions (
    letter_id  bigint      NOT NULL REFERENCES inorder_dead_letters (id),
    decision   text        NOT NULL CHECK (decision IN ('replayed', 'discarded')),
    source     text        CHECK (source IN ('copy', 'outbox')),
    done_by    text        NOT NULL,
    reason     text        NOT NULL,
    done_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX inorder_dead_letter_decisions_letter ON inorder_dead_letter_decisions (letter_id);
