-- Idempotent creates (seed 000 §13): what a `POST` with an `Idempotency-Key` answered, keyed by
-- the SHA-256 of user, route and key, written in the transaction of the change it records.
-- `request_digest` is the SHA-256 of the body, so the same key with another body is refused.
-- `answer` is the JSON of the answer's `data`; NULL while a create that finishes in two steps
-- (a notebook with its first revision) has made only the first.
CREATE TABLE hub_idempotency (
    digest         TEXT PRIMARY KEY,
    user_id        TEXT NOT NULL,
    route          TEXT NOT NULL,
    request_digest TEXT NOT NULL,
    resource_id    TEXT NOT NULL,
    status         INTEGER NOT NULL,
    answer         TEXT,
    created_at_ms  BIGINT NOT NULL
);
CREATE INDEX hub_idempotency_created ON hub_idempotency (created_at_ms);

-- Catalog history (seed 000 §11): every snapshot the head has named, kept (its root ref held)
-- until the retention pass releases it; the current and the previous snapshot are always kept.
CREATE TABLE hub_catalog_snapshots (
    snapshot_id          TEXT PRIMARY KEY,
    snapshot_hash        TEXT NOT NULL,
    created_at_ms        BIGINT NOT NULL,
    operation            TEXT NOT NULL,
    actor                TEXT NOT NULL,
    previous_snapshot_id TEXT,
    released_at_ms       BIGINT
);
CREATE INDEX hub_catalog_snapshots_created ON hub_catalog_snapshots (created_at_ms);
-- The snapshot named by the head when this table was made (those before it were released).
INSERT INTO hub_catalog_snapshots (snapshot_id, snapshot_hash, created_at_ms, operation, actor)
    SELECT snapshot_id, snapshot_hash, updated_at_ms, 'unknown', 'unknown' FROM hub_catalog;

-- Personal access tokens (seed 000 §4.11): when each was last used (touched at most once a UTC
-- day), and scoped tokens: credential version 2 with its grant (projects and highest role).
ALTER TABLE hub_tokens ADD COLUMN last_used_at_ms BIGINT;
ALTER TABLE hub_tokens ADD COLUMN credential_version INTEGER NOT NULL DEFAULT 1;
ALTER TABLE hub_tokens ADD COLUMN grant_json TEXT;

-- Members invited by email before they have an account; claimed when a user with that email
-- is created or first authenticates. Emails are stored in lower case.
CREATE TABLE hub_invitations (
    project_id    TEXT NOT NULL,
    email         TEXT NOT NULL,
    role          TEXT NOT NULL CHECK (role IN ('viewer', 'editor', 'manager')),
    invited_by    TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (project_id, email)
);
CREATE INDEX hub_invitations_email ON hub_invitations (email);
CREATE INDEX hub_users_email ON hub_users (email);
