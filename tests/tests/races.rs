//! GC safety under races. The invariant above all others: a node that is referenced, leased,
//! or being uploaded is never deleted, whatever the interleaving.
//!
//! - `model_based`: several clients run random sequences of store, root-ref, replay and GC
//!   operations concurrently; after every round the service is checked against an in-memory
//!   model (root ref counts exactly; protection of every leased or referenced node and of its
//!   descendants) and against the database invariants.
//! - `gc_stress`: GC passes run in a tight loop while uploaders build parents over shared
//!   children, reference them and drop references, and a reader checks that nothing held ever
//!   disappears.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use cas_client::{AppCasClient, ClientError};
use cas_format::{Hash, RequestId, SpaceId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tests::*;
use tokio::sync::Mutex;

/// Leases in these tests are as short as the test servers allow, so GC has work.
const SHORT: u64 = 1000;
/// Leases of the stress test's uploads.
const STRESS_LEASE: u64 = 4000;
/// Slack for the time between a check and the server's clock.
const MARGIN_MS: i64 = 400;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A fixed universe of nodes: leaves, parents over leaves (with duplicate refs), grandparents.
/// The leaves are versions of one text, each stored naming the one before as its delta base,
/// so that GC races with deltas and their bases too.
struct Universe {
    nodes: HashMap<Hash, Bytes>,
    refs: HashMap<Hash, Vec<Hash>>,
    all: Vec<Hash>,
    bases: Vec<(Hash, Hash)>,
}

impl Universe {
    fn new(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut nodes = HashMap::new();
        let mut refs = HashMap::new();
        let mut all = Vec::new();
        let mut add = |h: Hash, b: Bytes, r: Vec<Hash>, all: &mut Vec<Hash>| {
            nodes.insert(h, b);
            refs.insert(h, r);
            all.push(h);
        };
        let text: String = (0..200)
            .map(|k| format!("line {k} of a notebook\n"))
            .collect();
        let leaves: Vec<Hash> = (0..12u8)
            .map(|i| {
                let (h, b) = leaf(format!("{text}version {i}\n").as_bytes());
                add(h, b, vec![], &mut all);
                h
            })
            .collect();
        let bases = leaves.windows(2).map(|w| (w[1], w[0])).collect();
        let mut parents = Vec::new();
        for i in 0..6u8 {
            let n = rng.random_range(2..5);
            let r: Vec<Hash> = (0..n)
                .map(|_| leaves[rng.random_range(0..leaves.len())])
                .collect();
            let (h, b) = node("application/x-test", &r, &[b'p', i]);
            add(h, b, r, &mut all);
            parents.push(h);
        }
        for i in 0..2u8 {
            let r = vec![
                parents[i as usize * 2],
                parents[i as usize * 2 + 1],
                parents[5],
            ];
            let (h, b) = node("application/x-test", &r, &[b'g', i]);
            add(h, b, r, &mut all);
        }
        Universe {
            nodes,
            refs,
            all,
            bases,
        }
    }

    fn descendants(&self, h: &Hash, out: &mut BTreeSet<Hash>) {
        for c in &self.refs[h] {
            if out.insert(*c) {
                self.descendants(c, out);
            }
        }
    }
}

/// An accepted root-ref update: its changes and revision.
type Accepted = (BTreeMap<Hash, i64>, u64);

/// What the service must agree with.
#[derive(Default)]
struct Model {
    root: BTreeMap<Hash, i64>,
    lease_until: BTreeMap<Hash, i64>,
    /// Accepted updates by request id.
    requests: BTreeMap<String, Accepted>,
    /// Nodes whose references no client drops: a delta and its base, so that every round
    /// races with a delta in place whatever the seed draws.
    pinned: BTreeSet<Hash>,
}

impl Model {
    /// Nodes the service must not have deleted: referenced or leased, and their descendants.
    fn protected(&self, u: &Universe, now: i64) -> BTreeSet<Hash> {
        let mut out = BTreeSet::new();
        for (h, n) in &self.root {
            if *n > 0 {
                out.insert(*h);
            }
        }
        for (h, until) in &self.lease_until {
            if *until > now + MARGIN_MS {
                out.insert(*h);
            }
        }
        let roots: Vec<Hash> = out.iter().copied().collect();
        for h in roots {
            u.descendants(&h, &mut out);
        }
        out
    }
}

fn is_gone(e: &ClientError) -> bool {
    matches!(e.code(), Some("NODE_NOT_FOUND" | "NODE_NOT_READY"))
}

async fn store(
    client: &AppCasClient,
    sp: &SpaceId,
    u: &Universe,
    h: Hash,
    model: &Mutex<Model>,
) -> anyhow::Result<()> {
    let started = now_ms();
    let mut plan = cas_client::Plan::default();
    for b in u.nodes.values() {
        plan.add_portable(b.clone())?;
    }
    for (n, base) in &u.bases {
        plan.suggest_base(*n, *base);
    }
    cas_client::Uploader::new(client, sp, &plan, SHORT, 4)
        .run(&[h])
        .await?;
    // Every node of the subtree was leased for SHORT at or after `started`.
    let mut sub = BTreeSet::from([h]);
    u.descendants(&h, &mut sub);
    let mut m = model.lock().await;
    for n in sub {
        let e = m.lease_until.entry(n).or_default();
        *e = (*e).max(started + SHORT as i64);
    }
    Ok(())
}

/// Stores the second version of the text while the first is leased, naming the first as its
/// base, and references both for the whole test (the model records the update).
async fn pin_a_delta(
    client: &AppCasClient,
    sp: &SpaceId,
    u: &Universe,
    model: &Mutex<Model>,
) -> anyhow::Result<()> {
    let (node, base) = u.bases[0];
    store(client, sp, u, base, model).await?;
    store(client, sp, u, node, model).await?;
    let id = "pin:0".to_string();
    let changes = BTreeMap::from([(node, 1), (base, 1)]);
    let r = client
        .update_root_refs(sp, &id.parse()?, changes.clone())
        .await?;
    let mut m = model.lock().await;
    for h in [node, base] {
        *m.root.entry(h).or_default() += 1;
        m.pinned.insert(h);
    }
    m.requests.insert(id, (changes, r.revision));
    Ok(())
}

async fn model_based(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let meta = env.meta().await?;
    let sp = space("s");
    let seed: u64 = std::env::var("UNICAS_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("model_based seed {seed} (rerun with UNICAS_TEST_SEED={seed})");
    let u = Arc::new(Universe::new(seed));
    let model = Arc::new(Mutex::new(Model::default()));
    let counter = Arc::new(AtomicU64::new(0));
    const CLIENTS: usize = 4;
    const ROUNDS: usize = 30;
    // Nodes found stored as deltas, and packed, at the end of some round.
    let mut deltas_seen = BTreeSet::new();
    let mut packed_seen = BTreeSet::new();
    pin_a_delta(&app.client(&server), &sp, &u, &model).await?;
    for round in 0..ROUNDS {
        let mut tasks = Vec::new();
        for c in 0..CLIENTS {
            let client = app.client(&server);
            let (u, model, sp, counter) = (u.clone(), model.clone(), sp.clone(), counter.clone());
            let mut rng = StdRng::seed_from_u64(seed ^ ((round * CLIENTS + c) as u64) << 16);
            tasks.push(tokio::spawn(async move {
                let h = u.all[rng.random_range(0..u.all.len())];
                match rng.random_range(0..10) {
                    0..=3 => store(&client, &sp, &u, h, &model).await?,
                    4..=5 => {
                        // +1 on a node we may or may not hold.
                        let id = format!("add:{}", counter.fetch_add(1, Ordering::SeqCst));
                        let changes = BTreeMap::from([(h, 1)]);
                        match client
                            .update_root_refs(&sp, &id.parse()?, changes.clone())
                            .await
                        {
                            Ok(r) => {
                                let mut m = model.lock().await;
                                *m.root.entry(h).or_default() += 1;
                                m.requests.insert(id, (changes, r.revision));
                            }
                            Err(e) if is_gone(&e) => {
                                // Refused as gone: a violation only if the node was protected
                                // for the whole request, i.e. still is now that it answered.
                                let protected =
                                    model.lock().await.protected(&u, now_ms()).contains(&h);
                                anyhow::ensure!(!protected, "+1 on protected {h} refused: {e}");
                            }
                            Err(e) => anyhow::bail!("+1 on {h}: {e}"),
                        }
                    }
                    6 => {
                        // Choose a held node and reserve its decrement under one lock, so no
                        // other client can take the same last reference.
                        let chosen = {
                            let mut m = model.lock().await;
                            let held: Vec<Hash> = m
                                .root
                                .iter()
                                .filter(|(h, n)| **n > 0 && !m.pinned.contains(*h))
                                .map(|(h, _)| *h)
                                .collect();
                            let h = held.get(rng.random_range(0..held.len().max(1))).copied();
                            if let Some(h) = h {
                                m.root.entry(h).and_modify(|n| *n -= 1);
                            }
                            h
                        };
                        if let Some(h) = chosen {
                            let id = format!("drop:{}", counter.fetch_add(1, Ordering::SeqCst));
                            let changes = BTreeMap::from([(h, -1)]);
                            let r = client
                                .update_root_refs(&sp, &id.parse()?, changes.clone())
                                .await?;
                            model
                                .lock()
                                .await
                                .requests
                                .insert(id, (changes, r.revision));
                        }
                    }
                    7 => {
                        let old: Option<(String, Accepted)> = {
                            let m = model.lock().await;
                            let n = m.requests.len();
                            (n > 0).then(|| {
                                let (k, v) = m.requests.iter().nth(rng.random_range(0..n)).unwrap();
                                (k.clone(), v.clone())
                            })
                        };
                        if let Some((id, (changes, revision))) = old {
                            let r = client
                                .update_root_refs(&sp, &id.parse::<RequestId>()?, changes.clone())
                                .await?;
                            anyhow::ensure!(
                                r.idempotent && r.revision == revision,
                                "replay of {id}: {r:?}"
                            );
                            let other: BTreeMap<Hash, i64> =
                                changes.keys().map(|h| (*h, 7)).collect();
                            let e = client
                                .update_root_refs(&sp, &id.parse::<RequestId>()?, other)
                                .await
                                .unwrap_err();
                            anyhow::ensure!(e.code() == Some("IDEMPOTENCY_CONFLICT"), "{e}");
                        }
                    }
                    8 => {
                        client.gc(&sp, Some(rng.random_range(1..50))).await?;
                    }
                    _ => tokio::time::sleep(Duration::from_millis(rng.random_range(0..400))).await,
                }
                anyhow::Ok(())
            }));
        }
        for t in tasks {
            t.await??;
        }
        // Check against the model.
        let client = app.client(&server);
        let m = model.lock().await;
        let now = now_ms();
        let protected = m.protected(&u, now);
        for h in &u.all {
            if let Some(row) = meta.node(&app.app, &sp, h).await? {
                if row.delta.is_some() {
                    deltas_seen.insert(*h);
                }
                if row.pack.is_some() {
                    packed_seen.insert(*h);
                }
            }
        }
        for h in &protected {
            let read = match client.read_metadata(&sp, h).await {
                Ok(meta) => client.read_node(&sp, h).await.map(|c| (meta, c)),
                Err(e) => Err(e),
            };
            match read {
                Ok((meta, content)) => {
                    let want = m.root.get(h).copied().unwrap_or(0);
                    anyhow::ensure!(
                        meta.state.root_ref_count == want,
                        "round {round}: {h} has {} root refs, the model {want}",
                        meta.state.root_ref_count
                    );
                    let stored = cas_format::decode_portable(
                        &u.nodes[h],
                        &cas_format::NodeLimits::format_max(),
                    )?;
                    anyhow::ensure!(
                        content == stored.content,
                        "round {round}: {h} reads other bytes"
                    );
                }
                Err(e)
                    if now_ms() > now + MARGIN_MS && m.root.get(h).copied().unwrap_or(0) == 0 =>
                {
                    // The check itself outlived a lease; not a verdict.
                    let _ = e;
                }
                Err(e) => anyhow::bail!("round {round}: protected node {h} is gone: {e}"),
            }
        }
        drop(m);
        env.check_invariants(&meta, &app.app).await?;
    }
    assert!(!deltas_seen.is_empty(), "the races ran with deltas");
    assert!(!packed_seen.is_empty(), "the races ran with packs");
    // Revisions of accepted updates are distinct and gap-free.
    let m = model.lock().await;
    let revisions: BTreeSet<u64> = m.requests.values().map(|(_, r)| *r).collect();
    assert_eq!(revisions.len(), m.requests.len(), "distinct revisions");
    if let Some(max) = revisions.last() {
        assert_eq!(
            revisions,
            (1..=*max).collect::<BTreeSet<u64>>(),
            "gap-free revisions"
        );
    }
    drop(m);
    // Everything expires; GC leaves exactly the referenced closure.
    tokio::time::sleep(Duration::from_millis(SHORT + 300)).await;
    let client = app.client(&server);
    for _ in 0..6 {
        client.gc(&sp, Some(10_000)).await?;
    }
    let m = model.lock().await;
    let kept = m.protected(&u, now_ms());
    for h in &u.all {
        let present = client.read_metadata(&sp, h).await.is_ok();
        assert_eq!(
            present,
            kept.contains(h),
            "after full GC, {h} present={present}"
        );
    }
    env.check_invariants(&meta, &app.app).await?;
    env.assert_consistent("hub")?;
    Ok(())
}

async fn gc_stress(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let meta = env.meta().await?;
    let sp = space("s");
    let shared: Vec<(Hash, Bytes)> = (0..10u8).map(|i| leaf(&[b's', i])).collect();
    let stop = Arc::new(AtomicBool::new(false));
    // Parents whose root ref has been acknowledged and not yet dropped.
    let held: Arc<Mutex<Vec<Held>>> = Arc::new(Mutex::new(Vec::new()));
    let counter = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(12);
    let mut tasks = Vec::new();
    for t in 0..2 {
        let client = app.client(&server);
        let (stop, sp) = (stop.clone(), sp.clone());
        tasks.push(tokio::spawn(async move {
            let mut passes = 0u64;
            while !stop.load(Ordering::SeqCst) {
                client.gc(&sp, Some(200)).await?;
                passes += 1;
                if t == 1 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            anyhow::Ok(passes)
        }));
    }
    let mut uploaders = Vec::new();
    for w in 0..3u64 {
        let client = app.client(&server);
        let (shared, held, counter, sp) =
            (shared.clone(), held.clone(), counter.clone(), sp.clone());
        uploaders.push(tokio::spawn(async move {
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
                // The lease must outlast the time to the root ref, even on a loaded machine.
                client.store_dag(&sp, &nodes, &[p], STRESS_LEASE, 4).await?;
                client
                    .update_root_refs(&sp, &format!("hold:{n}").parse()?, BTreeMap::from([(p, 1)]))
                    .await?;
                held.lock().await.push((p, refs));
                made += 1;
                if rng.random_bool(0.5) {
                    let victim = {
                        let mut h = held.lock().await;
                        let len = h.len();
                        (len > 2).then(|| h.remove(rng.random_range(0..len)))
                    };
                    if let Some((v, _)) = victim {
                        client
                            .update_root_refs(
                                &sp,
                                &format!("release:{n}").parse()?,
                                BTreeMap::from([(v, -1)]),
                            )
                            .await?;
                    }
                }
            }
            anyhow::Ok(made)
        }));
    }
    // The reader: nothing held ever disappears, nor any of its children.
    let reader = {
        let client = app.client(&server);
        let (held, stop, sp) = (held.clone(), stop.clone(), sp.clone());
        tokio::spawn(async move {
            let mut reads = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let snapshot: Vec<(Hash, Vec<Hash>)> = held.lock().await.clone();
                for (p, kids) in snapshot {
                    for h in std::iter::once(&p).chain(kids.iter()) {
                        match client.read_metadata(&sp, h).await {
                            Ok(_) => reads += 1,
                            Err(e) => {
                                // Parents leave `held` before their release is sent, so one
                                // still there is still referenced.
                                if held.lock().await.iter().any(|(x, _)| *x == p) {
                                    anyhow::bail!("held node {h} (of parent {p}) is gone: {e}");
                                }
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            anyhow::Ok(reads)
        })
    };
    let mut made = 0;
    for u in uploaders {
        made += u.await??;
    }
    stop.store(true, Ordering::SeqCst);
    let reads = reader.await??;
    let mut passes = 0;
    for t in tasks {
        passes += t.await??;
    }
    eprintln!("gc_stress: {made} parents stored, {passes} GC passes, {reads} reads of held nodes");
    assert!(
        made > 10 && passes > 10 && reads > 10,
        "the stress did some work"
    );
    env.check_invariants(&meta, &app.app).await?;
    // After every lease expires, exactly the held parents and their children remain.
    tokio::time::sleep(Duration::from_millis(STRESS_LEASE + 300)).await;
    let client = app.client(&server);
    for _ in 0..4 {
        client.gc(&sp, Some(10_000)).await?;
    }
    let held = held.lock().await.clone();
    let mut expected: BTreeSet<Hash> = BTreeSet::new();
    for (p, kids) in &held {
        expected.insert(*p);
        expected.extend(kids.iter().copied());
    }
    let usage = client.usage(&sp).await?;
    assert_eq!(
        usage.node_count as usize,
        expected.len(),
        "only held nodes remain"
    );
    for h in &expected {
        client.read_metadata(&sp, h).await?;
    }
    env.check_invariants(&meta, &app.app).await?;
    env.assert_consistent("hub")?;
    Ok(())
}

e2e!(model_based, gc_stress);
