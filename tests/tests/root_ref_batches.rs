//! Root-ref updates of one partition are applied together, and nothing of that is visible:
//! each update keeps its own revision, its own answer and its own place in the balance
//! history, replays and conflicts are told apart inside a batch as across batches, and a
//! refused update changes nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use cas_client::{ClientError, RetryPolicy};
use cas_format::{Hash, RequestId};
use cas_service::meta::RefFilter;
use tests::*;

const NODES: usize = 8;

/// A successful answer: revision, idempotent, and the changes that were sent.
type Answered = (u64, bool, BTreeMap<Hash, i64>);
const UPDATES: usize = 96;

/// What update `i` sends: its request id and its changes.
fn update(i: usize, nodes: &[Hash], stranger: Hash) -> (String, BTreeMap<Hash, i64>) {
    let valid = |j: usize| {
        BTreeMap::from([
            (nodes[j % NODES], 1 + (j % 3) as i64),
            (nodes[(j + 3) % NODES], 1),
        ])
    };
    match i % 8 {
        // Always refused: no count gets near a million.
        7 => (
            format!("u{i}"),
            BTreeMap::from([(nodes[i % NODES], -1_000_000)]),
        ),
        6 => (format!("u{i}"), BTreeMap::from([(stranger, 1)])),
        // The same request as `i - 2`, sent at the same time: one applies it, one replays it.
        5 => (format!("u{}", i - 2), valid(i - 2)),
        // The id of `i - 2` with other changes: exactly one of the two is applied.
        4 => (format!("u{}", i - 2), valid(i + 1)),
        _ => (format!("u{i}"), valid(i)),
    }
}

/// How the counts stand after each applied revision, replayed from the answers in revision
/// order.
fn model(applied: &BTreeMap<u64, BTreeMap<Hash, i64>>) -> BTreeMap<u64, BTreeMap<Hash, i64>> {
    let mut counts: BTreeMap<Hash, i64> = BTreeMap::new();
    applied
        .iter()
        .map(|(revision, changes)| {
            for (h, d) in changes {
                *counts.entry(*h).or_default() += d;
            }
            counts.retain(|_, c| *c != 0);
            (*revision, counts.clone())
        })
        .collect()
}

async fn concurrent_updates_keep_their_own_revisions(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server).with_retry(RetryPolicy {
        attempts: 1,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
    });
    let sp = space("s");
    let mut nodes = Vec::new();
    for i in 0..NODES as u32 {
        let (h, bytes) = leaf(&i.to_le_bytes());
        client.ensure_node(&sp, &h, &bytes, 600_000).await?;
        nodes.push(h);
    }
    let (stranger, _) = leaf(b"never stored");
    let commits_before = metric(&server, "unicas_commit_batch_operations_count").await?;

    let mut tasks = Vec::new();
    for i in 0..UPDATES {
        let (client, sp) = (client.clone(), sp.clone());
        let (id, changes) = update(i, &nodes, stranger);
        tasks.push(tokio::spawn(async move {
            let rid: RequestId = id.parse()?;
            let answer = client.update_root_refs(&sp, &rid, changes.clone()).await;
            anyhow::Ok((i, id, changes, answer))
        }));
    }
    // revision → changes, for every update applied (not replayed).
    let mut applied: BTreeMap<u64, BTreeMap<Hash, i64>> = BTreeMap::new();
    // request id → (revision, idempotent, changes sent) of each successful answer.
    let mut answers: BTreeMap<String, Vec<Answered>> = BTreeMap::new();
    let mut conflicts = 0;
    for t in tasks {
        let (i, id, changes, answer) = t.await??;
        match (i % 8, answer) {
            (7, Err(ClientError::Api { code, .. })) => {
                assert_eq!(code, "NEGATIVE_AGGREGATE", "update {i}")
            }
            (6, Err(ClientError::Api { code, .. })) => {
                assert_eq!(code, "NODE_NOT_FOUND", "update {i}")
            }
            (2 | 4, Err(ClientError::Api { code, .. })) if code == "IDEMPOTENCY_CONFLICT" => {
                conflicts += 1
            }
            (_, Ok(r)) => {
                assert!(r.success);
                if !r.idempotent {
                    let before = applied.insert(r.revision, changes.clone());
                    assert!(before.is_none(), "revision {} answered twice", r.revision);
                }
                answers
                    .entry(id)
                    .or_default()
                    .push((r.revision, r.idempotent, changes));
            }
            (_, other) => panic!("update {i} ({id}): unexpected answer {other:?}"),
        }
    }
    // Each id that succeeded was applied once; its replays name the same revision.
    for (id, got) in &answers {
        assert_eq!(
            got.iter().filter(|(_, idempotent, _)| !idempotent).count(),
            1,
            "{id}: {got:?}"
        );
        assert!(got.iter().all(|(r, _, c)| *r == got[0].0 && *c == got[0].2));
    }
    assert_eq!(
        conflicts,
        UPDATES / 8,
        "one of each pair of clashing ids is refused"
    );
    let revisions: Vec<u64> = applied.keys().copied().collect();
    let first = revisions[0];
    assert_eq!(
        revisions,
        (first..first + revisions.len() as u64).collect::<Vec<_>>(),
        "applied updates take consecutive revisions"
    );
    assert_eq!(applied.len(), UPDATES / 8 * 4);

    // The balance history and the event stream, revision by revision, are the model's.
    let expected = model(&applied);
    let meta = env.meta().await?;
    let app_id = "hub".parse()?;
    let filter = RefFilter {
        space: Some(&sp),
        hash: None,
    };
    for (revision, counts) in &expected {
        let at: BTreeMap<Hash, i64> = meta
            .balances_at(&app_id, filter, *revision as i64, None, 100)
            .await?
            .into_iter()
            .map(|(_, h, c)| (h, c))
            .collect();
        assert_eq!(&at, counts, "balances at revision {revision}");
    }
    let events = meta
        .events(&app_id, filter, first as i64 - 1, i64::MAX, 1000)
        .await?;
    assert_eq!(events.len(), applied.len());
    for e in &events {
        let changes: BTreeMap<Hash, i64> = serde_json::from_str(&e.changes)?;
        assert_eq!(
            Some(&changes),
            applied.get(&(e.revision as u64)),
            "event {}",
            e.revision
        );
    }
    let page = client.list_root_refs(&sp, 100, None).await?;
    let listed: BTreeMap<Hash, i64> = page.items.iter().map(|i| (i.hash, i.ref_count)).collect();
    assert_eq!(Some(&listed), expected.values().last());
    env.check_invariants(&meta, &app_id).await?;
    // They shared commits.
    let commits = metric(&server, "unicas_commit_batch_operations_count").await? - commits_before;
    assert!(
        commits < applied.len() as f64,
        "{commits} commits for {} updates",
        applied.len()
    );
    Ok(())
}

/// One value of the server's `/metrics`.
async fn metric(server: &Server, name: &str) -> anyhow::Result<f64> {
    let text = reqwest::get(format!("{}/metrics", server.url))
        .await?
        .text()
        .await?;
    Ok(tests::metric(&text, name))
}

e2e!(concurrent_updates_keep_their_own_revisions);
