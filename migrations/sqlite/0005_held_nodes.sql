-- Small nodes held in the database until they are packed: a node published with content of at
-- most pack_max_node_bytes keeps its stored bytes (in the row's encoding) here instead of an
-- object of its own, in the same transaction as its row, so a small upload costs no object
-- write. The packer moves them into a pack and clears the column; a row that is deleted takes
-- them with it.
ALTER TABLE nodes ADD COLUMN held_bytes BLOB;
