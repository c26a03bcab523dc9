//! Group commit: many operations share one durable commit, and nothing of that is visible.
//!
//! - A failing operation in a batch is rolled back alone; the others of its batch commit.
//! - A batch left open for a follower commits with it, or without it when it does not come
//!   or is dropped.
//! - An operation without a savepoint of its own fails its whole batch if it fails after
//!   running a statement, and only then.
//! - The server SIGKILLed while many writers' batches commit (root-ref updates, single leases
//!   and batch leases of inline nodes): after a restart every answered request is there, every
//!   node answered ready reads back whole, and every request is there whole or not at all
//!   (replaying every one of them applies each exactly once).
//! - Postgres connections send a statement at once (no wait for the server's delayed ACK).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cas_client::RetryPolicy;
use cas_format::Hash;
use server_kit::group_commit::{CommitEvent, CommitObserver, CommitStats, GroupCommit};
use server_kit::sql::{PoolOptions, SqlPool};
use tests::*;

/// 64 concurrent operations on one key: each inserts its row; every third one then fails (a
/// duplicate key) and every fifth is dropped without committing. Only the others' rows are
/// there, and they shared commits. Each operation, whatever became of it, reported once how
/// long it held the key, at least the time it slept holding it.
async fn a_failing_operation_fails_alone(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let sql = batch_table(&env).await?;
    let (stats, held, observer) = recorder();
    let group = GroupCommit::new(Some(observer));
    let mut tasks = Vec::new();
    for i in 0..64i64 {
        let (group, sql) = (group.clone(), sql.clone());
        tasks.push(tokio::spawn(async move {
            let mut op = group.hold(|| sql.write()).await?;
            sqlx::query("INSERT INTO batch_rows (id) VALUES ($1)")
                .bind(i)
                .execute(&mut **op.tx())
                .await?;
            // Give the others time to queue behind this one.
            tokio::time::sleep(Duration::from_millis(2)).await;
            if i % 3 == 0 {
                let dup = sqlx::query("INSERT INTO batch_rows (id) VALUES ($1)")
                    .bind(i)
                    .execute(&mut **op.tx())
                    .await;
                anyhow::ensure!(dup.is_err(), "a duplicate key was accepted");
                return Ok(false);
            }
            if i % 5 == 0 {
                drop(op);
                return Ok(false);
            }
            op.commit().await?;
            anyhow::Ok(true)
        }));
    }
    let mut committed = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        if t.await?? {
            committed.push(i as i64);
        }
    }
    let rows: Vec<i64> = sqlx::query_scalar("SELECT id FROM batch_rows ORDER BY id")
        .fetch_all(sql.pool())
        .await?;
    assert_eq!(rows, committed, "exactly the committed operations' rows");
    let expected: Vec<i64> = (0..64).filter(|i| i % 3 != 0 && i % 5 != 0).collect();
    assert_eq!(committed, expected);
    let held = held.lock().unwrap().clone();
    assert_eq!(
        held.len(),
        64,
        "every operation gave up the key once: {held:?}"
    );
    assert!(
        held.iter().all(|h| *h >= Duration::from_millis(2)),
        "{held:?}"
    );
    let stats = stats.lock().unwrap().clone();
    assert!(stats.iter().all(|s| s.ok));
    assert_eq!(
        stats.iter().map(|s| s.operations).sum::<usize>(),
        committed.len()
    );
    assert!(
        stats.len() < committed.len(),
        "operations shared commits: {} commits for {} operations",
        stats.len(),
        committed.len()
    );
    Ok(())
}

/// A pool on the scenario's database with an empty table `batch_rows`.
async fn batch_table(env: &TestEnv) -> anyhow::Result<SqlPool> {
    let url = match env.vars.get("UNICAS_DATABASE_URL") {
        Some(u) => u.clone(),
        None => format!("sqlite://{}/batch.db?mode=rwc", env.vars["UNICAS_DATA_DIR"]),
    };
    let sql = SqlPool::connect(PoolOptions {
        url,
        max_connections: 8,
        sqlite_full_sync: true,
        create_dir: Some(env.vars["UNICAS_DATA_DIR"].clone().into()),
    })
    .await?;
    sqlx::query("CREATE TABLE batch_rows (id BIGINT PRIMARY KEY)")
        .execute(sql.pool())
        .await?;
    Ok(sql)
}

/// The commits a group commit reports, how long each operation held the key, and the
/// observer that records them.
type Recorded<T> = Arc<Mutex<Vec<T>>>;
fn recorder() -> (Recorded<CommitStats>, Recorded<Duration>, CommitObserver) {
    let (stats, held): (Recorded<CommitStats>, Recorded<Duration>) = Default::default();
    let (seen, released) = (stats.clone(), held.clone());
    let observer: CommitObserver = Arc::new(move |e| match e {
        CommitEvent::Committed(s) => seen.lock().unwrap().push(s),
        CommitEvent::Released { held } => released.lock().unwrap().push(held),
        _ => {}
    });
    (stats, held, observer)
}

/// A batch left open for a follower (`commit_followed`) commits together with it; one whose
/// follower does not come is committed by `flush`; one whose follower is dropped inside it is
/// committed by that drop, without the follower's row. Queued operations here wait an hour
/// before committing their batch themselves, so each commit is the one the step names (a
/// step that relied on that wait would time out).
async fn a_batch_left_open_commits_with_or_without_its_follower(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let sql = batch_table(&env).await?;
    let (stats, _, observer) = recorder();
    let group = GroupCommit::with_flush_after(Some(observer), Duration::from_secs(3600));
    let within = |what: &'static str, task: tokio::task::JoinHandle<Result<(), sqlx::Error>>| async move {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .map_err(|_| anyhow::anyhow!("{what}: the batch was never committed"))???;
        anyhow::Ok(())
    };
    let insert = |id: i64| sqlx::query("INSERT INTO batch_rows (id) VALUES ($1)").bind(id);
    let commits = || {
        stats
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.operations)
            .collect::<Vec<_>>()
    };

    // A follower that comes: one commit of both.
    let mut first = group.hold(|| sql.write()).await?;
    insert(1).execute(&mut **first.tx()).await?;
    let queued = tokio::spawn(first.commit_followed());
    // Held once the first one is queued and has given up the key.
    let mut follower = group.hold(|| sql.write()).await?;
    insert(2).execute(&mut **follower.tx()).await?;
    follower.commit().await?;
    within("a followed batch", queued).await?;
    assert_eq!(commits(), [2], "the two operations shared one commit");

    // A follower that does not come: `flush` commits the batch.
    let mut alone = group.hold(|| sql.write()).await?;
    insert(3).execute(&mut **alone.tx()).await?;
    let queued = tokio::spawn(alone.commit_followed());
    group.flush().await;
    within("a batch flushed", queued).await?;
    assert_eq!(commits(), [2, 1]);

    // A follower dropped inside the batch: the drop commits the others.
    let mut kept = group.hold(|| sql.write()).await?;
    insert(4).execute(&mut **kept.tx()).await?;
    let queued = tokio::spawn(kept.commit_followed());
    let mut dropped = group.hold(|| sql.write()).await?;
    insert(5).execute(&mut **dropped.tx()).await?;
    drop(dropped);
    within("a batch whose follower was dropped", queued).await?;
    assert_eq!(commits(), [2, 1, 1]);

    let rows: Vec<i64> = sqlx::query_scalar("SELECT id FROM batch_rows ORDER BY id")
        .fetch_all(sql.pool())
        .await?;
    assert_eq!(
        rows,
        [1, 2, 3, 4],
        "the dropped operation's row is not there"
    );
    assert!(stats.lock().unwrap().iter().all(|s| s.ok));
    Ok(())
}

/// An operation held without a savepoint (`hold_deferred`) shares its batch's commit when it
/// succeeds and costs the others nothing when dropped before it ran anything; once it ran a
/// statement, failing fails its whole batch (nothing of it applied, the others told), and the
/// next batch is unaffected; after `protect` it fails alone again, what it ran before kept.
async fn an_operation_without_a_savepoint_fails_with_its_batch(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let sql = batch_table(&env).await?;
    let (stats, _, observer) = recorder();
    let group = GroupCommit::with_flush_after(Some(observer), Duration::from_secs(3600));
    let insert = |id: i64| sqlx::query("INSERT INTO batch_rows (id) VALUES ($1)").bind(id);
    let within = |task: tokio::task::JoinHandle<Result<(), sqlx::Error>>| async move {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .map_err(|_| anyhow::anyhow!("the batch was never committed"))?
            .map_err(anyhow::Error::from)
    };
    // A batch's first operation inserting `id`, queued and left open for what follows.
    let first = |id: i64| {
        let (group, sql) = (group.clone(), sql.clone());
        async move {
            let mut op = group.hold(|| sql.write()).await?;
            insert(id).execute(&mut **op.tx()).await?;
            anyhow::Ok(tokio::spawn(op.commit_followed()))
        }
    };

    // It succeeds: one commit of both.
    let queued = first(1).await?;
    let mut op = group.hold_deferred(|| sql.write()).await?;
    insert(2).execute(&mut **op.tx()).await?;
    op.commit().await?;
    within(queued).await??;

    // Dropped before it ran anything: the others commit.
    let queued = first(3).await?;
    drop(group.hold_deferred(|| sql.write()).await?);
    within(queued).await??;

    // A statement of it fails: the batch fails whole.
    let queued = first(4).await?;
    let mut op = group.hold_deferred(|| sql.write()).await?;
    insert(5).execute(&mut **op.tx()).await?;
    let dup = insert(4).execute(&mut **op.tx()).await;
    assert!(dup.is_err(), "a duplicate key was accepted");
    drop(op);
    let failed = within(queued).await?;
    let message = failed.expect_err("the batch of a failed unprotected operation committed");
    assert!(
        message.to_string().contains("could not be undone alone"),
        "{message}"
    );

    // Protected after a statement: it fails alone, that statement kept with the batch.
    let queued = first(6).await?;
    let mut op = group.hold_deferred(|| sql.write()).await?;
    insert(7).execute(&mut **op.tx()).await?;
    op.protect().await?;
    insert(8).execute(&mut **op.tx()).await?;
    assert!(insert(6).execute(&mut **op.tx()).await.is_err());
    drop(op);
    within(queued).await??;

    let rows: Vec<i64> = sqlx::query_scalar("SELECT id FROM batch_rows ORDER BY id")
        .fetch_all(sql.pool())
        .await?;
    assert_eq!(rows, [1, 2, 3, 6, 7], "what each step left");
    let commits: Vec<usize> = stats.lock().unwrap().iter().map(|s| s.operations).collect();
    assert_eq!(commits, [2, 1, 1], "the failed batch was never committed");
    Ok(())
}

/// What one writer sent and what it was told.
#[derive(Default)]
struct Sent {
    /// request id → changes, for every request sent.
    requests: BTreeMap<String, BTreeMap<Hash, i64>>,
    /// request id → revision, for every request answered 2xx.
    answered: BTreeMap<String, u64>,
    /// Nodes whose lease answered ready, with their content.
    stored: Vec<(Hash, String)>,
}

async fn a_killed_server_loses_no_answered_write(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let sp = space("s");
    let mut pool = Vec::new();
    {
        let server = env.start()?;
        let client = app.client(&server);
        for i in 0..64u32 {
            let (h, bytes) = leaf(format!("referenced {i}").as_bytes());
            client.ensure_node(&sp, &h, &bytes, 3_600_000).await?;
            pool.push(h);
        }
    }
    let pool = Arc::new(pool);
    let sent: Arc<Mutex<Sent>> = Arc::default();
    for round in 0..3u32 {
        let server = env.start()?;
        let client = app.client(&server).with_retry(RetryPolicy {
            attempts: 1,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
        });
        let mut writers = Vec::new();
        for w in 0..24u32 {
            let (client, sp, pool, sent) = (client.clone(), sp.clone(), pool.clone(), sent.clone());
            writers.push(tokio::spawn(async move {
                for n in 0u32.. {
                    if w % 4 == 0 {
                        let content = format!("new {round} {w} {n}");
                        let (h, bytes) = leaf(content.as_bytes());
                        if client
                            .ensure_node(&sp, &h, &bytes, 3_600_000)
                            .await
                            .is_err()
                        {
                            return;
                        }
                        sent.lock().unwrap().stored.push((h, content));
                        continue;
                    }
                    if w % 4 == 1 {
                        // Eight new small nodes inline in one batch lease.
                        let nodes: Vec<(Hash, String, bytes::Bytes)> = (0..8)
                            .map(|k| {
                                let content = format!("batch {round} {w} {n} {k}");
                                let (h, bytes) = leaf(content.as_bytes());
                                (h, content, bytes)
                            })
                            .collect();
                        let elements = nodes
                            .iter()
                            .map(|(h, _, bytes)| cas_format::wire::BatchLeaseElement {
                                hash: *h,
                                lease_duration_ms: 3_600_000,
                                upload_bytes: None,
                                content: Some(base64::Engine::encode(
                                    &base64::engine::general_purpose::STANDARD,
                                    bytes,
                                )),
                                content_bytes: None,
                                delta_base: None,
                            })
                            .collect();
                        let Ok(results) = client.lease_batch(&sp, elements).await else {
                            return;
                        };
                        for ((h, content, _), r) in nodes.into_iter().zip(results) {
                            if matches!(
                                r,
                                cas_format::wire::BatchLeaseResult::Lease(
                                    cas_format::wire::LeaseResponse::Ready { .. }
                                )
                            ) {
                                sent.lock().unwrap().stored.push((h, content));
                            }
                        }
                        continue;
                    }
                    let id = format!("r{round}-w{w}-n{n}");
                    let k = (w * 7 + n * 3) as usize;
                    let changes: BTreeMap<Hash, i64> = (0..3)
                        .map(|j| (pool[(k + j * 11) % pool.len()], 1))
                        .collect();
                    sent.lock()
                        .unwrap()
                        .requests
                        .insert(id.clone(), changes.clone());
                    let Ok(rid) = id.parse() else { return };
                    match client.update_root_refs(&sp, &rid, changes).await {
                        Ok(r) => {
                            sent.lock().unwrap().answered.insert(id, r.revision);
                        }
                        Err(_) => return,
                    }
                }
            }));
        }
        // Kill while writes are in flight, once some have been answered in this round (a
        // loaded machine answers later; the kill must not come before any answer).
        let answered_before = sent.lock().unwrap().answered.len();
        tokio::time::sleep(Duration::from_millis(400 + 300 * round as u64)).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while sent.lock().unwrap().answered.len() < answered_before + 8
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        server.kill();
        for w in writers {
            w.await?;
        }
    }

    let server = env.start()?;
    let client = app.client(&server);
    let sent = std::mem::take(&mut *sent.lock().unwrap());
    assert!(
        sent.answered.len() > 20,
        "the writers got answers before the kills"
    );
    // Every answered request is there, at the revision it was told.
    for (id, revision) in &sent.answered {
        let r = client
            .update_root_refs(&sp, &id.parse()?, sent.requests[id].clone())
            .await?;
        assert!(r.idempotent, "{id} was answered but is not there");
        assert_eq!(r.revision, *revision, "{id} moved");
    }
    // Every request sent is applied exactly once after replaying them all: none was applied
    // in part.
    for (id, changes) in &sent.requests {
        client
            .update_root_refs(&sp, &id.parse()?, changes.clone())
            .await?;
    }
    let mut expected: BTreeMap<Hash, i64> = BTreeMap::new();
    for changes in sent.requests.values() {
        for h in changes.keys() {
            *expected.entry(*h).or_default() += 1;
        }
    }
    assert!(pool.len() < 200, "one page holds every balance");
    let page = client.list_root_refs(&sp, 200, None).await?;
    let got: BTreeMap<Hash, i64> = page.items.iter().map(|i| (i.hash, i.ref_count)).collect();
    assert_eq!(got, expected, "each request applied exactly once");
    // Every node answered ready is still ready and whole.
    assert!(!sent.stored.is_empty());
    assert!(
        sent.stored.iter().any(|(_, c)| c.starts_with("batch")),
        "batch leases stored nodes before the kills"
    );
    for (h, content) in &sent.stored {
        assert_eq!(&client.read_node(&sp, h).await?[..], content.as_bytes());
    }
    // The replays went through batch commits, and `/metrics` counts every one of them.
    let text = reqwest::get(format!("{}/metrics", server.url))
        .await?
        .text()
        .await?;
    let value = |series: &str| metric(&text, series);
    let replays = (sent.answered.len() + sent.requests.len()) as f64;
    let operations = value("unicas_commit_batch_operations_sum");
    let commits = value("unicas_commit_batch_operations_count");
    assert!(
        operations >= replays && commits >= 1.0 && commits <= operations,
        "{operations} operations in {commits} commits for {replays} replays:\n{text}"
    );
    assert!(value("unicas_commit_duration_seconds_count") == commits);
    assert_eq!(value("unicas_commit_failures_total"), 0.0);
    drop(server);
    env.assert_consistent("hub")?;
    env.check_invariants(&env.meta().await?, &app.app).await?;
    Ok(())
}

/// Every Postgres connection of a pool has Nagle's algorithm off (`TCP_NODELAY`): with it on, a
/// statement larger than one segment (a multi-row write of a batch) waits for the server's
/// delayed ACK, about 40 ms, while its batch holds the partition. The sockets are found among
/// this process's descriptors by their peer's port.
#[tokio::test]
async fn postgres_connections_send_without_delay() -> anyhow::Result<()> {
    use rustix::process::{PidfdFlags, PidfdGetfdFlags, getpid, pidfd_getfd, pidfd_open};
    let env = TestEnv::new(Backend::POSTGRES_FS).await?;
    let url = env.vars["UNICAS_DATABASE_URL"].clone();
    let port = reqwest::Url::parse(&url)?.port().unwrap_or(5432);
    let sql = SqlPool::connect(PoolOptions {
        url,
        max_connections: 4,
        sqlite_full_sync: true,
        create_dir: None,
    })
    .await?;
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut conn = sql.pool().acquire().await?;
        sqlx::query("SELECT 1").execute(&mut *conn).await?;
        held.push(conn);
    }
    let me = pidfd_open(getpid(), PidfdFlags::empty())?;
    let mut sockets = 0;
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let Ok(n) = entry?.file_name().to_string_lossy().parse() else {
            continue;
        };
        // A copy of the descriptor, borrowed through the process's own pidfd.
        let Ok(fd) = pidfd_getfd(&me, n, PidfdGetfdFlags::empty()) else {
            continue;
        };
        let Ok(Some(peer)) = rustix::net::getpeername(&fd) else {
            continue;
        };
        if std::net::SocketAddr::try_from(peer).is_ok_and(|a| a.port() == port) {
            assert!(
                rustix::net::sockopt::tcp_nodelay(&fd)?,
                "a Postgres connection (descriptor {n}) waits for ACKs"
            );
            sockets += 1;
        }
    }
    assert!(
        sockets >= held.len(),
        "{sockets} Postgres connections found"
    );
    Ok(())
}

// Each scenario on SQLite and on Postgres: the object store plays no part in batching.
hub_e2e!(
    a_failing_operation_fails_alone,
    a_batch_left_open_commits_with_or_without_its_follower,
    an_operation_without_a_savepoint_fails_with_its_batch,
    a_killed_server_loses_no_answered_write
);
