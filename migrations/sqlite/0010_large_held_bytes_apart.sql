-- A small node's held bytes larger than 2 KiB live in a table of their own, keyed as its row,
-- instead of in the row. SQLite stores a row as one record: every update of a node's small
-- columns (its child ref count when a parent is published, its lease, its flags) read such
-- bytes back from their overflow pages and compared them page by page, and each such row took
-- pages of its own. Bytes up to 2 KiB fit in the row's page and stay there (a second table
-- would cost them a second insert and lookup). The row's `held` flag says its bytes are held,
-- wherever they are; those kept apart go with the row (the foreign key deletes them with it).
-- The 2 KiB is `HELD_IN_ROW_MAX` of the service.

CREATE TABLE held_apart (
    app_id TEXT NOT NULL,
    space_id TEXT NOT NULL,
    hash BLOB NOT NULL,
    bytes BLOB NOT NULL,
    PRIMARY KEY (app_id, space_id, hash),
    FOREIGN KEY (app_id, space_id, hash) REFERENCES nodes (app_id, space_id, hash)
        ON DELETE CASCADE
);
INSERT INTO held_apart (app_id, space_id, hash, bytes)
SELECT app_id, space_id, hash, held_bytes FROM nodes WHERE length(held_bytes) > 2048;

ALTER TABLE nodes ADD COLUMN held INTEGER NOT NULL DEFAULT 0 CHECK (held IN (0, 1));
UPDATE nodes SET held = 1,
    held_bytes = CASE WHEN length(held_bytes) > 2048 THEN NULL ELSE held_bytes END
WHERE held_bytes IS NOT NULL;
