//! Holding a workspace (or the catalog) against every other writer, in this process and in
//! others, for a bounded wait.
//!
//! - SQLite deployments (one host): a `BEGIN IMMEDIATE` on a small lock database of its own per
//!   key, in the lock directory. The operating system enforces it between processes, and it is
//!   released when the connection closes or the process dies.
//! - Postgres deployments (any number of hub processes): a transaction-scoped advisory lock on a
//!   dedicated connection, waited for with `lock_timeout`; released at rollback, or when the
//!   connection drops with its process.
//!
//! In both, writers of one process first queue on an in-process mutex per key, so the database
//! sees at most one waiter per key and process. A writer that cannot take the key within the
//! wait gets [`Busy`] and must write nothing.

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use sqlx::any::AnyPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{AnyPool, Connection, Transaction};

/// The key could not be taken within the wait.
#[derive(Debug, Clone, Copy)]
pub struct Busy {
    pub waited: Duration,
}

/// A failure other than waiting too long.
#[derive(Debug, thiserror::Error)]
#[error("workspace lock failed: {0}")]
pub struct LockError(String);

enum Backend {
    Files(PathBuf),
    Postgres(AnyPool),
}

pub struct Locks {
    backend: Backend,
    local: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

enum Held {
    File(SqliteConnection),
    Postgres(Transaction<'static, sqlx::Any>),
}

/// A held key. Dropping it releases it; [`Guard::release`] does so promptly.
pub struct Guard {
    held: Option<Held>,
    _local: tokio::sync::OwnedMutexGuard<()>,
    pub key: String,
}

impl Guard {
    pub async fn release(mut self) {
        match self.held.take() {
            Some(Held::File(mut conn)) => {
                let _ = sqlx::query("ROLLBACK").execute(&mut conn).await;
                let _ = conn.close().await;
            }
            Some(Held::Postgres(tx)) => {
                let _ = tx.rollback().await;
            }
            None => {}
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

impl Locks {
    /// Lock files under `dir`.
    pub fn files(dir: PathBuf) -> std::io::Result<Locks> {
        std::fs::create_dir_all(&dir)?;
        Ok(Locks {
            backend: Backend::Files(dir),
            local: Mutex::new(HashMap::new()),
        })
    }

    /// Advisory locks on the Postgres database at `url`.
    pub async fn postgres(url: &str) -> Result<Locks, sqlx::Error> {
        let pool = AnyPoolOptions::new()
            .max_connections(32)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(30))
            .connect(url)
            .await?;
        Ok(Locks {
            backend: Backend::Postgres(pool),
            local: Mutex::new(HashMap::new()),
        })
    }

    fn local(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.local.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = map.get(key).and_then(Weak::upgrade) {
            return m;
        }
        map.retain(|_, w| w.strong_count() > 0);
        let m = Arc::new(tokio::sync::Mutex::new(()));
        map.insert(key.to_string(), Arc::downgrade(&m));
        m
    }

    /// Takes `key`, waiting at most `wait`.
    pub async fn acquire(
        &self,
        key: &str,
        wait: Duration,
    ) -> Result<Result<Guard, Busy>, LockError> {
        let start = Instant::now();
        let local = match tokio::time::timeout(wait, self.local(key).lock_owned()).await {
            Ok(g) => g,
            Err(_) => return Ok(Err(Busy { waited: wait })),
        };
        let left = wait
            .saturating_sub(start.elapsed())
            .max(Duration::from_millis(1));
        let held = match &self.backend {
            Backend::Files(dir) => {
                let path = dir.join(format!(
                    "{}.lock.sqlite3",
                    hex::encode(&key_digest(key)[..16])
                ));
                let opts = SqliteConnectOptions::from_str("sqlite://")
                    .map_err(|e| LockError(e.to_string()))?
                    .filename(&path)
                    .create_if_missing(true)
                    .busy_timeout(left);
                let mut conn = SqliteConnection::connect_with(&opts)
                    .await
                    .map_err(|e| LockError(format!("cannot open {}: {e}", path.display())))?;
                match sqlx::query("BEGIN IMMEDIATE").execute(&mut conn).await {
                    Ok(_) => Held::File(conn),
                    Err(e) if is_busy(&e) => {
                        let _ = conn.close().await;
                        return Ok(Err(Busy {
                            waited: start.elapsed(),
                        }));
                    }
                    Err(e) => return Err(LockError(e.to_string())),
                }
            }
            Backend::Postgres(pool) => {
                let mut tx = pool.begin().await.map_err(|e| LockError(e.to_string()))?;
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
                    Ok(_) => Held::Postgres(tx),
                    Err(e) if is_busy(&e) => {
                        let _ = tx.rollback().await;
                        return Ok(Err(Busy {
                            waited: start.elapsed(),
                        }));
                    }
                    Err(e) => return Err(LockError(e.to_string())),
                }
            }
        };
        Ok(Ok(Guard {
            held: Some(held),
            _local: local,
            key: key.to_string(),
        }))
    }

    pub async fn close(&self) {
        if let Backend::Postgres(pool) = &self.backend {
            pool.close().await;
        }
    }
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
