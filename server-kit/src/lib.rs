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

/// Makes jemalloc the global allocator of the server binary that calls it at its top level
/// (`unicas-server`, `unicas-hub` and their test builds; the binary depends on
/// `tikv-jemallocator` itself, so that no other program linking this crate takes it): a
/// server's requests allocate and free many small buffers across threads (see
/// ARCHITECTURE.md, "The allocator").
#[macro_export]
macro_rules! server_allocator {
    () => {
        #[global_allocator]
        static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
    };
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
