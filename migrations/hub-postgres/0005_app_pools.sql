-- App pools (seed 003): a notebook served with `marimo run` to many visitors. One pool row per
-- notebook whose `version` moves by one with every change: each admission, departure and
-- retirement is a compare-and-swap on it, retried on conflict, so hub processes over one
-- database never fill a slot twice.
CREATE TABLE hub_app_pools (
    notebook_id   TEXT PRIMARY KEY,
    project_id    TEXT NOT NULL,
    version       BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL
);

-- A pool's sandboxes: each is an app session (`hub_sessions`, mode `app`) serving one revision
-- of the notebook. A starting one counts toward its version's limit until `reserved_until_ms`;
-- `idle_since_ms` is the last lease or grace deadline of a visit it held; `replaced_by` names
-- the member a restart reserved in its place. A `drain_only` member keeps the visits it has and
-- takes no new ones (an app session from before pools).
CREATE TABLE hub_app_members (
    sandbox_id        TEXT PRIMARY KEY,
    notebook_id       TEXT NOT NULL,
    revision          BIGINT,
    reserved_until_ms BIGINT NOT NULL,
    idle_since_ms     BIGINT NOT NULL,
    replaced_by       TEXT,
    drain_only        INTEGER NOT NULL DEFAULT 0 CHECK (drain_only IN (0, 1)),
    created_at_ms     BIGINT NOT NULL
);
CREATE INDEX hub_app_members_notebook ON hub_app_members (notebook_id);

-- One visit slot per browser tab (or API client's visit id): leased, renewed by heartbeats;
-- a departure holds it until `grace_until_ms` for a reconnect.
CREATE TABLE hub_app_visits (
    notebook_id    TEXT NOT NULL,
    user_id        TEXT NOT NULL,
    visit_id       TEXT NOT NULL,
    sandbox_id     TEXT NOT NULL,
    lease_until_ms BIGINT NOT NULL,
    grace_until_ms BIGINT,
    admitted_at_ms BIGINT NOT NULL,
    PRIMARY KEY (notebook_id, user_id, visit_id)
);
CREATE INDEX hub_app_visits_sandbox ON hub_app_visits (sandbox_id);

-- App sessions from before pools join them drain-only, each with its user's `api` visit: they
-- keep serving that user (whose session heartbeats renew the visit) and retire once unused.
INSERT INTO hub_app_pools (notebook_id, project_id, version, updated_at_ms)
    SELECT DISTINCT notebook_id, project_id, 1, CAST(EXTRACT(EPOCH FROM now()) * 1000 AS BIGINT)
    FROM hub_sessions WHERE mode = 'app' AND status IN ('starting', 'running');
INSERT INTO hub_app_members (sandbox_id, notebook_id, revision, reserved_until_ms, idle_since_ms,
                             drain_only, created_at_ms)
    SELECT session_id, notebook_id, opened_revision, 0, CAST(EXTRACT(EPOCH FROM now()) * 1000 AS BIGINT), 1, started_at_ms
    FROM hub_sessions WHERE mode = 'app' AND status IN ('starting', 'running');
INSERT INTO hub_app_visits (notebook_id, user_id, visit_id, sandbox_id, lease_until_ms,
                            admitted_at_ms)
    SELECT notebook_id, user_id, 'api', session_id, CAST(EXTRACT(EPOCH FROM now()) * 1000 AS BIGINT) + 120000, started_at_ms
    FROM hub_sessions WHERE mode = 'app' AND status IN ('starting', 'running');
