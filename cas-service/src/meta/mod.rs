//! `MetaStore`: the metadata port. Node rows, edges, upload generations, root-ref events and
//! balances, usage rows and the App registry live here, in SQLite (embedded default) or
//! PostgreSQL (scale-out), selected by the database URL.
//!
//! The SQL is written once and runs on both databases through sqlx's `Any` driver; the few
//! places where they differ go through [`Dialect`]. Each database has its own migrations
//! folder. Nothing outside this module writes SQL.
//!
//! **The mutation gate.** Lease begin/finalize, root-ref updates and GC of one (App, Space) run
//! in a [`Gate`]: a write transaction that holds the partition exclusively.
//! - SQLite (one host): one writer at a time in this process (an async mutex), and
//!   `BEGIN IMMEDIATE`, which other processes on the same file respect.
//! - Postgres (many replicas): an in-process lock per partition, then a transaction-scoped
//!   advisory lock keyed by the partition, which serializes replicas; the App revision row
//!   (updated in the same transaction) orders root-ref updates App-wide.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::str::FromStr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use anyhow::Context;
use cas_format::{AppId, Hash, SpaceId};
use sha2::{Digest, Sha256};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{Any, AnyPool, Executor, Row, Transaction};
use tokio::sync::OwnedMutexGuard;

use crate::config::Config;

mod admin;
mod apps;
mod check;
mod gc;
mod nodes;
mod root_refs;
mod usage;

pub use admin::{Account, AuditEntry, LOCAL_OPERATOR, OidcLogin, SessionRecord};
pub use apps::{AppRecord, KeyRecord, RegistryError};
pub use check::{CountMismatch, DanglingEdge};
pub use gc::{Marked, RetiringGeneration};
pub use nodes::{
    Evidence, FinalizeOutcome, GenState, Generation, NodeRow, TargetKind, lease_window,
};
pub use root_refs::{BalanceCursor, RefFilter, RootRefEvent, RootRefRejection};
pub use usage::UsageDelta;

/// Which database the store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// The metadata store.
#[derive(Clone)]
pub struct MetaStore {
    pool: AnyPool,
    dialect: Dialect,
    inner: Arc<Inner>,
}

/// The in-process lock of one partition.
type PartitionLock = tokio::sync::Mutex<()>;

struct Inner {
    /// SQLite: the single in-process writer.
    writer: Arc<tokio::sync::Mutex<()>>,
    /// Postgres: one in-process lock per partition, so that a replica's own requests queue
    /// here rather than on the database.
    partitions: Mutex<HashMap<(String, String), Weak<PartitionLock>>>,
}

impl std::fmt::Debug for MetaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaStore")
            .field("dialect", &self.dialect)
            .finish()
    }
}

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// A write transaction holding a partition (or, for registry changes, the whole store).
pub struct Gate {
    tx: Transaction<'static, Any>,
    _local: OwnedMutexGuard<()>,
}

impl Deref for Gate {
    type Target = Transaction<'static, Any>;
    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl DerefMut for Gate {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

impl Gate {
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.tx.commit().await
    }
}

/// The mutation gate of one (App, Space): a [`Gate`] that knows its partition. Its methods
/// (in the `nodes`, `gc` and `root_refs` modules) are the only partition mutations.
pub struct Partition {
    gate: Gate,
    pub app: AppId,
    pub space: SpaceId,
}

impl Partition {
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.gate.commit().await
    }

    pub(crate) fn tx(&mut self) -> &mut Transaction<'static, Any> {
        &mut self.gate.tx
    }
}

/// The advisory-lock key of a partition: the first 8 bytes of SHA-256 over its names.
fn partition_key(app: &str, space: &str) -> i64 {
    let d = Sha256::new()
        .chain_update(app.as_bytes())
        .chain_update([0u8])
        .chain_update(space.as_bytes())
        .finalize();
    let mut k = [0u8; 8];
    k.copy_from_slice(&d[..8]);
    i64::from_le_bytes(k)
}

/// Raw bytes of a hash for binding.
pub(crate) fn hb(h: &Hash) -> Vec<u8> {
    h.as_bytes().to_vec()
}

/// A hash read back from a row.
pub(crate) fn hash_col(row: &AnyRow, col: &str) -> Result<Hash, sqlx::Error> {
    let bytes: Vec<u8> = row.try_get(col)?;
    Hash::from_slice(&bytes).ok_or_else(|| sqlx::Error::ColumnDecode {
        index: col.to_string(),
        source: "not a 32-byte hash".into(),
    })
}

/// `n` numbered placeholders starting at `$first`, comma-separated.
pub(crate) fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl MetaStore {
    /// Connects (creating the SQLite file and its directory if needed). Does not migrate.
    pub async fn connect(config: &Config) -> anyhow::Result<Self> {
        sqlx::any::install_default_drivers();
        let url = config.database_url()?;
        let dialect = if url.starts_with("sqlite:") {
            Dialect::Sqlite
        } else {
            Dialect::Postgres
        };
        if dialect == Dialect::Sqlite && config.database_url.is_none() {
            std::fs::create_dir_all(&config.data_dir)
                .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
        }
        let synchronous = config.sqlite_synchronous.clone();
        let pool = AnyPoolOptions::new()
            .max_connections(config.database_max_connections)
            .acquire_timeout(Duration::from_secs(30))
            .after_connect(move |conn, _meta| {
                let synchronous = synchronous.clone();
                Box::pin(async move {
                    if dialect == Dialect::Sqlite {
                        conn.execute("PRAGMA journal_mode = WAL").await?;
                        conn.execute("PRAGMA busy_timeout = 30000").await?;
                        conn.execute("PRAGMA foreign_keys = ON").await?;
                        let sync = if synchronous == "normal" {
                            "PRAGMA synchronous = NORMAL"
                        } else {
                            "PRAGMA synchronous = FULL"
                        };
                        conn.execute(sync).await?;
                    }
                    Ok(())
                })
            })
            .connect(&url)
            .await
            .with_context(|| {
                format!(
                    "cannot connect to the database {}",
                    crate::config::redact_url(&url)
                )
            })?;
        Ok(MetaStore {
            pool,
            dialect,
            inner: Arc::new(Inner {
                writer: Arc::new(tokio::sync::Mutex::new(())),
                partitions: Mutex::new(HashMap::new()),
            }),
        })
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Applies pending migrations.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        let migrator = match self.dialect {
            Dialect::Sqlite => &SQLITE_MIGRATIONS,
            Dialect::Postgres => &POSTGRES_MIGRATIONS,
        };
        migrator
            .run(&self.pool)
            .await
            .context("database migration failed")?;
        Ok(())
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    fn partition_lock(&self, app: &str, space: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self
            .inner
            .partitions
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let key = (app.to_string(), space.to_string());
        if let Some(lock) = map.get(&key).and_then(Weak::upgrade) {
            return lock;
        }
        if map.len() > 1024 {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        map.insert(key, Arc::downgrade(&lock));
        lock
    }

    /// Opens the mutation gate of a partition.
    pub async fn gate(&self, app: &AppId, space: &SpaceId) -> Result<Partition, sqlx::Error> {
        let gate = match self.dialect {
            Dialect::Sqlite => self.sqlite_write().await?,
            Dialect::Postgres => {
                let local = self
                    .partition_lock(app.as_str(), space.as_str())
                    .lock_owned()
                    .await;
                let mut tx = self.pool.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(partition_key(app.as_str(), space.as_str()))
                    .execute(&mut *tx)
                    .await?;
                Gate { tx, _local: local }
            }
        };
        Ok(Partition {
            gate,
            app: app.clone(),
            space: space.clone(),
        })
    }

    /// A write transaction outside any partition (registry and admin changes).
    pub async fn write(&self) -> Result<Gate, sqlx::Error> {
        match self.dialect {
            Dialect::Sqlite => self.sqlite_write().await,
            Dialect::Postgres => {
                // Registry writes touch no partition; a fresh, uncontended lock keeps the type.
                let local = Arc::new(tokio::sync::Mutex::new(())).lock_owned().await;
                let tx = self.pool.begin().await?;
                Ok(Gate { tx, _local: local })
            }
        }
    }

    async fn sqlite_write(&self) -> Result<Gate, sqlx::Error> {
        let local = self.inner.writer.clone().lock_owned().await;
        let tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        Ok(Gate { tx, _local: local })
    }

    /// A service-wide secret (created on first use), e.g. the upload-URL signing key.
    pub async fn secret(&self, name: &str) -> Result<Vec<u8>, sqlx::Error> {
        if let Some(row) = sqlx::query("SELECT secret FROM service_secrets WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?
        {
            return row.try_get("secret");
        }
        let fresh: [u8; 32] = rand::random();
        let mut w = self.write().await?;
        sqlx::query("INSERT INTO service_secrets (name, secret) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING")
            .bind(name)
            .bind(fresh.to_vec())
            .execute(&mut **w)
            .await?;
        let row = sqlx::query("SELECT secret FROM service_secrets WHERE name = $1")
            .bind(name)
            .fetch_one(&mut **w)
            .await?;
        w.commit().await?;
        row.try_get("secret")
    }
}

/// Parses a column holding one of our identifier types.
pub(crate) fn id_col<T: FromStr>(row: &AnyRow, col: &str) -> Result<T, sqlx::Error>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let s: String = row.try_get(col)?;
    s.parse().map_err(|e: T::Err| sqlx::Error::ColumnDecode {
        index: col.to_string(),
        source: Box::new(e),
    })
}
