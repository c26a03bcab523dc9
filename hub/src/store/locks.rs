//! The database side of holding a key (a workspace, the catalog) against other processes:
//!
//! - SQLite deployments (one host): a `BEGIN IMMEDIATE` on a small lock database of its own per
//!   key, in the lock directory. The operating system enforces it between processes, and it is
//!   released when the connection closes or the process dies.
//! - Postgres deployments (any number of hub processes): a transaction-scoped advisory lock on a
//!   dedicated connection, waited for with `lock_timeout`; released at rollback, or when the
//!   connection drops with its process.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use sqlx::any::AnyPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{AnyPool, Connection, Transaction};

/// A failure other than waiting too long.
#[derive(Debug, thiserror::Error)]
#[error("workspace lock failed: {0}")]
pub struct LockError(String);

/// Where keys are held.
pub enum LockBackend {
    Files(PathBuf),
    Postgres(AnyPool),
}

/// A key held in the database; released by [`HeldLock::release`] or when dropped.
pub enum HeldLock {
    File(SqliteConnection),
    Postgres(Transaction<'static, sqlx::Any>),
}

impl HeldLock {
    pub async fn release(self) {
        match self {
            HeldLock::File(mut conn) => {
                let _ = sqlx::query("ROLLBACK").execute(&mut conn).await;
                let _ = conn.close().await;
            }
            HeldLock::Postgres(tx) => {
                let _ = tx.rollback().await;
            }
        }
    }
}

fn key_digest(key: &str) -> [u8; 32] {
    Sha256::new()
        .chain_update(b"unicas-hub-lock\0")
        .chain_update(key.as_bytes())
        .finalize()
        .into()
}

/// SQLite `SQLITE_BUSY` (5) or Postgres `lock_not_available` (55P03).
fn is_busy(e: &sqlx::Error) -> bool {
    match e.as_database_error() {
        Some(d) => {
            matches!(d.code().as_deref(), Some("5") | Some("55P03"))
                || d.message().contains("database is locked")
        }
        None => false,
    }
}

impl LockBackend {
    /// Lock files under `dir`.
    pub fn files(dir: PathBuf) -> std::io::Result<LockBackend> {
        std::fs::create_dir_all(&dir)?;
        Ok(LockBackend::Files(dir))
    }

    /// Advisory locks on the Postgres database at `url`.
    pub async fn postgres(url: &str) -> Result<LockBackend, sqlx::Error> {
        let pool = AnyPoolOptions::new()
            .max_connections(32)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(30))
            .connect(url)
            .await?;
        Ok(LockBackend::Postgres(pool))
    }

    /// Takes `key`, waiting at most `wait`: `None` when another process held it throughout.
    pub async fn take(&self, key: &str, wait: Duration) -> Result<Option<HeldLock>, LockError> {
        let wait = wait.max(Duration::from_millis(1));
        match self {
            LockBackend::Files(dir) => {
                let path = dir.join(format!(
                    "{}.lock.sqlite3",
                    hex::encode(&key_digest(key)[..16])
                ));
                let opts = SqliteConnectOptions::from_str("sqlite://")
                    .map_err(|e| LockError(e.to_string()))?
                    .filename(&path)
                    .create_if_missing(true)
                    .busy_timeout(wait);
                let mut conn = SqliteConnection::connect_with(&opts)
                    .await
                    .map_err(|e| LockError(format!("cannot open {}: {e}", path.display())))?;
                match sqlx::query("BEGIN IMMEDIATE").execute(&mut conn).await {
                    Ok(_) => Ok(Some(HeldLock::File(conn))),
                    Err(e) if is_busy(&e) => {
                        let _ = conn.close().await;
                        Ok(None)
                    }
                    Err(e) => Err(LockError(e.to_string())),
                }
            }
            LockBackend::Postgres(pool) => {
                let start = Instant::now();
                let mut tx = pool.begin().await.map_err(|e| LockError(e.to_string()))?;
                let left = wait
                    .saturating_sub(start.elapsed())
                    .max(Duration::from_millis(1));
                sqlx::query("SELECT set_config('lock_timeout', $1, true)")
                    .bind(format!("{}ms", left.as_millis().max(1)))
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| LockError(e.to_string()))?;
                let d = key_digest(key);
                let k = i64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]);
                match sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(k)
                    .execute(&mut *tx)
                    .await
                {
                    Ok(_) => Ok(Some(HeldLock::Postgres(tx))),
                    Err(e) if is_busy(&e) => {
                        let _ = tx.rollback().await;
                        Ok(None)
                    }
                    Err(e) => Err(LockError(e.to_string())),
                }
            }
        }
    }

    pub async fn close(&self) {
        if let LockBackend::Postgres(pool) = self {
            pool.close().await;
        }
    }
}
