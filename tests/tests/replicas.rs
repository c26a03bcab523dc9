//! Scale-out: three `unicas-server` replicas over one Postgres database and one object store.
//! Clients spread over them store DAGs over shared children, add and drop root refs, and every
//! replica runs GC at once; one replica is killed (SIGKILL) and restarted mid-run. Afterwards
//! fsck is clean, nothing held is missing, and the App's revisions are gap-free.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cas_client::{AppCasClient, ClientError};
use cas_format::Hash;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::Row;
use tests::*;
use tokio::sync::{Mutex, RwLock};

const LEASE: u64 = 4000;
const REPLICAS: usize = 3;

/// The replicas and a client for each; a slot is `None` while its replica is down.
struct Fleet {
    clients: RwLock<Vec<Option<AppCasClient>>>,
}

impl Fleet {
    async fn pick(&self, rng: &mut StdRng) -> AppCasClient {
        loop {
            let live: Vec<AppCasClient> = self
                .clients
                .read()
                .await
                .iter()
                .flatten()
                .cloned()
                .collect();
            if !live.is_empty() {
                return live[rng.random_range(0..live.len())].clone();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Runs `op` on a random live replica, moving to another one on a transport failure (a
    /// killed replica); every operation here is idempotent, so redoing it is safe.
    async fn run<T, F, Fut>(&self, rng: &mut StdRng, op: F) -> Result<T, ClientError>
    where
        F: Fn(AppCasClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let mut last = None;
        for _ in 0..20 {
            let client = self.pick(rng).await;
            match op(client).await {
                Err(e @ ClientError::Transport(_)) => {
                    last = Some(e);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e @ ClientError::Api { status: 503, .. }) => {
                    last = Some(e);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => return other,
            }
        }
        Err(last.unwrap_or(ClientError::Protocol("no replica answered".into())))
    }
}

fn quick(client: AppCasClient) -> AppCasClient {
    // Few retries on one replica: the fleet moves to another one instead.
    client.with_retry(cas_client::RetryPolicy {
        attempts: 2,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(100),
    })
}

async fn three_replicas(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_DATABASE_MAX_CONNECTIONS", 6);
    let app = env.create_app("hub")?;
    let mut servers: Vec<Option<Server>> = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..REPLICAS {
        let s = env.start()?;
        clients.push(Some(quick(app.client(&s))));
        servers.push(Some(s));
    }
    let fleet = Arc::new(Fleet {
        clients: RwLock::new(clients),
    });
    let sp = space("s");
    let shared: Vec<(Hash, Bytes)> = (0..12u8).map(|i| leaf(&[b'c', i])).collect();
    let held: Arc<Mutex<Vec<Held>>> = Arc::new(Mutex::new(Vec::new()));
    let acknowledged: Arc<Mutex<BTreeMap<String, u64>>> = Arc::new(Mutex::new(BTreeMap::new()));
    let counter = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(12);

    // GC on every replica at once, all the time.
    let mut gc_tasks = Vec::new();
    for r in 0..REPLICAS {
        let (fleet, stop, sp) = (fleet.clone(), stop.clone(), sp.clone());
        gc_tasks.push(tokio::spawn(async move {
            let mut passes = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let client = fleet.clients.read().await[r].clone();
                if let Some(client) = client {
                    match client.gc(&sp, Some(100)).await {
                        Ok(_) => passes += 1,
                        Err(ClientError::Transport(_) | ClientError::Api { status: 503, .. }) => {}
                        Err(e) => return Err(anyhow::anyhow!("gc on replica {r}: {e}")),
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            anyhow::Ok(passes)
        }));
    }
    let mut workers = Vec::new();
    for w in 0..4u64 {
        let (fleet, shared, held, acknowledged, counter, sp) = (
            fleet.clone(),
            shared.clone(),
            held.clone(),
            acknowledged.clone(),
            counter.clone(),
            sp.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(w);
            let mut made = 0u64;
            while Instant::now() < deadline {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                let kids: Vec<(Hash, Bytes)> = (0..rng.random_range(1..5))
                    .map(|_| shared[rng.random_range(0..shared.len())].clone())
                    .collect();
                let refs: Vec<Hash> = kids.iter().map(|(h, _)| *h).collect();
                let (p, p_b) = node("application/x-test", &refs, &n.to_le_bytes());
                let mut nodes: HashMap<Hash, Bytes> = kids.into_iter().collect();
                nodes.insert(p, p_b);
                let nodes = Arc::new(nodes);
                fleet
                    .run(&mut rng, |c| {
                        let (nodes, sp) = (nodes.clone(), sp.clone());
                        async move { c.store_dag(&sp, &nodes, &[p], LEASE, 4).await }
                    })
                    .await?;
                let id = format!("hold:{n}");
                let r = fleet
                    .run(&mut rng, |c| {
                        let (id, sp) = (id.clone(), sp.clone());
                        async move {
                            c.update_root_refs(&sp, &id.parse().unwrap(), BTreeMap::from([(p, 1)]))
                                .await
                        }
                    })
                    .await?;
                acknowledged.lock().await.insert(id, r.revision);
                held.lock().await.push((p, refs));
                made += 1;
                if rng.random_bool(0.4) {
                    let victim = {
                        let mut h = held.lock().await;
                        let len = h.len();
                        (len > 3).then(|| h.remove(rng.random_range(0..len)))
                    };
                    if let Some((v, _)) = victim {
                        let id = format!("release:{n}");
                        let r = fleet
                            .run(&mut rng, |c| {
                                let (id, sp) = (id.clone(), sp.clone());
                                async move {
                                    c.update_root_refs(
                                        &sp,
                                        &id.parse().unwrap(),
                                        BTreeMap::from([(v, -1)]),
                                    )
                                    .await
                                }
                            })
                            .await?;
                        acknowledged.lock().await.insert(id, r.revision);
                    }
                }
            }
            anyhow::Ok(made)
        }));
    }
    // Kill replica 1 mid-run and bring it back on a new port.
    tokio::time::sleep(Duration::from_secs(4)).await;
    fleet.clients.write().await[1] = None;
    servers[1].take().expect("replica 1").kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let restarted = env.start()?;
    fleet.clients.write().await[1] = Some(quick(app.client(&restarted)));
    servers[1] = Some(restarted);

    let mut made = 0;
    for w in workers {
        made += w.await??;
    }
    stop.store(true, Ordering::SeqCst);
    let mut passes = 0;
    for t in gc_tasks {
        passes += t.await??;
    }
    eprintln!("three_replicas: {made} parents, {passes} GC passes");
    assert!(made > 10 && passes > 10, "the run did some work");

    // Revisions: gap-free, strictly increasing, each acknowledged update at its revision.
    let db = env.database().await?;
    let events = sqlx::query(
        "SELECT revision, request_id FROM root_ref_events WHERE app_id = 'hub' ORDER BY revision",
    )
    .fetch_all(&db)
    .await?;
    let revisions: Vec<i64> = events.iter().map(|r| r.get("revision")).collect();
    assert_eq!(
        revisions,
        (1..=revisions.len() as i64).collect::<Vec<_>>(),
        "gap-free revisions"
    );
    let by_id: BTreeMap<String, i64> = events
        .iter()
        .map(|r| (r.get("request_id"), r.get("revision")))
        .collect();
    assert_eq!(
        by_id.len(),
        events.len(),
        "one event per request id: replays after a kill applied nothing twice"
    );
    for (id, rev) in acknowledged.lock().await.iter() {
        assert_eq!(by_id.get(id), Some(&(*rev as i64)), "acknowledged {id}");
    }
    // Nothing held is missing; after the leases run out, only held nodes remain.
    let meta = env.meta().await?;
    env.check_invariants(&meta, &app.app).await?;
    let mut rng = StdRng::seed_from_u64(99);
    let held = held.lock().await.clone();
    let mut expected = BTreeSet::new();
    for (p, kids) in &held {
        expected.insert(*p);
        expected.extend(kids.iter().copied());
    }
    for h in &expected {
        let sp = sp.clone();
        fleet
            .run(&mut rng, |c| {
                let sp = sp.clone();
                async move { c.read_metadata(&sp, h).await }
            })
            .await?;
    }
    tokio::time::sleep(Duration::from_millis(LEASE + 300)).await;
    for _ in 0..4 {
        let sp = sp.clone();
        fleet
            .run(&mut rng, |c| {
                let sp = sp.clone();
                async move { c.gc(&sp, Some(10_000)).await }
            })
            .await?;
    }
    let usage = {
        let sp = sp.clone();
        fleet
            .run(&mut rng, |c| {
                let sp = sp.clone();
                async move { c.usage(&sp).await }
            })
            .await?
    };
    assert_eq!(
        usage.node_count as usize,
        expected.len(),
        "only held nodes remain"
    );
    // The replicas' passes packed them, one packer at a time.
    let packs = meta.packs(&app.app, Some(&sp)).await?;
    assert!(!packs.is_empty(), "the replicas ran with packs");
    env.check_invariants(&meta, &app.app).await?;
    env.assert_consistent("hub")?;
    drop(servers);
    Ok(())
}

/// A replica plans a partition's root-ref batches from the state it holds while that state is
/// current (Postgres), and never trusts it once another replica wrote: counts, refusals,
/// replays and conflicts stay exact whichever replica answers.
async fn held_root_ref_state_is_checked_by_the_write(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let (one, two) = (env.start()?, env.start()?);
    let (c1, c2) = (app.client(&one), app.client(&two));
    let sp = space("s");
    let (x, xb) = leaf(b"x");
    let (y, yb) = leaf(b"y");
    for (h, bytes) in [(&x, &xb), (&y, &yb)] {
        c1.ensure_node(&sp, h, bytes, 600_000).await?;
    }
    let rid = |s: &str| s.parse::<cas_format::RequestId>().unwrap();
    async fn checked(server: &Server, check: &str) -> anyhow::Result<f64> {
        let series = format!("unicas_root_ref_batches_total{{check=\"{check}\"}}");
        let n = server.metric(&series).await?;
        Ok(if n.is_nan() { 0.0 } else { n })
    }
    let update = |c: &AppCasClient, id: &str, changes: &[(Hash, i64)]| {
        let (c, id, changes) = (c.clone(), rid(id), changes.iter().copied().collect());
        let sp = sp.clone();
        async move { c.update_root_refs(&sp, &id, changes).await }
    };
    let count = |h: Hash| {
        let (c, sp) = (c2.clone(), sp.clone());
        async move { anyhow::Ok(c.read_metadata(&sp, &h).await?.state.root_ref_count) }
    };

    // Replica one reads the nodes once, then plans from what it holds.
    assert_eq!(update(&c1, "a1", &[(x, 1), (y, 1)]).await?.revision, 1);
    assert_eq!(update(&c1, "a2", &[(x, 1)]).await?.revision, 2);
    assert_eq!(update(&c1, "a3", &[(x, 1), (y, 1)]).await?.revision, 3);
    assert_eq!(checked(&one, "held").await?, 2.0);
    assert_eq!(checked(&one, "read").await?, 1.0);

    // Replica two takes x to zero; one still holds x at 3, finds that stale on writing, reads,
    // and refuses what would take x below zero.
    assert_eq!(update(&c2, "b1", &[(x, -3)]).await?.revision, 4);
    let e = update(&c1, "a4", &[(x, -1), (y, 1)]).await.unwrap_err();
    assert_eq!(e.code(), Some("NEGATIVE_AGGREGATE"), "{e}");
    assert_eq!(checked(&one, "stale").await?, 1.0);
    assert_eq!((count(x).await?, count(y).await?), (0, 2));

    // Held again after a read; a replay of a request it applied, whose nodes it holds, is
    // told apart by the write and answered as the replay it is; so is an earlier id with
    // other changes, a conflict; neither changes anything. (A batch found stale drops what
    // was held: the next one reads.) The ids carry characters that quote and escape text:
    // the held write's check and the reads must find them exactly as they were sent.
    const A5: &str = r#"a5"{'\,}"#;
    const A6: &str = r#"a6\"[],:"#;
    assert_eq!(update(&c1, A5, &[(y, 1)]).await?.revision, 5);
    assert_eq!(update(&c1, A6, &[(y, 1)]).await?.revision, 6);
    assert_eq!(checked(&one, "held").await?, 3.0);
    let replay = update(&c1, A6, &[(y, 1)]).await?;
    assert_eq!((replay.revision, replay.idempotent), (6, true));
    assert_eq!(checked(&one, "stale").await?, 2.0);
    assert_eq!(update(&c1, "a7", &[(y, 1)]).await?.revision, 7);
    let e = update(&c1, A5, &[(y, 2)]).await.unwrap_err();
    assert_eq!(e.code(), Some("IDEMPOTENCY_CONFLICT"), "{e}");
    assert_eq!(checked(&one, "stale").await?, 3.0);
    assert_eq!((count(x).await?, count(y).await?), (0, 5));

    // Replica two's own writes: x back from zero (never held there, so read).
    assert_eq!(update(&c2, "b2", &[(x, 2), (y, -1)]).await?.revision, 8);
    assert_eq!(update(&c1, "a8", &[(x, 1), (y, 1)]).await?.revision, 9);
    assert_eq!(update(&c1, "a9", &[(x, 1), (y, 1)]).await?.revision, 10);
    assert_eq!(checked(&one, "held").await?, 4.0);
    assert_eq!((count(x).await?, count(y).await?), (4, 6));
    assert_eq!(c1.list_root_refs(&sp, 10, None).await?.revision, 10);
    env.assert_consistent("hub")?;
    Ok(())
}

fn run(b: Backend) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
        .block_on(three_replicas(b))
        .unwrap();
}

#[test]
fn three_replicas_postgres_s3() {
    run(Backend::POSTGRES_S3)
}

#[test]
fn three_replicas_postgres_fs() {
    run(Backend::POSTGRES_FS)
}

#[test]
fn held_root_ref_state_is_checked_by_the_write_postgres_fs() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
        .block_on(held_root_ref_state_is_checked_by_the_write(
            Backend::POSTGRES_FS,
        ))
        .unwrap();
}
