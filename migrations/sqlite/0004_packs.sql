-- Packs: small nodes stored together in one object of their partition, as zstd blocks of
-- entries. A packed node's row names its pack in object_gen and says where its entry is: the
-- block's byte range in the pack object, and the entry's range in the block's content. Its
-- stored_bytes is its share of the block (the shares of a pack's entries sum to the object).
ALTER TABLE nodes ADD COLUMN pack_block_offset INTEGER;
ALTER TABLE nodes ADD COLUMN pack_block_bytes INTEGER;
ALTER TABLE nodes ADD COLUMN pack_entry_offset INTEGER;
ALTER TABLE nodes ADD COLUMN pack_entry_bytes INTEGER;
CREATE INDEX nodes_loose ON nodes (app_id, space_id, created_at)
    WHERE pack_block_offset IS NULL AND collecting_since IS NULL;
CREATE INDEX nodes_packed ON nodes (app_id, space_id, object_gen)
    WHERE pack_block_offset IS NOT NULL;

-- One row per pack object. 'writing' from before its object is written until the rows point
-- at it ('live'): a packer that crashed leaves a 'writing' row, and the next packer of the
-- partition deletes its object. live_nodes and live_bytes count the rows that point at it.
CREATE TABLE packs (
    app_id TEXT NOT NULL,
    space_id TEXT NOT NULL,
    pack_id TEXT NOT NULL,
    state TEXT NOT NULL,
    object_bytes INTEGER NOT NULL DEFAULT 0,
    live_nodes INTEGER NOT NULL DEFAULT 0 CHECK (live_nodes >= 0),
    live_bytes INTEGER NOT NULL DEFAULT 0 CHECK (live_bytes >= 0),
    created_at INTEGER NOT NULL,
    PRIMARY KEY (app_id, space_id, pack_id)
);

-- The packer of a partition: at most one holds it until 'until' (ms since the epoch).
CREATE TABLE packers (
    app_id TEXT NOT NULL,
    space_id TEXT NOT NULL,
    holder TEXT NOT NULL,
    until INTEGER NOT NULL,
    PRIMARY KEY (app_id, space_id)
);
