-- The user a notebook's sync token acts for: the notebook's creator, or the manager who last
-- rotated it. Every push checks that this user may still write to the project.
ALTER TABLE hub_notebooks ADD COLUMN sync_token_owner TEXT;
