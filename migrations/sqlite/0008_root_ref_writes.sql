-- Root-ref updates write less. Replicas of an earlier version write what this replaces: stop
-- them before it runs.
--
-- Root-ref balances keep only their current value. Every accepted update closed one history row
-- and inserted another per changed hash, at a place of the table set by the hash; that history
-- was the largest part of what an update wrote, and it is what the events already hold: a
-- balance at an earlier revision is its current value less the changes of the events after
-- that revision (`root_ref_reads`). Zero balances are not stored.

CREATE TABLE root_ref_balances_now (
    app_id TEXT NOT NULL,
    space_id TEXT NOT NULL,
    ref_domain TEXT NOT NULL,
    hash BLOB NOT NULL,
    ref_count INTEGER NOT NULL CHECK (ref_count <> 0),
    PRIMARY KEY (app_id, space_id, ref_domain, hash)
);
INSERT INTO root_ref_balances_now (app_id, space_id, ref_domain, hash, ref_count)
SELECT app_id, space_id, ref_domain, hash, ref_count
FROM root_ref_balances WHERE revision_to IS NULL;
DROP TABLE root_ref_balances;
ALTER TABLE root_ref_balances_now RENAME TO root_ref_balances;

-- Whether a node's root ref count is above zero, which is all that garbage collection asks of
-- it: the candidates' index names this flag instead of the count, so an update that changes a
-- count without taking it to or from zero changes no indexed column (on Postgres the row is
-- updated in place, without an entry in each of the table's indexes).
ALTER TABLE nodes ADD COLUMN rooted INTEGER NOT NULL DEFAULT 0 CHECK (rooted IN (0, 1));
UPDATE nodes SET rooted = 1 WHERE root_ref_count > 0;
DROP INDEX nodes_gc_candidates;
CREATE INDEX nodes_gc_candidates ON nodes (app_id, space_id, lease_expires_at)
    WHERE child_ref_count = 0 AND rooted = 0 AND collecting_since IS NULL;
