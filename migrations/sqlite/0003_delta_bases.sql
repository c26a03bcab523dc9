-- Delta compression at rest: a node whose object is a zstd frame that needs another node's
-- content (its base, in the same partition) as the dictionary. delta_depth counts the bases
-- a read goes through (0 for an object that stands alone); it only ever overstates the chain,
-- which GC shortens when it re-encodes a collected base's dependents.
ALTER TABLE nodes ADD COLUMN delta_base BLOB;
ALTER TABLE nodes ADD COLUMN delta_depth INTEGER NOT NULL DEFAULT 0;
CREATE INDEX nodes_delta_base ON nodes (app_id, space_id, delta_base)
    WHERE delta_base IS NOT NULL;
