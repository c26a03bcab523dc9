//! `MetaStore`: the metadata port. Node rows, edges, upload generations, root-ref events and
//! balances, usage rows and the App registry live here, in SQLite (embedded default) or
//! PostgreSQL (scale-out), selected by the database URL.
//!
//! The SQL is written once and runs on both databases through sqlx's `Any` driver; the few
//! places where they differ go through [`Dialect`]. Each database has its own migrations
//! folder. Nothing outside this module writes SQL.
//!
//! **The mutation gate.** Lease begin/finalize, root-ref updates and GC of one (App, Space) run
//! in a [`Partition`]: one operation that holds the partition exclusively, inside a savepoint
//! of a write transaction that several operations share ([`server_kit::group_commit`]): the
//! operations that arrive while one runs are committed together, each answered only after that
//! commit, and one that fails is rolled back alone.
//! - SQLite (one host): one batch at a time in this process for the whole database, in
//!   `BEGIN IMMEDIATE`, which other processes on the same file respect.
//! - Postgres (many replicas): one batch at a time per partition in this process, whose
//!   transaction takes an advisory lock keyed by the partition once, which serializes
//!   replicas; the App revision row (updated in the same transaction) orders root-ref updates
//!   App-wide.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use cas_format::{AppId, Hash, SpaceId};
use server_kit::group_commit::{CommitObserver, GroupCommit, Operation, Settled};
pub(crate) use server_kit::sql::Binds;
use server_kit::sql::{PoolOptions, SqlPool, WriteTx};
use sha2::{Digest, Sha256};
use sqlx::any::AnyRow;
use sqlx::{Any, AnyPool, Row, Transaction};

use crate::config::Config;

mod admin;
mod apps;
mod check;
mod deltas;
mod gc;
mod generations;
mod nodes;
mod object_names;
mod packs;
mod publish;
mod root_ref_adding;
mod root_ref_memo;
mod root_ref_plan;
mod root_ref_reads;
mod root_ref_writes;
mod root_refs;
mod usage;

pub use admin::{Account, AuditEntry, LOCAL_OPERATOR, OidcLogin, SessionRecord};
pub use apps::{AppRecord, KeyRecord, RegistryError};
pub use check::{CountMismatch, DanglingEdge};
pub use gc::{Backlog, Marked, RetiringGeneration};
pub use generations::{Evidence, GenState, Generation, TargetKind};
pub use nodes::{DeltaBase, FinalizeOutcome, NodeRow, PackSpan, StoredObject};
pub use object_names::parse_object_name;
pub use packs::{PackRow, PackState, PackedEntry};
pub use publish::Publication;
pub use root_ref_memo::RootRefCheck;
pub use root_ref_reads::{
    Balance, BalanceCursor, BalanceMap, BalanceReadError, MAX_UNDONE_CHANGES, RefFilter,
    RootRefEvent, sum_over_domains,
};
pub use root_refs::{
    MAX_BATCH_HASHES, MAX_ROOT_REF_COUNT, RootRefChange, RootRefOutcome, RootRefRejection,
};
pub use usage::UsageDelta;

pub use server_kit::sql::Dialect;

/// The metadata store.
#[derive(Clone)]
pub struct MetaStore {
    sql: SqlPool,
    pool: AnyPool,
    dialect: Dialect,
    inner: Arc<Inner>,
}

struct Inner {
    /// SQLite: the group commit of the database.
    database: GroupCommit,
    /// Postgres: one group commit per partition, so that a replica's own requests queue (and
    /// batch) here rather than on the database.
    partitions: Mutex<HashMap<(String, String), GroupCommit>>,
    observer: Option<CommitObserver>,
    /// Postgres: what each partition's root refs stand at, held between batches.
    memos: Arc<root_ref_memo::Memos>,
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
pub type Gate = WriteTx;

/// The mutation gate of one (App, Space): one operation of a write batch that knows its
/// partition. Its methods (in the `nodes`, `gc` and `root_refs` modules) are the only
/// partition mutations. Dropped without [`Partition::commit`], it changes nothing.
pub struct Partition {
    op: Operation,
    dialect: Dialect,
    pub app: AppId,
    pub space: SpaceId,
    memos: Arc<root_ref_memo::Memos>,
    /// How the operation's root-ref batch was checked, if it applied one.
    checked: Option<RootRefCheck>,
    /// The batch whose root-ref writes the operation entered in the partition's memo: they
    /// become usable by later batches once its commit succeeds.
    remembered: Option<u64>,
}

impl Partition {
    /// Commits the operation (with the others of its batch); `Ok` means durable.
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.finish(false).await
    }

    /// As [`Partition::commit`], when another operation of this partition is on its way
    /// (queued for another task): the batch stays open for it. Whoever finds it did not come
    /// after all calls [`MetaStore::flush`].
    pub async fn commit_followed(self) -> Result<(), sqlx::Error> {
        self.finish(true).await
    }

    async fn finish(self, followed: bool) -> Result<(), sqlx::Error> {
        let (memos, key) = (self.memos, (self.app, self.space));
        let settled = self
            .remembered
            .map(|batch| -> Settled { Box::new(move |ok| memos.settle(&key, batch, ok)) });
        self.op.commit_then(followed, settled).await
    }

    /// How the operation's root-ref batch was checked (Postgres), if it applied one.
    pub fn root_refs_checked(&self) -> Option<RootRefCheck> {
        self.checked
    }

    pub(crate) fn tx(&mut self) -> &mut Transaction<'static, Any> {
        self.op.tx()
    }

    /// Opens the operation's savepoint if it was held without one (see
    /// [`MetaStore::root_ref_gate`]): from now on it fails alone.
    pub(crate) async fn protect(&mut self) -> Result<(), sqlx::Error> {
        self.op.protect().await
    }

    /// The placeholders of a new statement.
    pub(crate) fn binds(&self) -> Binds {
        Binds::new(self.dialect)
    }

    /// A new statement of this store's dialect.
    pub(crate) fn statement(&self) -> Statement {
        Statement::new(self.dialect)
    }

    /// The rows a query of the partition finds for the distinct `hashes`, a statement per
    /// [`ROWS_PER_STATEMENT`]: `sql(app, space, list)` writes it from the placeholders of
    /// the App, the Space and the list of hashes, in that order in its text.
    pub(crate) async fn rows_by_hashes(
        &mut self,
        hashes: &[Hash],
        sql: impl Fn(&str, &str, &str) -> String,
    ) -> Result<Vec<AnyRow>, sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        let mut seen = std::collections::HashSet::new();
        let distinct: Vec<&Hash> = hashes.iter().filter(|h| seen.insert(**h)).collect();
        let mut rows = Vec::new();
        for part in distinct.chunks(ROWS_PER_STATEMENT) {
            let mut b = self.binds();
            let (a, s, list) = (b.one(), b.one(), b.list(part.len()));
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql(&a, &s, &list)))
                .bind(app.as_str())
                .bind(space.as_str());
            for h in part {
                q = q.bind(hb(h));
            }
            rows.extend(q.fetch_all(&mut **self.tx()).await?);
        }
        Ok(rows)
    }
}

/// A value bound to a statement built piece by piece.
#[derive(Debug, Clone)]
pub(crate) enum Value {
    Text(String),
    Bytes(Vec<u8>),
    Int(i64),
}

/// A statement written piece by piece with its values: each value's placeholder is written
/// where the value is given, so the values are bound in the order of the text (see
/// [`Binds`]).
pub(crate) struct Statement {
    sql: String,
    binds: Binds,
    values: Vec<Value>,
}

impl Statement {
    pub(crate) fn new(dialect: Dialect) -> Self {
        Statement {
            sql: String::new(),
            binds: Binds::new(dialect),
            values: Vec::new(),
        }
    }

    /// Appends `{alias}app_id = … AND {alias}space_id = … AND {alias}hash IN (…)` for `hashes`
    /// of one partition: the partition bound once and the hashes listed, which SQLite plans
    /// as a seek of each node, also in an update whose other conditions make it plan
    /// [`Statement::update_nodes`] as a scan of the table.
    pub(crate) fn nodes_in<'a>(
        &mut self,
        alias: &str,
        (app, space): (&str, &str),
        hashes: impl IntoIterator<Item = &'a Hash>,
    ) -> &mut Self {
        self.text(&format!("{alias}app_id = "))
            .value(Value::Text(app.to_string()))
            .text(&format!(" AND {alias}space_id = "))
            .value(Value::Text(space.to_string()))
            .text(&format!(" AND {alias}hash IN "))
            .tuple(hashes.into_iter().map(|h| Value::Bytes(hb(h))))
    }

    /// Appends `UPDATE nodes SET {set} FROM (VALUES …) AS v WHERE …` for `rows` of one
    /// partition, each a hash and its values, which `set` reads as `v.column2`, `v.column3`,
    /// … (see [`Statement::update_keyed`]).
    pub(crate) fn update_nodes(
        &mut self,
        partition: (&str, &str),
        set: &str,
        rows: impl IntoIterator<Item = (Hash, Vec<Value>)>,
    ) -> &mut Self {
        let rows = rows.into_iter().map(|(hash, values)| {
            std::iter::once(Value::Bytes(hb(&hash)))
                .chain(values)
                .collect()
        });
        self.update_keyed("nodes", partition, &["hash"], set, rows)
    }

    /// Appends `UPDATE {table} SET {set} FROM (VALUES …) AS v WHERE …` for `rows` of one
    /// partition, each the values of the key's other columns `keys` (`v.column1` …) and then
    /// those `set` reads (the next columns). On SQLite every row also carries the partition
    /// (as its last two columns): with the partition bound once, SQLite's planner, which has
    /// no statistics, takes scanning the partition's rows and probing the list for each as the
    /// cheaper plan, whose cost grows with the partition; with the whole key in the rows it
    /// seeks each row. Postgres plans the partition bound once from its statistics.
    pub(crate) fn update_keyed(
        &mut self,
        table: &str,
        (app, space): (&str, &str),
        keys: &[&str],
        set: &str,
        rows: impl IntoIterator<Item = Vec<Value>>,
    ) -> &mut Self {
        let sqlite = self.dialect() == Dialect::Sqlite;
        let text = |s: &str| Value::Text(s.to_string());
        self.text(&format!("UPDATE {table} SET {set} FROM (VALUES "));
        let mut width = 0;
        for (i, values) in rows.into_iter().enumerate() {
            width = values.len();
            let key = sqlite.then(|| [text(app), text(space)]);
            self.comma(i)
                .tuple(values.into_iter().chain(key.into_iter().flatten()));
        }
        if sqlite {
            self.text(&format!(
                ") AS v WHERE {table}.app_id = v.column{} AND {table}.space_id = v.column{}",
                width + 1,
                width + 2
            ));
        } else {
            self.text(&format!(") AS v WHERE {table}.app_id = "))
                .value(text(app))
                .text(&format!(" AND {table}.space_id = "))
                .value(text(space));
        }
        for (i, column) in keys.iter().enumerate() {
            self.text(&format!(" AND {table}.{column} = v.column{}", i + 1));
        }
        self
    }

    /// The dialect it is written in.
    pub(crate) fn dialect(&self) -> Dialect {
        self.binds.dialect()
    }

    /// Appends text.
    pub(crate) fn text(&mut self, sql: &str) -> &mut Self {
        self.sql.push_str(sql);
        self
    }

    /// Appends the placeholder of `value`.
    pub(crate) fn value(&mut self, value: Value) -> &mut Self {
        let p = self.binds.one();
        self.sql.push_str(&p);
        self.values.push(value);
        self
    }

    /// `, ` before every element of a list but the first (`i` = 0).
    pub(crate) fn comma(&mut self, i: usize) -> &mut Self {
        if i > 0 {
            self.text(", ");
        }
        self
    }

    /// Appends a parenthesized tuple of `values`.
    pub(crate) fn tuple(&mut self, values: impl IntoIterator<Item = Value>) -> &mut Self {
        self.text("(");
        for (i, v) in values.into_iter().enumerate() {
            self.comma(i).value(v);
        }
        self.text(")")
    }

    /// The query, its values bound.
    pub(crate) fn query(self) -> sqlx::query::Query<'static, Any, sqlx::any::AnyArguments> {
        bind_all(sqlx::query(sqlx::AssertSqlSafe(self.sql)), self.values)
    }
}

/// Binds `values` in order.
pub(crate) fn bind_all<'q>(
    mut q: sqlx::query::Query<'q, Any, sqlx::any::AnyArguments>,
    values: Vec<Value>,
) -> sqlx::query::Query<'q, Any, sqlx::any::AnyArguments> {
    for v in values {
        q = match v {
            Value::Text(t) => q.bind(t),
            Value::Bytes(b) => q.bind(b),
            Value::Int(i) => q.bind(i),
        };
    }
    q
}

/// Rows (or hashes) that one statement writes or names at most: SQLite binds at most 32,766
/// values a statement, a row binds at most 15, and a node's refs are as many as the operator
/// allows (`UNICAS_NODE_MAX_REFS`).
pub(crate) const ROWS_PER_STATEMENT: usize = 1000;

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

impl MetaStore {
    /// Connects (creating the SQLite file and its directory if needed). Does not migrate.
    pub async fn connect(config: &Config) -> anyhow::Result<Self> {
        Self::connect_observed(config, None).await
    }

    /// Connects, with `observer` told of every batch commit of a partition.
    pub async fn connect_observed(
        config: &Config,
        observer: Option<CommitObserver>,
    ) -> anyhow::Result<Self> {
        let sql = SqlPool::connect(PoolOptions {
            url: config.database_url()?,
            max_connections: config.database_max_connections,
            sqlite_full_sync: config.sqlite_synchronous != "normal",
            create_dir: config
                .database_url
                .is_none()
                .then(|| config.data_dir.clone()),
        })
        .await?;
        Ok(MetaStore {
            pool: sql.pool().clone(),
            dialect: sql.dialect(),
            sql,
            inner: Arc::new(Inner {
                database: GroupCommit::new(observer.clone()),
                partitions: Mutex::new(HashMap::new()),
                memos: Arc::default(),
                observer,
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
        self.sql
            .migrate(&SQLITE_MIGRATIONS, &POSTGRES_MIGRATIONS)
            .await
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> bool {
        self.sql.ping().await
    }

    pub async fn close(&self) {
        self.sql.close().await;
    }

    /// The group commit a partition's operations queue in.
    fn group(&self, app: &str, space: &str) -> GroupCommit {
        if self.dialect == Dialect::Sqlite {
            return self.inner.database.clone();
        }
        let mut map = self
            .inner
            .partitions
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let key = (app.to_string(), space.to_string());
        if let Some(group) = map.get(&key) {
            return group.clone();
        }
        if map.len() > 1024 {
            map.retain(|_, g| !g.is_idle());
        }
        let group = GroupCommit::new(self.inner.observer.clone());
        map.insert(key, group.clone());
        group
    }

    /// Opens the mutation gate of a partition.
    pub async fn gate(&self, app: &AppId, space: &SpaceId) -> Result<Partition, sqlx::Error> {
        self.gate_with(app, space, false).await
    }

    /// As [`MetaStore::gate`], for root-ref updates: on Postgres the operation opens its
    /// savepoint only if its batch was not planned from the partition's memo (see
    /// `Partition::apply_held`), whose one statement fails only when the database does; then
    /// its batch fails with it. On SQLite a savepoint costs no round trip and is always
    /// opened.
    pub async fn root_ref_gate(
        &self,
        app: &AppId,
        space: &SpaceId,
    ) -> Result<Partition, sqlx::Error> {
        self.gate_with(app, space, self.dialect == Dialect::Postgres)
            .await
    }

    async fn gate_with(
        &self,
        app: &AppId,
        space: &SpaceId,
        deferred: bool,
    ) -> Result<Partition, sqlx::Error> {
        let begin = || async {
            match self.dialect {
                Dialect::Sqlite => self.sql.write().await,
                Dialect::Postgres => {
                    // One round trip: the lock is taken by the statement that begins the
                    // transaction (its key is a number the service computed).
                    let key = partition_key(app.as_str(), space.as_str());
                    let tx = self
                        .pool
                        .begin_with(sqlx::AssertSqlSafe(format!(
                            "BEGIN; SELECT pg_advisory_xact_lock({key})"
                        )))
                        .await?;
                    Ok(WriteTx::from_tx(tx))
                }
            }
        };
        let group = self.group(app.as_str(), space.as_str());
        let op = if deferred {
            group.hold_deferred(begin).await?
        } else {
            group.hold(begin).await?
        };
        Ok(Partition {
            op,
            dialect: self.dialect,
            app: app.clone(),
            space: space.clone(),
            memos: self.inner.memos.clone(),
            checked: None,
            remembered: None,
        })
    }

    /// Commits a partition's open batch now: one left open by [`Partition::commit_followed`]
    /// for an operation that did not come.
    pub async fn flush(&self, app: &AppId, space: &SpaceId) {
        self.group(app.as_str(), space.as_str()).flush().await
    }

    /// A write transaction outside any partition (registry and admin changes).
    pub async fn write(&self) -> Result<Gate, sqlx::Error> {
        self.sql.write().await
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
