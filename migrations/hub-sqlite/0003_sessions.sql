-- Sessions: a notebook opened in a running marimo server (seed 000 §4.8). The record is the
-- hub's; the sandbox belongs to the hub process named by `owner_instance`, reachable at
-- `owner_url`. Routine heartbeats stay in that process's memory; `last_heartbeat_ms` is
-- written on create, on status changes and at most once a minute.
CREATE TABLE hub_sessions (
    session_id        TEXT PRIMARY KEY,
    project_id        TEXT NOT NULL,
    notebook_id       TEXT NOT NULL,
    user_id           TEXT NOT NULL,
    mode              TEXT NOT NULL CHECK (mode IN ('edit', 'app')),
    status            TEXT NOT NULL CHECK (status IN
                          ('starting', 'running', 'terminating', 'terminated', 'failed', 'expired')),
    started_at_ms     BIGINT NOT NULL,
    last_heartbeat_ms BIGINT NOT NULL,
    ended_at_ms       BIGINT,
    -- The revision the session opened, and the one its saves are now based on (NULL: the
    -- workspace had none). Saves go to `save_notebook_id` (the notebook, or the branch a
    -- conflict created).
    opened_revision   BIGINT,
    base_revision     BIGINT,
    save_notebook_id  TEXT NOT NULL,
    branched          INTEGER NOT NULL DEFAULT 0 CHECK (branched IN (0, 1)),
    last_saved_at_ms  BIGINT,
    last_version_id   TEXT,
    python_version    TEXT,
    marimo_version    TEXT,
    sandbox_id        TEXT,
    owner_instance    TEXT NOT NULL,
    owner_url         TEXT NOT NULL,
    error_code        TEXT,
    error_message     TEXT
);
CREATE INDEX hub_sessions_project ON hub_sessions (project_id, status);
CREATE INDEX hub_sessions_user ON hub_sessions (user_id, status);
CREATE INDEX hub_sessions_notebook ON hub_sessions (notebook_id, status);
CREATE INDEX hub_sessions_status ON hub_sessions (status, last_heartbeat_ms);

-- The persistent editor of a notebook (seed 000 §4.8.2): the edit session whose changes are
-- saved. A takeover moves through `requested`, `draining` and `ready`; `ready` lets only
-- `requested_by` start the next editor.
CREATE TABLE hub_editor_claims (
    notebook_id        TEXT PRIMARY KEY,
    project_id         TEXT NOT NULL,
    session_id         TEXT NOT NULL,
    user_id            TEXT NOT NULL,
    sharing            TEXT NOT NULL CHECK (sharing IN ('exclusive', 'shared')),
    claimed_at_ms      BIGINT NOT NULL,
    takeover_phase     TEXT CHECK (takeover_phase IN ('requested', 'draining', 'ready')),
    requested_by       TEXT,
    requested_at_ms    BIGINT,
    drain_expires_at_ms BIGINT
);

-- Snapshots a session's teardown attached to the version it cut (seed 000 §4.7).
ALTER TABLE hub_versions ADD COLUMN html_snapshot_hash TEXT;
ALTER TABLE hub_versions ADD COLUMN html_snapshot_bytes BIGINT;
ALTER TABLE hub_versions ADD COLUMN session_snapshot_hash TEXT;
ALTER TABLE hub_versions ADD COLUMN session_snapshot_bytes BIGINT;
ALTER TABLE hub_versions ADD COLUMN snapshots_at_ms BIGINT;
