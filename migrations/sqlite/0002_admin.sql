-- The admin plane: accounts and their external identities, App members, server-side sessions,
-- one-time login links, pending OIDC logins, and the audit of admin actions.

CREATE TABLE accounts (
    account_id TEXT PRIMARY KEY,
    display_name TEXT NOT NULL,
    email TEXT,
    platform_admin INTEGER NOT NULL DEFAULT 0,
    blocked_at INTEGER,
    created_at INTEGER NOT NULL
);
CREATE UNIQUE INDEX accounts_email ON accounts (email) WHERE email IS NOT NULL;

-- An external identity (provider, subject) resolves to exactly one account.
CREATE TABLE external_identities (
    provider TEXT NOT NULL,
    subject TEXT NOT NULL,
    account_id TEXT NOT NULL REFERENCES accounts (account_id),
    created_at INTEGER NOT NULL,
    PRIMARY KEY (provider, subject)
);

CREATE TABLE app_members (
    app_id TEXT NOT NULL REFERENCES apps (app_id),
    account_id TEXT NOT NULL REFERENCES accounts (account_id),
    created_at INTEGER NOT NULL,
    PRIMARY KEY (app_id, account_id)
);

-- Only a hash of the session secret is stored.
CREATE TABLE admin_sessions (
    session_hash BLOB PRIMARY KEY,
    account_id TEXT NOT NULL REFERENCES accounts (account_id),
    csrf_token TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    last_seen_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);

CREATE TABLE login_links (
    link_hash BLOB PRIMARY KEY,
    account_id TEXT NOT NULL REFERENCES accounts (account_id),
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    used_at INTEGER
);

CREATE TABLE oidc_logins (
    state TEXT PRIMARY KEY,
    provider TEXT NOT NULL,
    nonce TEXT NOT NULL,
    pkce_verifier TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);

CREATE TABLE admin_audit (
    audit_id TEXT PRIMARY KEY,
    at INTEGER NOT NULL,
    account_id TEXT NOT NULL,
    action TEXT NOT NULL,
    app_id TEXT,
    detail TEXT NOT NULL
);
CREATE INDEX admin_audit_app ON admin_audit (app_id, audit_id);
