-- Browser sign-in to the hub's web UI. Every secret is kept only as its SHA-256 (hex).

-- Signed-in browsers: the HttpOnly cookie's secret, the CSRF token every change must echo,
-- idle (last_seen_at_ms, touched at most once a minute) and absolute expiry.
CREATE TABLE hub_web_sessions (
    secret_hash     TEXT PRIMARY KEY,
    user_id         TEXT NOT NULL,
    csrf_token      TEXT NOT NULL,
    created_at_ms   BIGINT NOT NULL,
    last_seen_at_ms BIGINT NOT NULL,
    expires_at_ms   BIGINT NOT NULL
);
CREATE INDEX hub_web_sessions_user ON hub_web_sessions (user_id);
CREATE INDEX hub_web_sessions_expires ON hub_web_sessions (expires_at_ms);

-- One-time login links printed by `unicas-hub serve` and `unicas-hub user login-link`.
CREATE TABLE hub_login_links (
    secret_hash   TEXT PRIMARY KEY,
    user_id       TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL
);

-- OpenID Connect sign-ins started and not yet finished (their state bound to the browser).
CREATE TABLE hub_oidc_logins (
    login_key     TEXT PRIMARY KEY,
    provider      TEXT NOT NULL,
    nonce         TEXT NOT NULL,
    pkce_verifier TEXT NOT NULL,
    expires_at_ms BIGINT NOT NULL
);

-- Which user an identity of a provider is.
CREATE TABLE hub_user_identities (
    provider      TEXT NOT NULL,
    subject       TEXT NOT NULL,
    user_id       TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (provider, subject)
);
