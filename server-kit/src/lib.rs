//! What both server programs (`unicas-server` and `unicas-hub`) stand on, and nothing of what
//! either one does: SQL pools and write transactions on SQLite and Postgres ([`sql`]),
//! many writes per durable commit ([`group_commit`]) and SQLite commits made durable after the writer is released ([`wal_sync`]), where `/metrics` listens ([`listen`]) and what it counts of every answer ([`http_metrics`]), the
//! checks every browser-facing listener makes ([`web_guard`]), browser sign-in: secrets,
//! cookies and login-link pages ([`web_auth`]) and OpenID Connect ([`oidc`]), failpoints for crash tests
//! ([`failpoint`]) and the process runtime ([`runtime`]).
#![forbid(unsafe_code)]

pub mod failpoint;
pub mod group_commit;
pub mod http_metrics;
pub mod listen;
pub mod oidc;
pub mod runtime;
pub mod sql;
pub mod wal_sync;
pub mod web_auth;
pub mod web_guard;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
