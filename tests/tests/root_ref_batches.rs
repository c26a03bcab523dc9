//! Root refs end to end: updates, replays, every refusal, stable balance pages; and updates
//! of one partition applied together with nothing of that visible: each update keeps its own
//! revision, its own answer and its own place in the balance history, replays and conflicts
//! are told apart inside a batch as across batches, and a refused update changes nothing;
//! updates whose requests go away at any moment are applied whole or not at all.

use std::collections::BTreeMap;
use std::time::Duration;

use cas_client::ClientError;
use cas_format::wire::RootRefPage;
use cas_format::{Hash, RequestId};
use serde_json::json;
use tests::partition::{NODES, Partition, all_of, checked_log};
use tests::*;

const LEASE: u64 = 60_000;

fn api_code(e: &ClientError) -> String {
    e.code().unwrap_or("none").to_string()
}

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
    let Partition {
        env,
        server,
        client,
        sp,
        nodes,
    } = Partition::new(b).await?;
    let (stranger, _) = leaf(b"never stored");
    let commits_before = server
        .metric("unicas_commit_batch_operations_count")
        .await?;

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
    let filter = all_of(&sp);
    for (revision, counts) in &expected {
        let at: BTreeMap<Hash, i64> = meta
            .balances_at(&app_id, filter, *revision as i64, None, 100)
            .await?
            .into_iter()
            .map(|b| (b.hash, b.ref_count))
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
    let commits = server
        .metric("unicas_commit_batch_operations_count")
        .await?
        - commits_before;
    assert!(
        commits < applied.len() as f64,
        "{commits} commits for {} updates",
        applied.len()
    );
    Ok(())
}

/// Updates whose requests go away at any moment (before their turn, while their turn waits
/// for the partition, while they are applied): each is applied whole or not at all, every
/// answered one is there with its own revision, revisions stay consecutive, the balances are
/// the sum of the events, and the partition keeps serving (an update after them is answered).
async fn updates_whose_requests_go_away_are_whole_or_absent(b: Backend) -> anyhow::Result<()> {
    let Partition {
        env,
        server: _server,
        client,
        sp,
        nodes,
    } = Partition::new(b).await?;
    let sent = |i: usize| BTreeMap::from([(nodes[i % NODES], 1), (nodes[(i + 5) % NODES], 2)]);
    let mut tasks = Vec::new();
    for i in 0..200usize {
        let (client, sp, changes) = (client.clone(), sp.clone(), sent(i));
        // Every other request gives up after 0 to 4 ms.
        let patience = Duration::from_micros(if i % 2 == 0 {
            (i as u64 * 397) % 4000
        } else {
            60_000_000
        });
        tasks.push(tokio::spawn(async move {
            let rid: RequestId = format!("w{i}").parse()?;
            let answer =
                tokio::time::timeout(patience, client.update_root_refs(&sp, &rid, changes)).await;
            anyhow::Ok((i, answer.ok()))
        }));
    }
    let (mut answered, mut gone) = (BTreeMap::new(), 0);
    for t in tasks {
        match t.await?? {
            (i, Some(Ok(r))) => {
                assert!(r.success && !r.idempotent, "update {i}: {r:?}");
                answered.insert(format!("w{i}"), r.revision as i64);
            }
            (i, Some(Err(e))) => panic!("update {i} refused: {e}"),
            (_, None) => gone += 1,
        }
    }
    assert!(
        gone > 0 && answered.len() >= 100,
        "{gone} went away, {} answered",
        answered.len()
    );
    // The partition is not left waiting for anything.
    let last = tokio::time::timeout(
        Duration::from_secs(30),
        client.update_root_refs(&sp, &"after".parse()?, sent(0)),
    )
    .await
    .map_err(|_| anyhow::anyhow!("an update after the others was never answered"))??;

    let log = checked_log(&env, &client, &sp).await?;
    assert_eq!(log.last().map(|a| a.revision), Some(last.revision as i64));
    for a in &log {
        let i = match a.request_id.strip_prefix('w') {
            Some(i) => i.parse()?,
            None => 0,
        };
        assert_eq!(
            a.changes,
            sent(i),
            "event {} ({}) is whole",
            a.revision,
            a.request_id
        );
        if let Some(revision) = answered.remove(&a.request_id) {
            assert_eq!(
                revision, a.revision,
                "{} answered its own revision",
                a.request_id
            );
        }
    }
    assert!(
        answered.is_empty(),
        "answered but not applied: {answered:?}"
    );
    Ok(())
}

async fn root_refs(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let (sa, sb) = (space("a"), space("b"));
    let (x, xb) = leaf(b"x");
    let (y, yb) = leaf(b"y");
    for s in [&sa, &sb] {
        client.ensure_node(s, &x, &xb, LEASE).await?;
        client.ensure_node(s, &y, &yb, LEASE).await?;
    }
    let rid = |s: &str| s.parse::<cas_format::RequestId>().unwrap();

    let r1 = client
        .update_root_refs(
            &sa,
            &rid("doc:1:version:1:add-refs"),
            BTreeMap::from([(x, 2), (y, 1)]),
        )
        .await?;
    assert!(r1.success && !r1.idempotent);
    assert_eq!(r1.revision, 1);
    // App-global revisions: another Space takes the next one.
    let r2 = client
        .update_root_refs(
            &sb,
            &rid("doc:1:version:1:add-refs"),
            BTreeMap::from([(x, 1)]),
        )
        .await?;
    assert_eq!((r2.revision, r2.idempotent), (2, false));
    // Replay: same revision, idempotent, nothing applied twice.
    let replay = client
        .update_root_refs(
            &sa,
            &rid("doc:1:version:1:add-refs"),
            BTreeMap::from([(x, 2), (y, 1)]),
        )
        .await?;
    assert_eq!((replay.revision, replay.idempotent), (1, true));
    assert_eq!(client.read_metadata(&sa, &x).await?.state.root_ref_count, 2);

    let balances = |page: &RootRefPage| -> BTreeMap<Hash, i64> {
        page.items.iter().map(|i| (i.hash, i.ref_count)).collect()
    };
    let before = client.list_root_refs(&sa, 100, None).await?;
    assert_eq!(before.revision, 2);
    assert_eq!(balances(&before), BTreeMap::from([(x, 2), (y, 1)]));

    // Every refusal is all-or-nothing: x is valid in each batch and must stay at 2.
    let unknown = Hash::digest(b"unknown");
    let cases: Vec<(BTreeMap<Hash, i64>, u16, &str)> = vec![
        (
            BTreeMap::from([(x, 1), (y, 5)]),
            409,
            "IDEMPOTENCY_CONFLICT",
        ),
        (
            BTreeMap::from([(x, 1), (unknown, 1)]),
            404,
            "NODE_NOT_FOUND",
        ),
        (BTreeMap::from([(x, 1), (y, -2)]), 409, "NEGATIVE_AGGREGATE"),
        (BTreeMap::from([(x, 1), (y, 0)]), 400, "INVALID_REQUEST"),
        (
            BTreeMap::from([(x, 1), (y, 1_000_001)]),
            400,
            "INVALID_REQUEST",
        ),
        (BTreeMap::new(), 400, "INVALID_REQUEST"),
        (
            (0..1001u32)
                .map(|i| (Hash::digest(&i.to_le_bytes()), 1))
                .collect(),
            413,
            "PAYLOAD_TOO_LARGE",
        ),
    ];
    for (i, (changes, status, code)) in cases.into_iter().enumerate() {
        let id = if code == "IDEMPOTENCY_CONFLICT" {
            rid("doc:1:version:1:add-refs")
        } else {
            rid(&format!("bad:{i}"))
        };
        let e = client
            .update_root_refs(&sa, &id, changes)
            .await
            .unwrap_err();
        assert_eq!(
            (e.status(), api_code(&e).as_str()),
            (Some(status), code),
            "{e}"
        );
    }
    // Overflow: a count at the edge of the JSON-safe range, set directly in the database (a
    // node's count is the sum of its balances).
    let db = env.database().await?;
    sqlx::query(
        "INSERT INTO root_ref_balances (app_id, space_id, ref_domain, hash, ref_count) \
         VALUES ('hub', 'b', 'default', $2, $1)",
    )
    .bind((1i64 << 53) - 2)
    .bind(y.as_bytes().to_vec())
    .execute(&db)
    .await?;
    let e = client
        .update_root_refs(&sb, &rid("overflow"), BTreeMap::from([(x, 1), (y, 2)]))
        .await
        .unwrap_err();
    assert_eq!(api_code(&e), "NODE_CONFLICT");
    let after = client.list_root_refs(&sa, 100, None).await?;
    assert_eq!(after.revision, 2, "no refused update took a revision");
    assert_eq!(balances(&after), balances(&before));
    assert_eq!(client.read_metadata(&sb, &x).await?.state.root_ref_count, 1);

    // Removing to zero drops the balance row.
    let r = client
        .update_root_refs(
            &sa,
            &rid("doc:1:truncate:1-1:remove-refs"),
            BTreeMap::from([(y, -1)]),
        )
        .await?;
    assert_eq!(r.revision, 3);
    assert_eq!(
        balances(&client.list_root_refs(&sa, 100, None).await?),
        BTreeMap::from([(x, 2)])
    );

    // Raw HTTP: bad bodies.
    let token = app.token(&sa, &["cas:root-refs:update"]);
    for body in [
        "not json".to_string(),
        json!({"requestId": "has space", "changes": {x.to_string(): 1}}).to_string(),
        json!({"requestId": "", "changes": {x.to_string(): 1}}).to_string(),
        json!({"requestId": "ok", "changes": {x.to_string(): 1.5}}).to_string(),
        json!({"requestId": "ok", "changes": {"ABC": 1}}).to_string(),
        format!("{{\"requestId\":\"ok\",\"changes\":{{\"{x}\":1,\"{x}\":2}}}}"),
    ] {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/cas/root-refs", server.url))
            .query(&[("appId", "hub"), ("spaceId", "a")])
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await?;
        assert_eq!(r.status(), 400, "{body}");
        assert_eq!(
            r.json::<serde_json::Value>().await?["error"],
            "INVALID_REQUEST"
        );
    }
    // Fields this service does not know are ignored, as the public contract allows.
    let r = reqwest::Client::new()
        .post(format!("{}/v1/cas/root-refs", server.url))
        .query(&[("appId", "hub"), ("spaceId", "a")])
        .bearer_auth(&token)
        .json(&json!({"requestId": "extra", "changes": {x.to_string(): 1}, "extra": 1}))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<serde_json::Value>().await?["success"], true);
    Ok(())
}

async fn root_ref_pages_are_stable(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    let mut hashes = Vec::new();
    for i in 0..10u8 {
        let (h, bytes) = leaf(&[i; 3]);
        client.ensure_node(&sp, &h, &bytes, LEASE).await?;
        hashes.push(h);
    }
    let (kept, dropped, added) = (&hashes[..4], &hashes[4..7], &hashes[7..]);
    let all: BTreeMap<Hash, i64> = hashes[..7].iter().map(|h| (*h, 1)).collect();
    let rid = |s: &str| s.parse::<cas_format::RequestId>().unwrap();
    client
        .update_root_refs(&sp, &rid("add"), all.clone())
        .await?;
    let first = client.list_root_refs(&sp, 3, None).await?;
    assert_eq!(first.items.len(), 3);
    let cursor = first.next_cursor.clone().expect("more pages");
    // After the first page was read, balances change, fall to zero and appear.
    let change: BTreeMap<Hash, i64> = kept
        .iter()
        .map(|h| (*h, 1))
        .chain(dropped.iter().map(|h| (*h, -1)))
        .chain(added.iter().map(|h| (*h, 1)))
        .collect();
    client.update_root_refs(&sp, &rid("change"), change).await?;
    let mut seen: BTreeMap<Hash, i64> = first.items.iter().map(|i| (i.hash, i.ref_count)).collect();
    let mut next = Some(cursor);
    while let Some(c) = next {
        let page = client.list_root_refs(&sp, 3, Some(&c)).await?;
        assert_eq!(
            page.revision, first.revision,
            "every page at the first page's revision"
        );
        for i in &page.items {
            assert!(
                seen.insert(i.hash, i.ref_count).is_none(),
                "{} twice",
                i.hash
            );
        }
        next = page.next_cursor;
    }
    assert_eq!(
        seen, all,
        "the pages show the balances as of the first page"
    );
    let now: BTreeMap<Hash, i64> = client
        .list_root_refs(&sp, 200, None)
        .await?
        .items
        .iter()
        .map(|i| (i.hash, i.ref_count))
        .collect();
    let expected: BTreeMap<Hash, i64> = kept
        .iter()
        .map(|h| (*h, 2))
        .chain(added.iter().map(|h| (*h, 1)))
        .collect();
    assert_eq!(now, expected);
    // A cursor from the future is refused.
    let e = client
        .list_root_refs(&sp, 3, Some(&format!("999.{}", hashes[0])))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(400));
    Ok(())
}

e2e!(
    concurrent_updates_keep_their_own_revisions,
    updates_whose_requests_go_away_are_whole_or_absent,
    root_refs,
    root_ref_pages_are_stable
);
