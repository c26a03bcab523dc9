//! End-to-end tests of UniCAS: they start real servers and drive them through the client and
//! plain HTTP. This library is the harness: backends, test environments (a data directory, a
//! fresh Postgres database, a fresh S3 prefix), server processes, Apps with real keys.
//!
//! Backends: every scenario runs on SQLite and Postgres, each with the filesystem store and
//! with S3. Postgres is the server on `UNICAS_TEST_PG_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); S3 is the server `scripts/s3-test-server`
//! starts (its `export` lines set `UNICAS_S3_ENDPOINT` and the AWS variables).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use cas_format::{AppId, ContentType, Hash, NodeDescriptor, SpaceId, Value};

pub mod admin_session;
pub mod content;
pub mod contract;
pub mod fault_proxy;
pub mod hub;
mod keys;
pub mod oidc_mock;
pub mod openapi;
pub mod partition;
pub mod pg_proxy;
mod process;
pub mod sessions;

pub use keys::{ALL_PERMISSIONS, TestApp, TestKey, UPSTREAM_TYP};
pub use process::{
    Process, Server, machine_cpu_ticks, named_cpu_ticks, proc_cpu_ticks, proc_status_kib,
    proc_written_bytes, run_measuring_memory,
};

/// The metadata database of a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Db {
    Sqlite,
    Postgres,
}

/// The object store of a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blobs {
    Fs,
    S3,
}

/// One of the four deployments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backend {
    pub db: Db,
    pub blobs: Blobs,
}

impl Backend {
    pub const SQLITE_FS: Backend = Backend {
        db: Db::Sqlite,
        blobs: Blobs::Fs,
    };
    pub const SQLITE_S3: Backend = Backend {
        db: Db::Sqlite,
        blobs: Blobs::S3,
    };
    pub const POSTGRES_FS: Backend = Backend {
        db: Db::Postgres,
        blobs: Blobs::Fs,
    };
    pub const POSTGRES_S3: Backend = Backend {
        db: Db::Postgres,
        blobs: Blobs::S3,
    };
}

/// Runs an async scenario once per backend, as one test function each:
/// `e2e!(name)` expects `async fn name(b: Backend) -> anyhow::Result<()>` in scope.
#[macro_export]
macro_rules! e2e {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;
            fn run(b: $crate::Backend) {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(4)
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(super::$name(b))
                    .unwrap();
            }
            #[test]
            fn sqlite_fs() { run($crate::Backend::SQLITE_FS) }
            #[test]
            fn sqlite_s3() { run($crate::Backend::SQLITE_S3) }
            #[test]
            fn postgres_fs() { run($crate::Backend::POSTGRES_FS) }
            #[test]
            fn postgres_s3() { run($crate::Backend::POSTGRES_S3) }
        }
    )*};
}

/// Path of a binary built beside this executable (a test in `deps/`, or a binary).
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("executable path");
    let dir = exe.parent().expect("target directory");
    [Some(dir.join(name)), dir.parent().map(|d| d.join(name))]
        .into_iter()
        .flatten()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is not built next to {}", exe.display()))
}

fn random_id(prefix: &str) -> String {
    let n: u64 = rand::random();
    format!("{prefix}{n:016x}")
}

/// A test's own data directory, database and bucket prefix, with the variables that point a
/// server at them.
pub struct TestEnv {
    pub backend: Backend,
    pub dir: tempfile::TempDir,
    pub vars: BTreeMap<String, String>,
    pg_database: Option<(String, String)>,
}

fn pg_admin_url() -> String {
    std::env::var("UNICAS_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
}

/// Drops a test database, from a `Drop`: on a fresh runtime on its own thread, since `Drop`
/// may run inside another runtime.
fn drop_database(name: String) {
    let _ = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        if let Ok(rt) = rt {
            let _ = rt.block_on(pg_admin(format!(
                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
            )));
        }
    })
    .join();
}

async fn pg_admin(sql: String) -> anyhow::Result<()> {
    use sqlx::Connection;
    let mut conn = sqlx::postgres::PgConnection::connect(&pg_admin_url())
        .await
        .context("cannot reach the test Postgres (UNICAS_TEST_PG_URL)")?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(())
}

impl TestEnv {
    pub async fn new(backend: Backend) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("unicas-e2e-").tempdir()?;
        let mut vars = BTreeMap::new();
        let data = dir.path().join("data");
        vars.insert("UNICAS_DATA_DIR".into(), data.display().to_string());
        vars.insert("UNICAS_LISTEN".into(), "127.0.0.1:0".into());
        vars.insert("UNICAS_GC_INTERVAL_MS".into(), "0".into());
        // Every GC pass packs what it can, in small blocks: packs are on in every scenario.
        vars.insert("UNICAS_PACK_MIN_NODES".into(), "1".into());
        vars.insert("UNICAS_PACK_DELAY_MS".into(), "0".into());
        vars.insert("UNICAS_PACK_BLOCK_BYTES".into(), "16384".into());
        vars.insert("UNICAS_AUTH_CACHE_MS".into(), "200".into());
        vars.insert("UNICAS_LEASE_MIN_MS".into(), "1000".into());
        vars.insert("UNICAS_LOG".into(), "warn".into());
        let mut pg_database = None;
        if backend.db == Db::Postgres {
            let name = random_id("unicas_e2e_");
            pg_admin(format!("CREATE DATABASE {name}")).await?;
            let admin = pg_admin_url();
            let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
            vars.insert("UNICAS_DATABASE_URL".into(), format!("{base}/{name}"));
            vars.insert("UNICAS_DATABASE_MAX_CONNECTIONS".into(), "8".into());
            pg_database = Some((name, admin.clone()));
        }
        if backend.blobs == Blobs::S3 {
            let bucket = std::env::var("UNICAS_TEST_BUCKET").ok();
            let endpoint = std::env::var("UNICAS_S3_ENDPOINT").ok();
            let (Some(bucket), Some(_)) = (bucket, endpoint) else {
                bail!(
                    "the S3 backends need a test S3 server: run the suite with scripts/test, or \
                     `eval \"$(scripts/s3-test-server start DIR)\"` first"
                );
            };
            vars.insert(
                "UNICAS_BLOB_STORE".into(),
                format!("s3://{bucket}/{}", random_id("e2e-")),
            );
        }
        Ok(TestEnv {
            backend,
            dir,
            vars,
            pg_database,
        })
    }

    /// Sets (or overrides) a server variable.
    pub fn set(&mut self, key: &str, value: impl ToString) -> &mut Self {
        self.vars.insert(key.to_string(), value.to_string());
        self
    }

    /// A `unicas-server` command with this environment.
    pub fn server_command(&self) -> Command {
        let mut c = Command::new(binary("e2e-unicas-server"));
        c.envs(&self.vars);
        c
    }

    /// Runs `unicas-server ARGS` to completion; fails unless it succeeds.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.server_command().args(args).output()?;
        if !out.status.success() {
            bail!(
                "unicas-server {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Registers an App with a fresh key of `alg` (EdDSA, ES256 or RS256).
    pub fn create_app_with(&self, app: &str, alg: &str) -> anyhow::Result<TestApp> {
        let issuer = format!("https://issuer.test/{app}");
        self.cli(&["app", "create", app, "--issuer", &issuer])?;
        let key = TestKey::generate(self.dir.path(), alg)?;
        let kid = format!("{app}-key-1");
        self.cli(&[
            "app",
            "add-key",
            app,
            "--kid",
            &kid,
            "--alg",
            alg,
            "--public-key",
            key.public_path.to_str().unwrap_or_default(),
        ])?;
        Ok(TestApp {
            app: app.parse()?,
            issuer,
            kid,
            key,
        })
    }

    /// Registers an App with an Ed25519 key.
    pub fn create_app(&self, app: &str) -> anyhow::Result<TestApp> {
        self.create_app_with(app, "EdDSA")
    }

    /// Runs `unicas-server fsck --app APP --json ARGS`; returns whether it found the store
    /// consistent, and the report.
    pub fn fsck(&self, app: &str, args: &[&str]) -> anyhow::Result<(bool, serde_json::Value)> {
        let out = self
            .server_command()
            .args(["fsck", "--app", app, "--json"])
            .args(args)
            .output()?;
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "fsck printed no report: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        Ok((out.status.success(), report))
    }

    /// Fails unless fsck finds the App's store consistent.
    pub fn assert_consistent(&self, app: &str) -> anyhow::Result<serde_json::Value> {
        let (ok, report) = self.fsck(app, &[])?;
        if !ok {
            bail!("fsck found inconsistencies: {report:#}");
        }
        Ok(report)
    }

    /// The metadata store of this environment, opened in-process for invariant checks.
    pub async fn meta(&self) -> anyhow::Result<cas_service::meta::MetaStore> {
        let mut config = cas_service::config::Config {
            data_dir: PathBuf::from(&self.vars["UNICAS_DATA_DIR"]),
            database_max_connections: 2,
            ..Default::default()
        };
        config.database_url = self.vars.get("UNICAS_DATABASE_URL").cloned();
        cas_service::meta::MetaStore::connect(&config).await
    }

    /// The object store of this environment, opened in-process (to damage objects).
    pub async fn blobs(&self) -> anyhow::Result<cas_service::blob::BlobStore> {
        let mut config = cas_service::config::Config::load(None)?;
        config.data_dir = PathBuf::from(&self.vars["UNICAS_DATA_DIR"]);
        config.blob_store = self.vars.get("UNICAS_BLOB_STORE").cloned();
        cas_service::blob::BlobStore::open(&config).await
    }

    /// The node objects of a Space (packs are elsewhere).
    pub async fn node_objects(
        &self,
        app: &TestApp,
        sp: &SpaceId,
    ) -> anyhow::Result<Vec<cas_service::blob::ListedObject>> {
        let key = cas_service::blob::node_key(&app.app, sp, &Hash::digest(b""), "g");
        let prefix = &key[..key
            .find("/nodes/")
            .map_or(key.len(), |i| i + "/nodes/".len())];
        Ok(self.blobs().await?.list(prefix).await?)
    }

    /// Fails unless the only object of node `row` in a Space is the one its row names (what
    /// publications that raced must leave).
    pub async fn assert_only_object_of(
        &self,
        app: &TestApp,
        sp: &SpaceId,
        row: &cas_service::meta::NodeRow,
    ) -> anyhow::Result<()> {
        let hex = row.hash.to_hex();
        let of_node: Vec<String> = self
            .node_objects(app, sp)
            .await?
            .into_iter()
            .map(|o| o.key)
            .filter(|k| k.contains(&hex))
            .collect();
        let published = cas_service::blob::node_key(&app.app, sp, &row.hash, &row.object_gen);
        if of_node != [published] {
            bail!("{}: objects {of_node:?}, not only its row's", row.hash);
        }
        Ok(())
    }

    /// Starts a server that pauses at `failpoint`, asks it for a GC pass of `space`, and kills
    /// it (SIGKILL) once the pass reached the failpoint.
    pub async fn kill_during_gc(
        &self,
        app: &TestApp,
        space: &SpaceId,
        failpoint: &str,
    ) -> anyhow::Result<()> {
        self.crash_at(failpoint, |server| {
            let client = app.client(&server);
            let space = space.clone();
            async move {
                tokio::spawn(async move { client.gc(&space, None).await });
                server
            }
        })
        .await
    }

    /// Starts the server with `failpoint=pause`, runs `op` (which starts work in the
    /// background) until the server reports the failpoint, then kills it (SIGKILL).
    pub async fn crash_at<F, Fut>(&self, failpoint: &str, op: F) -> anyhow::Result<()>
    where
        F: FnOnce(Server) -> Fut,
        Fut: std::future::Future<Output = Server>,
    {
        let server = self.start_with(&[("UNICAS_FAILPOINTS", &format!("{failpoint}=pause"))])?;
        let server = op(server).await;
        server
            .wait_for_log(
                &format!("failpoint {failpoint} reached"),
                Duration::from_secs(20),
            )
            .await?;
        server.kill();
        Ok(())
    }

    /// Replaces the object at `key` with `bytes` (to damage it).
    pub async fn replace_object(&self, key: &str, bytes: Vec<u8>) -> anyhow::Result<()> {
        let blobs = self.blobs().await?;
        blobs.delete(key).await?;
        let len = bytes.len() as u64;
        blobs
            .put_once(
                key,
                Box::pin(futures_util::stream::once(async move {
                    Ok::<_, std::io::Error>(Bytes::from(bytes))
                })),
                len,
            )
            .await
            .map_err(|e| anyhow::anyhow!("replacing {key}: {e:?}"))?;
        Ok(())
    }

    /// The invariants that must hold after any interleaving, checked on the database: counts
    /// never negative, every `childRefCount` equal to the edges pointing at the node, no
    /// dangling edge, balances equal to the events, every node's root ref count (the sum of its
    /// balances) at or above zero, held by a node with a row and agreeing with its `rooted`
    /// flag, a node's `held` flag set exactly when its held bytes are stored, usage rows equal
    /// to a recount.
    pub async fn check_invariants(
        &self,
        meta: &cas_service::meta::MetaStore,
        app: &AppId,
    ) -> anyhow::Result<()> {
        let mismatches = meta.child_count_mismatches(app, None).await?;
        if !mismatches.is_empty() {
            bail!("childRefCount differs from edges: {mismatches:?}");
        }
        let dangling = meta.dangling_edges(app, None).await?;
        if !dangling.is_empty() {
            bail!("dangling edges: {dangling:?}");
        }
        let rooted = meta.rooted_mismatches(app).await?;
        if !rooted.is_empty() {
            bail!("rooted flags differ from root ref counts: {rooted:?}");
        }
        let held = meta.held_mismatches(app).await?;
        if !held.is_empty() {
            bail!("held flags differ from the held bytes stored: {held:?}");
        }
        let events = meta.event_sums(app).await?;
        let balances = meta.current_balances(app).await?;
        if events != balances {
            bail!("root refs disagree: events {events:?}, projection {balances:?}");
        }
        let sums = cas_service::meta::sum_over_domains(&balances);
        if let Some((key, n)) = sums.iter().find(|(_, n)| **n < 0) {
            bail!("root ref count of {key:?} below zero: {n}");
        }
        let unrowed = meta.root_counts_without_node(app).await?;
        if !unrowed.is_empty() {
            bail!("root ref counts of nodes without a row: {unrowed:?}");
        }
        for space in meta.spaces(app).await? {
            let row = meta.usage_row(app, &space).await?;
            let recount = meta.recount_usage(app, &space).await?;
            if row != recount {
                bail!("usage of {space}: row {row:?}, recount {recount:?}");
            }
        }
        // Every packed row's pack is live, and every live pack counts the rows pointing at it.
        let packs = meta.packs(app, None).await?;
        let counted = meta.pack_recount(app, None).await?;
        for (space, id, nodes, _) in &counted {
            let pack = packs.iter().find(|p| &p.space == space && &p.pack_id == id);
            match pack {
                Some(p) if p.state == cas_service::meta::PackState::Live => {}
                _ => bail!("{nodes} rows of {space} point at pack {id}, which is {pack:?}"),
            }
        }
        for p in &packs {
            let recount = counted
                .iter()
                .find(|(s, id, _, _)| *s == p.space && *id == p.pack_id)
                .map_or((0, 0), |(_, _, n, b)| (*n, *b));
            if p.state == cas_service::meta::PackState::Live
                && recount != (p.live_nodes, p.live_bytes)
            {
                bail!("pack {p:?}: rows pointing at it count {recount:?}");
            }
        }
        Ok(())
    }

    /// Starts a server on a free port.
    pub fn start(&self) -> anyhow::Result<Server> {
        self.start_with(&[])
    }

    /// Starts a server with extra variables.
    pub fn start_with(&self, extra: &[(&str, &str)]) -> anyhow::Result<Server> {
        Process::spawn(
            self.server_command(),
            self.dir.path(),
            "unicas-server",
            "listening on ",
            Duration::from_secs(60),
            extra,
        )
    }

    /// A direct connection to the test's metadata database, for checking invariants.
    pub async fn database(&self) -> anyhow::Result<sqlx::AnyPool> {
        sqlx::any::install_default_drivers();
        let url = match self.vars.get("UNICAS_DATABASE_URL") {
            Some(u) => u.clone(),
            None => format!("sqlite://{}/unicas.db", self.vars["UNICAS_DATA_DIR"]),
        };
        Ok(sqlx::any::AnyPoolOptions::new()
            .max_connections(2)
            .connect(&url)
            .await?)
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if let Some((name, _)) = self.pg_database.take() {
            drop_database(name);
        }
    }
}

/// A leaf node: its hash and portable bytes.
pub fn leaf(content: &[u8]) -> (Hash, Bytes) {
    node("application/octet-stream", &[], content)
}

/// Any node: its hash and portable bytes.
pub fn node(content_type: &str, refs: &[Hash], content: &[u8]) -> (Hash, Bytes) {
    let d = NodeDescriptor::new(
        ContentType::new(content_type).expect("content type"),
        refs.to_vec(),
        content.len() as u64,
    );
    let bytes = d.encode_portable(content).expect("encode");
    (Hash::digest(&bytes), Bytes::from(bytes))
}

/// An SValue node: its hash and portable bytes.
pub fn svalue_node(value: &Value) -> (Hash, Bytes) {
    let enc = cas_format::svalue::encode(value).expect("svalue");
    node(cas_format::SVALUE_CONTENT_TYPE, &enc.refs, &enc.bytes)
}

/// A parent whose root ref a test holds, with its children.
pub type Held = (Hash, Vec<Hash>);

pub fn space(s: &str) -> SpaceId {
    s.parse().expect("space id")
}

/// The value of one series (its name with its labels, as `/metrics` prints them) in a scrape;
/// NaN when the scrape does not have it.
pub fn metric(scrape: &str, series: &str) -> f64 {
    scrape
        .lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(f64::NAN)
}

/// An environment with the App `hub`, a server, its client and the metadata store.
pub async fn hub_app(
    b: Backend,
) -> anyhow::Result<(
    TestEnv,
    TestApp,
    Server,
    cas_client::AppCasClient,
    cas_service::meta::MetaStore,
)> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let meta = env.meta().await?;
    Ok((env, app, server, client, meta))
}
