-- The data plane: Apps and their issuer keys, nodes with ordered edges, upload generations,
-- root-ref events with their balance projection, and per-Space usage.
-- Times are milliseconds since the Unix epoch; hashes are 32 raw bytes.

CREATE TABLE service_secrets (
    name TEXT PRIMARY KEY,
    secret BLOB NOT NULL
);

CREATE TABLE apps (
    app_id TEXT PRIMARY KEY,
    issuer TEXT NOT NULL UNIQUE,
    suspended_at INTEGER,
    -- The last App-global root-ref revision allocated.
    revision INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL
);

CREATE TABLE app_keys (
    app_id TEXT NOT NULL REFERENCES apps (app_id),
    kid TEXT NOT NULL,
    alg TEXT NOT NULL,
    public_key_pem TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER,
    PRIMARY KEY (app_id, kid)
);

-- Presence of a row without collecting_since is readiness.
CREATE TABLE nodes (
    app_id TEXT NOT NULL,
    space_id TEXT NOT NULL,
    hash BLOB NOT NULL,
    size INTEGER NOT NULL,
    content_type TEXT NOT NULL,
    ref_count INTEGER NOT NULL,
    -- The upload generation whose object holds the content (part of the object key).
    object_gen TEXT NOT NULL,
    encoding TEXT NOT NULL,
    stored_bytes INTEGER NOT NULL,
    lease_started_at INTEGER NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    child_ref_count INTEGER NOT NULL DEFAULT 0 CHECK (child_ref_count >= 0),
    root_ref_count INTEGER NOT NULL DEFAULT 0 CHECK (root_ref_count >= 0),
    -- Set by GC when it decides to collect the row: from then on the node is not ready.
    collecting_since INTEGER,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (app_id, space_id, hash)
);
CREATE INDEX nodes_gc_candidates ON nodes (app_id, space_id, lease_expires_at)
    WHERE child_ref_count = 0 AND root_ref_count = 0 AND collecting_since IS NULL;
CREATE INDEX nodes_lease ON nodes (app_id, space_id, lease_expires_at);
CREATE INDEX nodes_collecting ON nodes (app_id, space_id, collecting_since)
    WHERE collecting_since IS NOT NULL;

-- Ordered child refs; each occurrence counts once in the child's child_ref_count.
CREATE TABLE edges (
    app_id TEXT NOT NULL,
    space_id TEXT NOT NULL,
    parent BLOB NOT NULL,
    ord INTEGER NOT NULL,
    child BLOB NOT NULL,
    PRIMARY KEY (app_id, space_id, parent, ord)
);
CREATE INDEX edges_child ON edges (app_id, space_id, child);

-- One upload attempt of one node. At most one active (awaiting_upload or validated) per node.
CREATE TABLE upload_generations (
    gen_id TEXT PRIMARY KEY,
    app_id TEXT NOT NULL,
    space_id TEXT NOT NULL,
    hash BLOB NOT NULL,
    state TEXT NOT NULL,
    target TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    url_expires_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    reserved_bytes INTEGER NOT NULL,
    -- Validation evidence, set when the uploaded bytes were found valid.
    content_type TEXT,
    content_size INTEGER,
    refs BLOB
);
CREATE UNIQUE INDEX upload_generations_active ON upload_generations (app_id, space_id, hash)
    WHERE state IN ('awaiting_upload', 'validated');
CREATE INDEX upload_generations_partition ON upload_generations (app_id, space_id, state);
CREATE INDEX upload_generations_expiry ON upload_generations (app_id, space_id, expires_at);

-- Bodies of small uploads kept in the database (object stores where one write per node matters).
CREATE TABLE upload_bodies (
    gen_id TEXT PRIMARY KEY,
    body BLOB NOT NULL
);

-- Objects superseded by a re-publication, deleted by the next GC pass of their Space.
CREATE TABLE retired_objects (
    app_id TEXT NOT NULL,
    space_id TEXT NOT NULL,
    hash BLOB NOT NULL,
    object_gen TEXT NOT NULL,
    retired_at INTEGER NOT NULL,
    PRIMARY KEY (app_id, space_id, hash, object_gen)
);

CREATE TABLE space_usage (
    app_id TEXT NOT NULL,
    space_id TEXT NOT NULL,
    node_count INTEGER NOT NULL DEFAULT 0,
    not_ready_node_count INTEGER NOT NULL DEFAULT 0,
    ready_content_bytes INTEGER NOT NULL DEFAULT 0,
    ready_stored_bytes INTEGER NOT NULL DEFAULT 0,
    reserved_bytes INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (app_id, space_id)
);

CREATE TABLE root_ref_events (
    app_id TEXT NOT NULL,
    revision INTEGER NOT NULL,
    space_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    -- JSON object of hash to signed delta, keys sorted.
    changes TEXT NOT NULL,
    actor TEXT NOT NULL,
    applied_at INTEGER NOT NULL,
    PRIMARY KEY (app_id, revision)
);
CREATE INDEX root_ref_events_space ON root_ref_events (app_id, space_id, revision);

-- The (App, Space, hash) balance projection, versioned so that a page can be read at any
-- revision: a row holds ref_count for revisions [revision_from, revision_to).
CREATE TABLE root_ref_balances (
    app_id TEXT NOT NULL,
    space_id TEXT NOT NULL,
    hash BLOB NOT NULL,
    ref_count INTEGER NOT NULL CHECK (ref_count > 0),
    revision_from INTEGER NOT NULL,
    revision_to INTEGER,
    PRIMARY KEY (app_id, space_id, hash, revision_from)
);
CREATE UNIQUE INDEX root_ref_balances_current ON root_ref_balances (app_id, space_id, hash)
    WHERE revision_to IS NULL;

CREATE TABLE root_ref_requests (
    app_id TEXT NOT NULL,
    space_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    payload_hash BLOB NOT NULL,
    revision INTEGER NOT NULL,
    PRIMARY KEY (app_id, space_id, request_id)
);
