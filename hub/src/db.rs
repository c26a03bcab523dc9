//! The hub database (SQLite or Postgres through sqlx `Any`): connections, migrations, and write
//! transactions that never deadlock on SQLite (one writer in this process, `BEGIN IMMEDIATE`
//! against other processes).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Executor, Row, Transaction};

use crate::config::HubConfig;

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/hub-sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/hub-postgres");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

#[derive(Clone)]
pub struct Db {
    pub pool: AnyPool,
    pub dialect: Dialect,
    writer: Arc<tokio::sync::Mutex<()>>,
    url: String,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db")
            .field("dialect", &self.dialect)
            .finish_non_exhaustive()
    }
}

/// A write transaction; on SQLite it also holds this process's writer slot.
pub struct WriteTx {
    pub tx: Transaction<'static, sqlx::Any>,
    _local: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl std::ops::Deref for WriteTx {
    type Target = Transaction<'static, sqlx::Any>;
    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl std::ops::DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

impl WriteTx {
    /// The connection, for queries.
    pub fn conn(&mut self) -> &mut sqlx::AnyConnection {
        &mut self.tx
    }

    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.tx.commit().await
    }
}

impl Db {
    pub async fn connect(config: &HubConfig) -> anyhow::Result<Db> {
        sqlx::any::install_default_drivers();
        let url = config.database_url()?;
        let dialect = if url.starts_with("sqlite:") {
            Dialect::Sqlite
        } else {
            Dialect::Postgres
        };
        if dialect == Dialect::Sqlite {
            std::fs::create_dir_all(&config.data_dir)
                .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
        }
        let pool = AnyPoolOptions::new()
            .max_connections(if dialect == Dialect::Sqlite { 8 } else { 16 })
            .acquire_timeout(Duration::from_secs(30))
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    if dialect == Dialect::Sqlite {
                        conn.execute("PRAGMA journal_mode = WAL").await?;
                        conn.execute("PRAGMA busy_timeout = 30000").await?;
                        conn.execute("PRAGMA synchronous = FULL").await?;
                    }
                    Ok(())
                })
            })
            .connect(&url)
            .await
            .with_context(|| {
                format!(
                    "cannot connect to the hub database {}",
                    cas_service::config::redact_url(&url)
                )
            })?;
        Ok(Db {
            pool,
            dialect,
            writer: Arc::new(tokio::sync::Mutex::new(())),
            url,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub async fn migrate(&self) -> anyhow::Result<()> {
        let migrator = match self.dialect {
            Dialect::Sqlite => &SQLITE_MIGRATIONS,
            Dialect::Postgres => &POSTGRES_MIGRATIONS,
        };
        migrator.run(&self.pool).await.context(
            "hub database migration failed (is UNICAS_HUB_DATABASE_URL a database of its own?)",
        )
    }

    /// A write transaction.
    pub async fn write(&self) -> Result<WriteTx, sqlx::Error> {
        match self.dialect {
            Dialect::Sqlite => {
                let local = self.writer.clone().lock_owned().await;
                let tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
                Ok(WriteTx {
                    tx,
                    _local: Some(local),
                })
            }
            Dialect::Postgres => Ok(WriteTx {
                tx: self.pool.begin().await?,
                _local: None,
            }),
        }
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// Column helpers: the `Any` driver hands integers back as `i64`.
pub fn opt_i64(row: &AnyRow, col: &str) -> Result<Option<i64>, sqlx::Error> {
    row.try_get::<Option<i64>, _>(col)
}
