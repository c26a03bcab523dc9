-- A node's root ref count is no longer stored on its row: it is the sum of its balances over
-- domains, read from them. Every root-ref update rewrote the row of each node it named to
-- store that sum again (on Postgres a third of an update's database time); now a node's row
-- is written only when the sum goes to or from zero, which is what its `rooted` flag, all that
-- garbage collection reads, records. Replicas of an earlier version write the column this
-- drops: stop them before it runs.

-- The balances of one node over all its domains, found by its key.
CREATE INDEX root_ref_balances_by_hash ON root_ref_balances (app_id, space_id, hash);

ALTER TABLE nodes DROP COLUMN root_ref_count;
