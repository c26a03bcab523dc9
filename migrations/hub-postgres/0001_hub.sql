-- The hub's own tables: mutable pointers and indexes only. Everything immutable (files,
-- workspace trees, versions, catalog snapshots) is a node in the CAS.

CREATE TABLE hub_users (
    id            TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    email         TEXT,
    super_admin   INTEGER NOT NULL DEFAULT 0 CHECK (super_admin IN (0, 1)),
    created_at_ms BIGINT NOT NULL,
    suspended_at_ms BIGINT
);

-- Personal access tokens: only the SHA-256 of the secret is stored.
CREATE TABLE hub_tokens (
    id            TEXT PRIMARY KEY,
    user_id       TEXT NOT NULL REFERENCES hub_users (id),
    name          TEXT NOT NULL,
    secret_hash   TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT,
    revoked_at_ms BIGINT
);
CREATE INDEX hub_tokens_user ON hub_tokens (user_id);

-- The catalog head: the one pointer to the current catalog snapshot node. `seq` moves by one
-- with every commit and is the optimistic check of a swap.
CREATE TABLE hub_catalog (
    id            INTEGER PRIMARY KEY CHECK (id = 1),
    seq           BIGINT NOT NULL,
    snapshot_id   TEXT NOT NULL,
    snapshot_hash TEXT NOT NULL,
    updated_at_ms BIGINT NOT NULL
);

-- Notebook heads. `max_revision` is the highest revision number ever allocated, so a number is
-- never handed out twice, also after a crash between allocating it and moving the head.
CREATE TABLE hub_notebooks (
    notebook_id     TEXT PRIMARY KEY,
    project_id      TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('live', 'trashed', 'purging', 'purged')),
    head_revision   BIGINT,
    max_revision    BIGINT NOT NULL DEFAULT 0 CHECK (max_revision >= 0),
    sync_token_hash TEXT,
    created_at_ms   BIGINT NOT NULL,
    updated_at_ms   BIGINT NOT NULL
);
CREATE INDEX hub_notebooks_project ON hub_notebooks (project_id);

-- The version index: one row per committed revision. The version itself is a CAS node.
CREATE TABLE hub_versions (
    notebook_id     TEXT NOT NULL,
    revision        BIGINT NOT NULL CHECK (revision > 0),
    version_id      TEXT NOT NULL UNIQUE,
    project_id      TEXT NOT NULL,
    version_hash    TEXT NOT NULL,
    tree_hash       TEXT NOT NULL,
    parent_revision BIGINT,
    saved_at_ms     BIGINT NOT NULL,
    author          TEXT NOT NULL,
    message         TEXT NOT NULL,
    kind            TEXT NOT NULL,
    file_count      BIGINT NOT NULL,
    logical_bytes   BIGINT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('kept', 'pruned')),
    pruned_at_ms    BIGINT,
    PRIMARY KEY (notebook_id, revision)
);
CREATE INDEX hub_versions_project ON hub_versions (project_id, state);

-- Deleted notebooks waiting in the trash, restorable by token.
CREATE TABLE hub_trash (
    token         TEXT PRIMARY KEY,
    project_id    TEXT NOT NULL,
    notebook_id   TEXT NOT NULL UNIQUE,
    title         TEXT NOT NULL,
    trashed_at_ms BIGINT NOT NULL,
    actor         TEXT NOT NULL
);
CREATE INDEX hub_trash_project ON hub_trash (project_id, trashed_at_ms);

-- The outbox: a root-ref delta that was (or is about to be) sent to the CAS with a
-- deterministic request id, and the local commit that follows it. Recovery replays the
-- delta (idempotent in the CAS) and performs the commit.
CREATE TABLE hub_pending (
    request_id    TEXT PRIMARY KEY,
    kind          TEXT NOT NULL,
    lock_key      TEXT NOT NULL,
    space_id      TEXT NOT NULL,
    changes       TEXT NOT NULL,
    payload       TEXT NOT NULL,
    root_node     BYTEA,
    created_at_ms BIGINT NOT NULL
);
CREATE INDEX hub_pending_lock ON hub_pending (lock_key, created_at_ms);

-- Audit events, ULID ids (time-sortable).
CREATE TABLE hub_events (
    id          TEXT PRIMARY KEY,
    project_id  TEXT,
    notebook_id TEXT,
    ts_ms       BIGINT NOT NULL,
    event       TEXT NOT NULL,
    actor       TEXT NOT NULL,
    detail      TEXT NOT NULL
);
CREATE INDEX hub_events_project ON hub_events (project_id, id);
