//! SQL pools on SQLite (the embedded default) or Postgres (scale-out) through sqlx's `Any`
//! driver, and write transactions that never deadlock on SQLite: one writer at a time in this
//! process (an async mutex) and `BEGIN IMMEDIATE`, which other processes on the same file
//! respect. On Postgres a write transaction is a plain one; callers that need more (an
//! advisory lock) take it inside.

use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sqlx::any::AnyPoolOptions;
use sqlx::migrate::Migrator;
use sqlx::{Any, AnyPool, Executor, Transaction};
use tokio::sync::OwnedMutexGuard;

use crate::wal_sync::{Pending, WalSync};

/// Which database a pool talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// The dialect of a database URL (`sqlite:…` or `postgres(ql)://…`).
    pub fn of_url(url: &str) -> anyhow::Result<Dialect> {
        if url.starts_with("sqlite:") {
            Ok(Dialect::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Dialect::Postgres)
        } else {
            anyhow::bail!("a database URL starts with sqlite: or postgres://")
        }
    }
}

/// How to open a pool.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    pub url: String,
    pub max_connections: u32,
    /// SQLite: every commit durable (readers `FULL`; the writer's commits fsynced by
    /// [`WalSync`] once it is free) unless `false` (`NORMAL`: the log is fsynced only at
    /// checkpoints).
    pub sqlite_full_sync: bool,
    /// SQLite: a directory to create first (the data directory of the default URL).
    pub create_dir: Option<PathBuf>,
}

/// A pool and its dialect.
#[derive(Clone)]
pub struct SqlPool {
    pool: AnyPool,
    /// SQLite: the one connection that write transactions use.
    writes: Option<AnyPool>,
    dialect: Dialect,
    url: String,
    /// SQLite: the single in-process writer.
    writer: Arc<tokio::sync::Mutex<()>>,
    /// SQLite with durable commits: the log the writer's commits are fsynced in after it is
    /// released.
    wal: Option<Arc<WalSync>>,
}

impl std::fmt::Debug for SqlPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlPool")
            .field("dialect", &self.dialect)
            .finish_non_exhaustive()
    }
}

/// A write transaction; on SQLite it also holds this process's writer slot.
pub struct WriteTx {
    tx: Transaction<'static, Any>,
    _local: Option<OwnedMutexGuard<()>>,
    /// SQLite with durable commits: where the commit is made durable.
    wal: Option<Arc<WalSync>>,
}

impl Deref for WriteTx {
    type Target = Transaction<'static, Any>;
    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

impl WriteTx {
    /// A write transaction whose caller serializes writers itself (Postgres callers that
    /// queue per key, see [`crate::group_commit`], before taking an advisory lock).
    pub fn from_tx(tx: Transaction<'static, Any>) -> Self {
        WriteTx {
            tx,
            _local: None,
            wal: None,
        }
    }

    /// The connection, for queries.
    pub fn conn(&mut self) -> &mut sqlx::AnyConnection {
        &mut self.tx
    }

    /// Commits and returns once the commit is durable (on SQLite, after releasing the writer:
    /// see [`crate::wal_sync`]).
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.commit_visible().await?.durable().await
    }

    /// Commits and releases the writer; the commit is durable once the answer's
    /// [`Pending::durable`] returns Ok. Whoever answers for the commit must wait for that.
    pub async fn commit_visible(self) -> Result<Pending, sqlx::Error> {
        let WriteTx { tx, _local, wal } = self;
        tx.commit().await?;
        // The ticket is taken while the writer is still held: tickets follow the log.
        let pending = match &wal {
            Some(wal) => wal.committed(),
            None => Pending::durable_now(),
        };
        drop(_local);
        Ok(pending)
    }
}

/// `n` numbered placeholders starting at `$first`, comma-separated: the list of an `IN (…)`
/// or of a `VALUES` tuple.
pub fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The placeholders of a statement in the order its values are bound: `$1, $2, …` on
/// Postgres, anonymous `?` on SQLite. SQLite keeps a numbered placeholder as a name, and
/// binding looks each one up through all the names of its statement: n² work for a statement
/// of n parameters, which made binding the largest cost of the multi-row statements. So a
/// statement built with `Binds` binds its values in the order its placeholders appear in its
/// text, each value once (a value used in every row is bound again for every row).
#[derive(Debug)]
pub struct Binds {
    dialect: Dialect,
    count: usize,
}

impl Binds {
    pub fn new(dialect: Dialect) -> Self {
        Binds { dialect, count: 0 }
    }

    /// The dialect the placeholders are written in.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The next placeholder.
    pub fn one(&mut self) -> String {
        self.count += 1;
        match self.dialect {
            Dialect::Sqlite => "?".to_string(),
            Dialect::Postgres => format!("${}", self.count),
        }
    }

    /// `n` placeholders, comma-separated: the list of an `IN (…)` or of a `VALUES` tuple.
    pub fn list(&mut self, n: usize) -> String {
        (0..n).map(|_| self.one()).collect::<Vec<_>>().join(", ")
    }

    /// `rows` parenthesized tuples of `width` placeholders each, comma-separated: the rows of
    /// a `VALUES` list.
    pub fn rows(&mut self, rows: usize, width: usize) -> String {
        (0..rows)
            .map(|_| format!("({})", self.list(width)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Hides the password of a URL (`postgres://user:secret@host` → `postgres://user:***@host`).
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let Some(at) = rest.find('@') else {
        return url.to_string();
    };
    match rest[..at].find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end + 3],
            &rest[..colon],
            &rest[at..]
        ),
        None => url.to_string(),
    }
}

/// How often the SQLite write-ahead log is checkpointed beside the writers.
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);
/// WAL pages after which a commit checkpoints by itself (the background checkpoints keep the
/// log far below it).
const WAL_AUTOCHECKPOINT_PAGES: u32 = 16_384;

/// Page cache of each SQLite connection, at most, in KiB (SQLite's default is 2,000): the
/// index pages that writes keyed by hash touch at random stay cached between commits.
const CACHE_KIB: u32 = 32 * 1024;

/// The settings of every SQLite connection: write-ahead log, the busy timeout, foreign keys,
/// checkpoints left to [`checkpoints`], durability, statement journals in memory (a
/// statement of a savepoint's batch journals every page it changes first; on disk that is a
/// temporary file created and removed per statement), and the page cache.
async fn sqlite_settings(
    conn: &mut sqlx::AnyConnection,
    full_sync: bool,
) -> Result<(), sqlx::Error> {
    conn.execute("PRAGMA journal_mode = WAL").await?;
    conn.execute("PRAGMA busy_timeout = 30000").await?;
    conn.execute("PRAGMA foreign_keys = ON").await?;
    conn.execute("PRAGMA temp_store = MEMORY").await?;
    conn.execute(sqlx::AssertSqlSafe(format!(
        "PRAGMA cache_size = -{CACHE_KIB}"
    )))
    .await?;
    // Checkpoints run beside the writers (see `checkpoints`); a commit checkpoints itself only
    // if they fall this far behind.
    conn.execute(sqlx::AssertSqlSafe(format!(
        "PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}"
    )))
    .await?;
    conn.execute(if full_sync {
        "PRAGMA synchronous = FULL"
    } else {
        "PRAGMA synchronous = NORMAL"
    })
    .await?;
    Ok(())
}

/// The file of a SQLite pool's main database (`None` in memory).
async fn database_file(pool: &AnyPool) -> Result<Option<PathBuf>, sqlx::Error> {
    let file: Option<String> =
        sqlx::query_scalar("SELECT file FROM pragma_database_list WHERE name = 'main'")
            .fetch_optional(pool)
            .await?;
    Ok(file.filter(|f| !f.is_empty()).map(PathBuf::from))
}

/// Copies the SQLite write-ahead log into the database file every [`CHECKPOINT_EVERY`] until
/// the pool closes or its last [`SqlPool`] is gone (`alive`), so that no request's commit pays
/// for a checkpoint (two fsyncs and the copy). Passive: it never waits for, or blocks, a
/// reader or the writer.
async fn checkpoints(pool: AnyPool, alive: std::sync::Weak<tokio::sync::Mutex<()>>) {
    let mut tick = tokio::time::interval(CHECKPOINT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if pool.is_closed() || alive.strong_count() == 0 {
            return;
        }
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .execute(&pool)
            .await
            && !pool.is_closed()
        {
            tracing::warn!(error = %e, "a WAL checkpoint failed");
        }
    }
}

impl SqlPool {
    /// Connects (creating the SQLite file and its directory if needed). Does not migrate.
    pub async fn connect(options: PoolOptions) -> anyhow::Result<SqlPool> {
        sqlx::any::install_default_drivers();
        let dialect = Dialect::of_url(&options.url)?;
        if dialect == Dialect::Sqlite
            && let Some(dir) = &options.create_dir
        {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create data dir {}", dir.display()))?;
        }
        let full_sync = options.sqlite_full_sync;
        // `synchronous`: `FULL` for durable commits, except on the writer connection of a
        // durable database, whose commits `WalSync` makes durable after the writer is released.
        let open = |options: AnyPoolOptions, full_sync: bool| {
            options
                .acquire_timeout(Duration::from_secs(30))
                // No ping before each use: a round trip per statement batch on Postgres and a
                // worker hop on SQLite; a broken connection fails its statement and is
                // replaced.
                .test_before_acquire(false)
                .after_connect(move |conn, _meta| {
                    Box::pin(async move {
                        if dialect == Dialect::Sqlite {
                            sqlite_settings(conn, full_sync).await?;
                        }
                        Ok(())
                    })
                })
        };
        let connected = |e| {
            anyhow::Error::new(e).context(format!(
                "cannot connect to the database {}",
                redact_url(&options.url)
            ))
        };
        let pool = open(
            AnyPoolOptions::new().max_connections(options.max_connections),
            full_sync,
        )
        .connect(&options.url)
        .await
        .map_err(connected)?;
        // SQLite: every write transaction on one connection, kept open. A connection's page
        // cache survives only its own commits (one that finds the database changed by another
        // connection starts cold), so a writer that moved over the pool would begin each
        // transaction by reading the pages it touches back from the operating system.
        let writes = match dialect {
            Dialect::Sqlite => Some(
                open(
                    AnyPoolOptions::new()
                        .max_connections(1)
                        .idle_timeout(None)
                        .max_lifetime(None),
                    false,
                )
                .connect(&options.url)
                .await
                .map_err(connected)?,
            ),
            Dialect::Postgres => None,
        };
        let writer = Arc::new(tokio::sync::Mutex::new(()));
        if dialect == Dialect::Sqlite {
            tokio::spawn(checkpoints(pool.clone(), Arc::downgrade(&writer)));
        }
        let wal = match &writes {
            Some(writes) if full_sync => Some(database_file(writes).await.map_err(connected)?),
            _ => None,
        }
        .flatten()
        .map(WalSync::new);
        Ok(SqlPool {
            pool,
            writes,
            dialect,
            url: options.url,
            writer,
            wal,
        })
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// The URL it was opened with (secrets included: never print it unredacted).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Applies the pending migrations of this pool's dialect.
    pub async fn migrate(&self, sqlite: &Migrator, postgres: &Migrator) -> anyhow::Result<()> {
        let migrator = match self.dialect {
            Dialect::Sqlite => sqlite,
            Dialect::Postgres => postgres,
        };
        migrator
            .run(&self.pool)
            .await
            .context("database migration failed")?;
        if self.dialect == Dialect::Postgres {
            let autovacuum: Option<String> =
                sqlx::query_scalar("SELECT current_setting('autovacuum')")
                    .fetch_optional(&self.pool)
                    .await
                    .ok()
                    .flatten();
            if autovacuum.as_deref() == Some("off") {
                tracing::warn!(
                    "PostgreSQL runs with autovacuum off: without statistics the planner may \
                     scan a whole partition for one row, and updated rows leave dead versions \
                     behind; turn it on, or ANALYZE and VACUUM the database regularly"
                );
            }
        }
        Ok(())
    }

    /// A write transaction.
    pub async fn write(&self) -> Result<WriteTx, sqlx::Error> {
        match self.dialect {
            Dialect::Sqlite => {
                let local = self.writer.clone().lock_owned().await;
                let pool = self.writes.as_ref().unwrap_or(&self.pool);
                let tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                Ok(WriteTx {
                    tx,
                    _local: Some(local),
                    wal: self.wal.clone(),
                })
            }
            Dialect::Postgres => Ok(WriteTx::from_tx(self.pool.begin().await?)),
        }
    }

    /// A read-only transaction whose reads all see one snapshot of the database (SQLite: a
    /// deferred transaction, whose first read fixes the snapshot; Postgres: repeatable read).
    pub async fn snapshot(&self) -> Result<Transaction<'static, Any>, sqlx::Error> {
        match self.dialect {
            Dialect::Sqlite => self.pool.begin_with("BEGIN DEFERRED").await,
            Dialect::Postgres => {
                self.pool
                    .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .await
            }
        }
    }

    /// SQLite with durable commits: the write-ahead log its commits are fsynced in.
    #[cfg(test)]
    pub(crate) fn wal(&self) -> Option<&Arc<WalSync>> {
        self.wal.as_ref()
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }

    pub async fn close(&self) {
        if let Some(writes) = &self.writes {
            writes.close().await;
        }
        self.pool.close().await;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("sqlite://x.db"), "sqlite://x.db");
    }

    #[test]
    fn dialects_of_urls() {
        assert_eq!(
            Dialect::of_url("sqlite://x?mode=rwc").ok(),
            Some(Dialect::Sqlite)
        );
        assert_eq!(
            Dialect::of_url("postgresql://h/db").ok(),
            Some(Dialect::Postgres)
        );
        assert!(Dialect::of_url("mysql://h/db").is_err());
    }

    #[test]
    fn binds_number_postgres_placeholders_in_text_order() {
        let mut b = Binds::new(Dialect::Postgres);
        let rows = b.rows(2, 2);
        let last = b.one();
        assert_eq!(format!("{rows} {last}"), "($1, $2), ($3, $4) $5");
        let mut b = Binds::new(Dialect::Sqlite);
        assert_eq!(b.rows(2, 2), "(?, ?), (?, ?)");
        assert_eq!(b.list(3), "?, ?, ?");
    }

    /// A SQLite pool in a directory of its own (removed by the caller) with a table `t` of
    /// `columns`.
    pub(crate) async fn table_t(name: &str, connections: u32, columns: &str) -> (SqlPool, PathBuf) {
        let dir = std::env::temp_dir().join(format!("server-kit-{name}-{}", std::process::id()));
        let pool = SqlPool::connect(PoolOptions {
            url: format!("sqlite://{}/t.db?mode=rwc", dir.display()),
            max_connections: connections,
            sqlite_full_sync: true,
            create_dir: Some(dir.clone()),
        })
        .await
        .expect("pool");
        let mut w = pool.write().await.expect("write");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE TABLE t ({columns})")))
            .execute(w.conn())
            .await
            .expect("create");
        w.commit().await.expect("commit");
        (pool, dir)
    }

    /// Anonymous placeholders take the values in the order of the text, including values
    /// after a `VALUES` list (as the multi-row updates bind them).
    #[tokio::test]
    async fn sqlite_binds_follow_the_text() {
        let (pool, dir) = table_t("binds", 1, "k TEXT, n INTEGER, v INTEGER").await;
        let mut w = pool.write().await.expect("write");
        let mut b = Binds::new(Dialect::Sqlite);
        let values = b.rows(3, 3);
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO t (k, n, v) VALUES {values}"
        )));
        for n in 0..3i64 {
            q = q.bind("a").bind(n).bind(0i64);
        }
        q.execute(w.conn()).await.expect("insert");
        let mut b = Binds::new(Dialect::Sqlite);
        let values = b.rows(2, 2);
        let k = b.one();
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE t SET v = x.column2 FROM (VALUES {values}) AS x \
             WHERE t.k = {k} AND t.n = x.column1"
        )));
        for (n, v) in [(0i64, 10i64), (2, 12)] {
            q = q.bind(n).bind(v);
        }
        q.bind("a").execute(w.conn()).await.expect("update");
        let got: Vec<(i64, i64)> = sqlx::query_as("SELECT n, v FROM t ORDER BY n")
            .fetch_all(w.conn())
            .await
            .expect("read");
        assert_eq!(got, vec![(0, 10), (1, 0), (2, 12)]);
        drop(w);
        pool.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn writers_of_one_sqlite_file_take_turns() {
        let (pool, dir) = table_t("writers", 4, "n INTEGER").await;
        let writes = (0..8).map(|i| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut w = pool.write().await.expect("write");
                sqlx::query("INSERT INTO t (n) VALUES ($1)")
                    .bind(i64::from(i))
                    .execute(w.conn())
                    .await
                    .expect("insert");
                w.commit().await.expect("commit");
            })
        });
        for w in writes {
            w.await.expect("task");
        }
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t")
            .fetch_one(pool.pool())
            .await
            .expect("count");
        assert_eq!(n, 8);
        pool.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }
}
