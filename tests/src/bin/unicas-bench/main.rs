//! Throughput and memory of the service, each figure beside a baseline measured in the same run
//! (these machines are noisy; ratios travel, absolute numbers do not).
//!
//! ```text
//! scripts/bench [sqlite-fs|sqlite-s3|postgres-fs|postgres-s3 ...]
//! scripts/bench tree [backend [notebooks|mixed]]  # tree put and get of a 38 MB and a 300 MB
//!                                                 # tree (or one of them) beside cp -r + sync
//! scripts/bench root-refs [backend ...]           # the baseline and root-ref updates only
//! ```
//!
//! `UNICAS_BENCH_PHASE_SECS` sets how long each throughput phase runs (4 s by default): longer
//! phases for a profile or the database's statistics of one phase.
//!
//! For each backend it starts a real server and reports:
//! - ready-lease renewals per second (15-minute claims, renewed continuously: most are answered
//!   from the running lease without a write), beside `GET /healthz` of the same server under
//!   the same load generator, and lease extensions that each write;
//! - root-ref updates per second, 10 changes each, measured in steady state (after a first
//!   phase of the same load has filled the event history), and on SQLite the bytes the server
//!   wrote per update (`wchar` of its `/proc/<pid>/io`: the write-ahead log and checkpoints);
//!   for both this phase and the baseline, the CPU an operation cost the server, the database
//!   server (Postgres) and the load generator, and how busy the machine was (`cpu`); its
//!   commits (operations in each, time each took), and how long an operation held the
//!   partition and how much of the phase operations and commits took (`commits`): the share
//!   left is time the partition waited for requests;
//! - small-node (1 KiB) uploads per second (lease, PUT, lease), and nodes stored per second
//!   by batch leases of 100 nodes carried inline (on SQLite with the bytes written per node);
//! - GC deletions per second;
//! - single-row durable commits per second that the same database reaches on the same disk
//!   (its own table, the service's pool settings, the same load generator): whether commits
//!   or the request path are the limit;
//! - the server's peak RSS while uploading 32 MiB nodes, beside its RSS before.
//!
//! Two things of the machine move these figures as much as the code: a virtual machine pays the
//! host for each page it touches that the host has not given it (a put a third slower as the page
//! cache grows), and its freed pages go back within seconds (free page reporting; as root, `echo
//! 11 > /sys/module/page_reporting/parameters/page_reporting_order` stops that until a restart:
//! then touch the memory once); ext4 without a journal makes every file creation skip, one
//! lookup each, the inodes freed in the last minutes. Compare builds interleaved, pausing first.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use cas_client::AppCasClient;
use cas_format::{Hash, SpaceId};
use tests::{Backend, Blobs, Db, TestEnv, leaf, space};

mod commits;
mod cpu;
mod tree;
use commits::Commits;
use cpu::CpuMark;
use tree::{TreeShape, tree_bench};

const CONCURRENCY: usize = 16;
/// How long a throughput phase runs, unless `UNICAS_BENCH_PHASE_SECS` says otherwise.
const DEFAULT_PHASE: Duration = Duration::from_secs(4);
/// Nodes per batch lease in the batched-upload phase.
const BATCH: usize = 100;

/// How long each throughput phase runs: [`DEFAULT_PHASE`] unless `main` read another.
static PHASE: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

fn phase() -> Duration {
    *PHASE.get().unwrap_or(&DEFAULT_PHASE)
}

/// Reads `UNICAS_BENCH_PHASE_SECS`, if set: a whole number of seconds above zero, or an error
/// (a figure measured over another length than the one asked for would mislead).
fn read_phase() -> anyhow::Result<()> {
    let Ok(v) = std::env::var("UNICAS_BENCH_PHASE_SECS") else {
        return Ok(());
    };
    let secs: u64 = v.parse().ok().filter(|&s| s > 0).with_context(|| {
        format!("UNICAS_BENCH_PHASE_SECS must be a whole number of seconds above 0, not {v:?}")
    })?;
    let _ = PHASE.set(Duration::from_secs(secs));
    Ok(())
}

/// Runs `op` from `CONCURRENCY` tasks for a phase; returns completed operations per second.
async fn throughput<F, Fut>(op: F) -> anyhow::Result<f64>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let op = Arc::new(op);
    let done = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + phase();
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let (op, done, next) = (op.clone(), done.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let i = next.fetch_add(1, Ordering::Relaxed);
                op(i).await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

fn parse_backend(s: &str) -> anyhow::Result<Backend> {
    Ok(match s {
        "sqlite-fs" => Backend::SQLITE_FS,
        "sqlite-s3" => Backend::SQLITE_S3,
        "postgres-fs" => Backend::POSTGRES_FS,
        "postgres-s3" => Backend::POSTGRES_S3,
        other => anyhow::bail!(
            "unknown backend {other}; use sqlite-fs, sqlite-s3, postgres-fs or postgres-s3"
        ),
    })
}

fn name(b: Backend) -> &'static str {
    match (b.db, b.blobs) {
        (Db::Sqlite, Blobs::Fs) => "sqlite-fs",
        (Db::Sqlite, Blobs::S3) => "sqlite-s3",
        (Db::Postgres, Blobs::Fs) => "postgres-fs",
        (Db::Postgres, Blobs::S3) => "postgres-s3",
    }
}

#[derive(Debug, Default)]
struct Figures {
    healthz: f64,
    renewals: f64,
    extensions: f64,
    root_refs: f64,
    root_ref_commits: String,
    /// Where the CPU went in the baseline's phase and in the root-ref updates'.
    healthz_cpu: String,
    root_ref_cpu: String,
    /// Bytes the server wrote per root-ref update (its database's log and checkpoints).
    root_ref_written: f64,
    uploads: f64,
    batched_uploads: f64,
    /// Bytes the server wrote per node stored by batch leases (rows and objects).
    batched_written: f64,
    gc_deletions: f64,
    commits: f64,
    rss_before_mib: f64,
    rss_peak_mib: f64,
}

async fn bench(b: Backend, scope: Scope) -> anyhow::Result<Figures> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_NODE_MAX_BYTES", 40 << 20)
        .set("UNICAS_MAX_ACTIVE_UPLOADS", 0)
        .set("UNICAS_RATE_LIMIT_PER_IP", 0)
        .set("UNICAS_RATE_LIMIT_PER_APP", 0)
        .set("UNICAS_UPLOAD_TTL_MS", 3_600_000);
    let app = env.create_app("bench")?;
    let server = env.start()?;
    let pid = server.pid();
    let client: AppCasClient = app.client(&server);
    let sp = space("bench");
    let mut f = Figures::default();

    let http = reqwest::Client::new();
    let url = format!("{}/healthz", server.url);
    let cpu = CpuMark::take(pid)?;
    f.healthz = throughput(move |_| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            anyhow::ensure!(http.get(&url).send().await?.status().is_success());
            Ok(())
        }
    })
    .await?;
    f.healthz_cpu = CpuMark::take(pid)?.since(&cpu, f.healthz, "an operation", "load generator");

    // Ready nodes to renew and reference, uploaded with the 15-minute lease their client then
    // keeps renewing: the phase measures steady renewals, not each node's first extension
    // (that is the next phase).
    let mut ready = Vec::new();
    for i in 0..1000u32 {
        let (h, bytes) = leaf(&i.to_le_bytes());
        client.ensure_node(&sp, &h, &bytes, 15 * 60_000).await?;
        ready.push(h);
    }
    let ready = Arc::new(ready);
    analyze(&env).await?;
    if scope == Scope::RootRefs {
        measure_root_refs(&env, &server, &client, &sp, &ready, &mut f).await?;
        return Ok(f);
    }
    {
        let (client, sp, ready) = (client.clone(), sp.clone(), ready.clone());
        f.renewals = throughput(move |i| {
            let (client, sp, ready) = (client.clone(), sp.clone(), ready.clone());
            async move {
                // A client renewing its 15-minute leases.
                client
                    .lease_node(&sp, &ready[i as usize % ready.len()], 15 * 60_000, None)
                    .await?;
                Ok(())
            }
        })
        .await?;
    }
    // Extensions that must write: nodes leased for the minimum, then claimed for a day.
    let mut short = Vec::new();
    for i in 0..3000u32 {
        let (h, bytes) = leaf(&(i + 500_000).to_le_bytes());
        client.ensure_node(&sp, &h, &bytes, 1000).await?;
        short.push(h);
    }
    let short = Arc::new(short);
    {
        let (client, sp, short) = (client.clone(), sp.clone(), short.clone());
        let start = Instant::now();
        let next = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..CONCURRENCY {
            let (client, sp, short, next) =
                (client.clone(), sp.clone(), short.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(h) = short.get(i) else { break };
                    client.lease_node(&sp, h, 24 * 3_600_000, None).await?;
                }
                anyhow::Ok(())
            }));
        }
        for t in tasks {
            t.await??;
        }
        f.extensions = short.len() as f64 / start.elapsed().as_secs_f64();
    }
    measure_root_refs(&env, &server, &client, &sp, &ready, &mut f).await?;
    {
        let (client, sp) = (client.clone(), sp.clone());
        f.uploads = throughput(move |i| {
            let (client, sp) = (client.clone(), sp.clone());
            async move {
                let mut content = vec![0u8; 1024];
                content[..8].copy_from_slice(&(i + 1_000_000).to_le_bytes());
                let (h, bytes) = leaf(&content);
                client.ensure_node(&sp, &h, &bytes, 1000).await?;
                Ok(())
            }
        })
        .await?;
    }
    let written = tests::proc_written_bytes(pid)?;
    {
        let (client, sp) = (client.clone(), sp.clone());
        f.batched_uploads = BATCH as f64
            * throughput(move |i| {
                let (client, sp) = (client.clone(), sp.clone());
                async move {
                    let elements = (0..BATCH as u64)
                        .map(|k| {
                            let mut content = vec![0u8; 1024];
                            content[..8].copy_from_slice(&(i * BATCH as u64 + k).to_le_bytes());
                            content[8] = 0xBA;
                            let (hash, bytes) = leaf(&content);
                            let element = cas_format::wire::BatchLeaseElement {
                                hash,
                                lease_duration_ms: 1000,
                                upload_bytes: None,
                                content: None,
                                content_bytes: None,
                                delta_base: None,
                            };
                            (element, Some(bytes))
                        })
                        .collect();
                    let results = client.lease_batch_raw(&sp, elements).await?;
                    anyhow::ensure!(results.iter().all(|r| matches!(
                        r,
                        cas_format::wire::BatchLeaseResult::Lease(
                            cas_format::wire::LeaseResponse::Ready { .. }
                        )
                    )));
                    Ok(())
                }
            })
            .await?;
    }
    f.batched_written = (tests::proc_written_bytes(pid)? - written) as f64
        / (f.batched_uploads * phase().as_secs_f64());
    // GC: everything uploaded above with a 1 s lease (the server's minimum in tests).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let start = Instant::now();
    let mut deleted = 0;
    loop {
        let pass = client.gc(&sp, Some(10_000)).await?;
        deleted += pass.deleted;
        if pass.deleted == 0 {
            break;
        }
    }
    f.gc_deletions = deleted as f64 / start.elapsed().as_secs_f64();

    f.commits = durable_commits(&env).await?;

    // Memory: 32 MiB nodes, two at a time.
    f.rss_before_mib = tests::proc_status_kib(pid, "VmRSS:")? as f64 / 1024.0;
    let mut tasks = Vec::new();
    for i in 0..6u8 {
        let (client, sp) = (client.clone(), sp.clone());
        tasks.push(tokio::spawn(async move {
            let content: Vec<u8> = (0..32u32 << 20)
                .map(|k| (k as u8).wrapping_mul(31).wrapping_add(i))
                .collect();
            let (h, bytes) = leaf(&content);
            drop(content);
            client.ensure_node(&sp, &h, &bytes, 60_000).await?;
            anyhow::Ok(())
        }));
        if tasks.len() == 2 {
            for t in tasks.drain(..) {
                t.await??;
            }
        }
    }
    for t in tasks {
        t.await??;
    }
    f.rss_peak_mib = tests::proc_status_kib(pid, "VmHWM:")? as f64 / 1024.0;
    Ok(f)
}

/// What a run of the service bench measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Everything,
    /// The baseline and root-ref updates (over the ready nodes alone).
    RootRefs,
}

/// Root-ref updates in steady state: a first phase fills the event history (and the
/// statistics are gathered after it, as autovacuum would), the second is measured, with the
/// CPU it cost, its commits and (on SQLite) the bytes the server wrote.
async fn measure_root_refs(
    env: &TestEnv,
    server: &tests::Server,
    client: &AppCasClient,
    sp: &SpaceId,
    ready: &Arc<Vec<Hash>>,
    f: &mut Figures,
) -> anyhow::Result<()> {
    let (pid, metrics) = (server.pid(), reqwest::Client::new());
    root_ref_updates(client, sp, ready, "warm").await?;
    analyze(env).await?;
    let before = Commits::read(&metrics, &server.url).await?;
    let written = tests::proc_written_bytes(pid)?;
    let cpu = CpuMark::take(pid)?;
    f.root_refs = root_ref_updates(client, sp, ready, "bench").await?;
    f.root_ref_cpu = CpuMark::take(pid)?.since(&cpu, f.root_refs, "an operation", "load generator");
    f.root_ref_commits = Commits::read(&metrics, &server.url).await?.since(&before);
    f.root_ref_written =
        (tests::proc_written_bytes(pid)? - written) as f64 / (f.root_refs * phase().as_secs_f64());
    Ok(())
}

/// Root-ref updates of 10 changes each over `ready`, request ids `{prefix}:{i}`, for one
/// phase; returns updates per second.
async fn root_ref_updates(
    client: &AppCasClient,
    sp: &SpaceId,
    ready: &Arc<Vec<Hash>>,
    prefix: &'static str,
) -> anyhow::Result<f64> {
    let (client, sp, ready) = (client.clone(), sp.clone(), ready.clone());
    throughput(move |i| {
        let (client, sp, ready) = (client.clone(), sp.clone(), ready.clone());
        async move {
            let changes: BTreeMap<Hash, i64> = (0..10)
                .map(|k| (ready[(i as usize * 10 + k) % ready.len()], 1))
                .collect();
            client
                .update_root_refs(&sp, &format!("{prefix}:{i}").parse()?, changes)
                .await?;
            Ok(())
        }
    })
    .await
}

/// Gives a Postgres server without autovacuum the statistics autovacuum would have gathered
/// by now (without them the planner may scan the whole partition for one node); says so.
async fn analyze(env: &TestEnv) -> anyhow::Result<()> {
    if !env.vars.contains_key("UNICAS_DATABASE_URL") {
        return Ok(());
    }
    let db = env.database().await?;
    let autovacuum: String = sqlx::query_scalar("SELECT current_setting('autovacuum')")
        .fetch_one(&db)
        .await?;
    if autovacuum == "off" {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            println!(
                "  (this PostgreSQL runs without autovacuum: the bench ANALYZEs after each setup)"
            )
        });
        sqlx::query("ANALYZE").execute(&db).await?;
    }
    db.close().await;
    Ok(())
}

/// Single-row write transactions per second on the server's database (a table of its own),
/// through a pool set up as the service sets up its own: durable commits, one at a time on
/// SQLite.
async fn durable_commits(env: &TestEnv) -> anyhow::Result<f64> {
    let url = match env.vars.get("UNICAS_DATABASE_URL") {
        Some(u) => u.clone(),
        None => format!(
            "sqlite://{}/commits.db?mode=rwc",
            env.vars["UNICAS_DATA_DIR"]
        ),
    };
    let sql = server_kit::sql::SqlPool::connect(server_kit::sql::PoolOptions {
        url,
        max_connections: CONCURRENCY as u32,
        sqlite_full_sync: true,
        create_dir: None,
    })
    .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench_commits (id BIGINT PRIMARY KEY, at BIGINT NOT NULL)",
    )
    .execute(sql.pool())
    .await?;
    let sql = Arc::new(sql);
    let rate = throughput(move |i| {
        let sql = sql.clone();
        async move {
            let mut tx = sql.write().await?;
            sqlx::query("INSERT INTO bench_commits (id, at) VALUES ($1, $2)")
                .bind(i as i64)
                .bind(server_kit::now_ms())
                .execute(tx.conn())
                .await?;
            tx.commit().await?;
            Ok(())
        }
    })
    .await?;
    Ok(rate)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    read_phase()?;
    let mut args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) == Some("tree") {
        let b = args
            .get(1)
            .map(|a| parse_backend(a))
            .transpose()?
            .unwrap_or(Backend::SQLITE_FS);
        let shapes: &[TreeShape] = match args.get(2).map(String::as_str) {
            None => &[TreeShape::Notebooks, TreeShape::Mixed],
            Some("notebooks") => &[TreeShape::Notebooks],
            Some("mixed") => &[TreeShape::Mixed],
            Some(other) => anyhow::bail!("unknown tree {other}; use notebooks or mixed"),
        };
        for shape in shapes {
            tree_bench(b, *shape).await?;
        }
        return Ok(());
    }
    let scope = if args.first().map(String::as_str) == Some("root-refs") {
        args.remove(0);
        Scope::RootRefs
    } else {
        Scope::Everything
    };
    let backends: Vec<Backend> = if args.is_empty() {
        vec![Backend::SQLITE_FS]
    } else {
        args.iter()
            .map(|a| parse_backend(a))
            .collect::<anyhow::Result<_>>()?
    };
    println!(
        "concurrency {CONCURRENCY}, {} s per phase",
        phase().as_secs()
    );
    for b in backends {
        let f = bench(b, scope)
            .await
            .with_context(|| format!("backend {}", name(b)))?;
        println!("\n{}", name(b));
        println!("  {:<44} {:>9.0} /s", "baseline: GET /healthz", f.healthz);
        println!("    {}", f.healthz_cpu);
        for (what, v) in [
            ("ready-lease renewals, 15 min claims", f.renewals),
            ("lease extensions that write (1 s to 24 h)", f.extensions),
            ("root-ref updates, 10 changes each", f.root_refs),
            ("small-node uploads (1 KiB: lease, PUT, lease)", f.uploads),
            (
                "small nodes stored, 100 inline a batch lease",
                f.batched_uploads,
            ),
        ] {
            if scope == Scope::RootRefs && !what.starts_with("root-ref") {
                continue;
            }
            println!(
                "  {what:<44} {v:>9.0} /s   {:.3} of baseline",
                v / f.healthz
            );
            if what.starts_with("root-ref") {
                println!("    {}", f.root_ref_commits);
                println!("    {}", f.root_ref_cpu);
                // On Postgres the database's writes are another process's.
                if b.db == Db::Sqlite {
                    println!(
                        "    the server wrote {:.1} KiB an update (its database's log and checkpoints)",
                        f.root_ref_written / 1024.0
                    );
                }
            }
            if what.starts_with("small nodes stored") && b.db == Db::Sqlite {
                println!(
                    "    the server wrote {:.1} KiB a node (rows and objects)",
                    f.batched_written / 1024.0
                );
            }
        }
        if scope == Scope::RootRefs {
            continue;
        }
        println!("  {:<44} {:>9.0} /s", "GC deletions", f.gc_deletions);
        println!(
            "  {:<44} {:>9.0} /s   {:.3} of baseline",
            "durable single-row commits, same database",
            f.commits,
            f.commits / f.healthz
        );
        println!(
            "  {:<44} {:>9.1} MiB  (before: {:.1} MiB; peak / node size = {:.2})",
            "server peak RSS, 32 MiB nodes two at a time",
            f.rss_peak_mib,
            f.rss_before_mib,
            f.rss_peak_mib / 32.0
        );
    }
    Ok(())
}
