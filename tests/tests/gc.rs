//! Garbage collection end to end: what it frees, what it never frees, how a marked node comes
//! back, and how a crashed or failed pass is finished.

use std::collections::BTreeMap;
use std::time::Duration;

use cas_client::{AppCasClient, Ensured};
use cas_format::wire::{BatchLeaseElement, BatchLeaseResult, LeaseResponse};
use cas_format::{Hash, SpaceId};
use tests::*;

/// For calls that are meant to fail: a retry would hide the failure.
const NO_RETRY: cas_client::RetryPolicy = cas_client::RetryPolicy {
    attempts: 1,
    initial_backoff: Duration::from_millis(1),
    max_backoff: Duration::from_millis(1),
};

/// The shortest lease the test servers grant.
const SHORT: u64 = 1000;

fn rid(s: &str) -> cas_format::RequestId {
    s.parse().unwrap()
}

async fn expire() {
    tokio::time::sleep(Duration::from_millis(SHORT + 200)).await;
}

async fn gc_frees_only_what_nothing_holds(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    let (shared, shared_b) = leaf(b"shared child");
    let (lonely, lonely_b) = leaf(b"nobody holds me");
    let (kept, kept_b) = node("application/x-test", &[shared], b"kept root");
    let (dropped, dropped_b) = node("application/x-test", &[shared], b"dropped root");
    for (h, bytes) in [
        (&shared, &shared_b),
        (&lonely, &lonely_b),
        (&kept, &kept_b),
        (&dropped, &dropped_b),
    ] {
        let r = client.ensure_node(&sp, h, bytes, SHORT).await?;
        assert!(matches!(r.state, Ensured::Ready { .. }));
    }
    client
        .update_root_refs(&sp, &rid("keep"), BTreeMap::from([(kept, 1)]))
        .await?;
    let (fresh, fresh_b) = leaf(b"leased for a minute");
    client.ensure_node(&sp, &fresh, &fresh_b, 60_000).await?;

    // Nothing has expired yet: nothing goes.
    let pass = client.gc(&sp, None).await?;
    assert_eq!(pass.deleted, 0);
    expire().await;
    let pass = client.gc(&sp, None).await?;
    assert_eq!(
        pass.deleted, 2,
        "the unreferenced root and the lonely leaf: {pass:?}"
    );
    assert_eq!(
        pass.reclaimed_content_bytes,
        (b"dropped root".len() + b"nobody holds me".len()) as u64
    );
    for gone in [&lonely, &dropped] {
        assert_eq!(
            client.read_node(&sp, gone).await.unwrap_err().status(),
            Some(404)
        );
        assert!(matches!(
            client.lease_node(&sp, gone, SHORT, None).await?,
            LeaseResponse::AwaitingUpload { .. }
        ));
    }
    // The shared child lost one parent and keeps the other.
    assert_eq!(
        client
            .read_metadata(&sp, &shared)
            .await?
            .state
            .child_ref_count,
        1
    );
    for kept_node in [&kept, &shared, &fresh] {
        assert!(client.read_node(&sp, kept_node).await.is_ok());
    }
    // Dropping the last root ref: the root goes in one pass, its child in a later one.
    client
        .update_root_refs(&sp, &rid("unkeep"), BTreeMap::from([(kept, -1)]))
        .await?;
    let pass = client.gc(&sp, None).await?;
    assert_eq!(pass.deleted, 1);
    assert_eq!(
        client
            .read_metadata(&sp, &shared)
            .await?
            .state
            .child_ref_count,
        0
    );
    let pass = client.gc(&sp, None).await?;
    assert_eq!(pass.deleted, 1);
    assert_eq!(
        client.read_node(&sp, &shared).await.unwrap_err().status(),
        Some(404)
    );
    let usage = client.usage(&sp).await?;
    assert_eq!(
        (usage.node_count, usage.ready_content_bytes),
        (1, b"leased for a minute".len() as i64)
    );
    env.check_invariants(&env.meta().await?, &app.app).await?;
    env.assert_consistent("hub")?;
    Ok(())
}

async fn gc_passes_are_bounded(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    for i in 0..25u32 {
        let (h, bytes) = leaf(&i.to_le_bytes());
        client.ensure_node(&sp, &h, &bytes, SHORT).await?;
    }
    expire().await;
    let pass = client.gc(&sp, Some(10)).await?;
    assert_eq!((pass.examined, pass.deleted), (10, 10));
    let pass = client.gc(&sp, Some(10)).await?;
    assert_eq!(pass.deleted, 10);
    let pass = client.gc(&sp, Some(10)).await?;
    assert_eq!(pass.deleted, 5);
    for bad in [0u32, 10_001] {
        let e = client.gc(&sp, Some(bad)).await.unwrap_err();
        assert_eq!(e.status(), Some(400));
    }
    env.assert_consistent("hub")?;
    Ok(())
}

/// A pass that marks a node and then fails leaves it not ready: not readable, not a target of
/// root refs or new parents; leasing it asks for a re-upload, which makes it ready again under
/// a new object; the superseded object is deleted by the next pass.
async fn marked_node_comes_back_by_reupload(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_GC_STALE_MARK_MS", 600_000);
    let app = env.create_app("hub")?;
    let (x, x_b) = leaf(b"marked then wanted again");
    {
        let server = env.start_with(&[("UNICAS_FAILPOINTS", "gc.after_mark=error")])?;
        let client = app.client(&server).with_retry(NO_RETRY);
        client.ensure_node(&space("s"), &x, &x_b, SHORT).await?;
        expire().await;
        let e = client.gc(&space("s"), None).await.unwrap_err();
        assert_eq!(e.status(), Some(503));
    }
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    assert_eq!(
        client.read_node(&sp, &x).await.unwrap_err().status(),
        Some(404)
    );
    assert_eq!(client.usage(&sp).await?.not_ready_node_count, 1);
    let e = client
        .update_root_refs(&sp, &rid("too-early"), BTreeMap::from([(x, 1)]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("NODE_NOT_READY"));
    let (parent, parent_b) = node("application/x-test", &[x], b"parent");
    let r = client.ensure_node(&sp, &parent, &parent_b, 60_000).await?;
    assert_eq!(r.state, Ensured::AwaitingChildren(vec![x]));
    // Re-upload.
    let r = client.ensure_node(&sp, &x, &x_b, 60_000).await?;
    assert!(matches!(r.state, Ensured::Ready { .. }));
    assert_eq!(r.uploaded_bytes, x_b.len() as u64);
    assert_eq!(
        &client.read_node(&sp, &x).await?[..],
        b"marked then wanted again"
    );
    let r = client.ensure_node(&sp, &parent, &parent_b, 60_000).await?;
    assert!(matches!(r.state, Ensured::Ready { .. }));
    client
        .update_root_refs(&sp, &rid("now"), BTreeMap::from([(x, 1)]))
        .await?;
    let usage = client.usage(&sp).await?;
    assert_eq!((usage.node_count, usage.not_ready_node_count), (2, 0));
    // The superseded object is queued for deletion (or, the failed pass having packed the
    // node first, its entry left its pack), and the next pass deletes it.
    let (ok, report) = env.fsck("hub", &[])?;
    assert!(ok, "{report:#}");
    let meta = env.meta().await?;
    let packs = meta.packs(&app.app, Some(&sp)).await?;
    assert!(
        report.to_string().contains("queued-deletion") || packs.iter().any(|p| p.live_nodes == 0),
        "{report:#} {packs:?}"
    );
    client.gc(&sp, None).await?;
    let (ok, report) = env.fsck("hub", &[])?;
    assert!(
        ok && !report.to_string().contains("queued-deletion"),
        "{report:#}"
    );
    let packs = meta.packs(&app.app, Some(&sp)).await?;
    assert!(packs.iter().all(|p| p.live_nodes > 0), "{packs:?}");
    // Both nodes, loose again, were packed together by that pass: one object.
    assert_eq!(report["objectsListed"], 1);
    env.check_invariants(&env.meta().await?, &app.app).await?;
    Ok(())
}

/// A pass that deleted objects but failed before deleting rows: the rows stay marked (not
/// ready) and a later pass finishes them once their mark is stale.
async fn failed_sweep_is_finished_later(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_GC_STALE_MARK_MS", 500);
    let app = env.create_app("hub")?;
    let (child, child_b) = leaf(b"child");
    let (parent, parent_b) = node("application/x-test", &[child, child], b"p");
    {
        let server = env.start_with(&[("UNICAS_FAILPOINTS", "gc.after_delete=error")])?;
        let client = app.client(&server).with_retry(NO_RETRY);
        client
            .ensure_node(&space("s"), &child, &child_b, SHORT)
            .await?;
        client
            .ensure_node(&space("s"), &parent, &parent_b, SHORT)
            .await?;
        expire().await;
        assert!(client.gc(&space("s"), None).await.is_err());
    }
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    let usage = client.usage(&sp).await?;
    assert_eq!((usage.node_count, usage.not_ready_node_count), (2, 1));
    assert_eq!(
        client.read_node(&sp, &parent).await.unwrap_err().status(),
        Some(404)
    );
    env.assert_consistent("hub")?;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let pass = client.gc(&sp, None).await?;
    assert_eq!(pass.deleted, 1, "{pass:?}");
    assert_eq!(
        client
            .read_metadata(&sp, &child)
            .await?
            .state
            .child_ref_count,
        0
    );
    let pass = client.gc(&sp, None).await?;
    assert_eq!(pass.deleted, 1);
    let usage = client.usage(&sp).await?;
    assert_eq!((usage.node_count, usage.not_ready_node_count), (0, 0));
    env.assert_consistent("hub")?;
    Ok(())
}

/// Upload generations that never complete are retired with their bytes and reservations.
async fn abandoned_uploads_are_retired(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    // Long enough that a loaded machine uploads within the URL's life.
    env.set("UNICAS_UPLOAD_URL_TTL_MS", 2_000)
        .set("UNICAS_UPLOAD_TTL_MS", 2_500);
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    // One uploaded but never leased again, one never uploaded, one whose parent waits forever.
    let (a, a_b) = leaf(b"uploaded, abandoned");
    let LeaseResponse::AwaitingUpload { upload, .. } = client
        .lease_node(&sp, &a, SHORT, Some(a_b.len() as u64))
        .await?
    else {
        panic!()
    };
    client.upload(&upload, a_b.clone()).await?;
    let (bh, _) = leaf(b"never uploaded");
    client.lease_node(&sp, &bh, SHORT, None).await?;
    let (missing, _) = leaf(b"missing child");
    let (p, p_b) = node("application/x-test", &[missing], b"waits");
    assert!(matches!(
        client.ensure_node(&sp, &p, &p_b, SHORT).await?.state,
        Ensured::AwaitingChildren(_)
    ));
    assert!(client.usage(&sp).await?.reserved_bytes > 0);
    tokio::time::sleep(Duration::from_millis(2_700)).await;
    client.gc(&sp, None).await?;
    let usage = client.usage(&sp).await?;
    assert_eq!((usage.node_count, usage.reserved_bytes), (0, 0));
    let (ok, report) = env.fsck("hub", &[])?;
    assert!(ok, "{report:#}");
    assert_eq!(
        report["objectsListed"], 0,
        "no temporary bytes left: {report:#}"
    );
    // The node can still be stored afresh.
    assert!(matches!(
        client.ensure_node(&sp, &a, &a_b, SHORT).await?.state,
        Ensured::Ready { .. }
    ));
    Ok(())
}

/// Too many uploads in flight in one Space: 429 CAS_UPLOAD_LIMIT, and nothing is created.
async fn upload_limit(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_MAX_ACTIVE_UPLOADS", 3);
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server).with_retry(NO_RETRY);
    let sp = space("s");
    for i in 0..3u8 {
        client.lease_node(&sp, &leaf(&[i]).0, SHORT, None).await?;
    }
    let before = client.usage(&sp).await?;
    let e = client
        .lease_node(&sp, &leaf(b"one too many").0, SHORT, None)
        .await
        .unwrap_err();
    assert_eq!(
        (e.status(), e.code()),
        (Some(429), Some("CAS_UPLOAD_LIMIT"))
    );
    assert!(matches!(
        e,
        cas_client::ClientError::Api {
            retry_after: Some(_),
            ..
        }
    ));
    assert_eq!(
        client.usage(&sp).await?,
        before,
        "no generation was created"
    );
    // Another Space has its own budget.
    client
        .lease_node(&space("t"), &leaf(b"other space").0, SHORT, None)
        .await?;
    // A batch gives out the same slots, element by element: without bytes, five new nodes
    // get three uploads and two refusals; inline, three are stored and two refused.
    let code = |r: &BatchLeaseResult| match r {
        BatchLeaseResult::Lease(l) => l.state().to_string(),
        BatchLeaseResult::Error(e) => e.error.clone(),
    };
    let element = |i: u8, content: Option<String>| BatchLeaseElement {
        hash: leaf(&[b'b', i]).0,
        lease_duration_ms: SHORT,
        upload_bytes: None,
        content,
        content_bytes: None,
        delta_base: None,
    };
    let sorted_codes = |results: &[BatchLeaseResult]| {
        let mut codes: Vec<String> = results.iter().map(code).collect();
        codes.sort();
        codes
    };
    let plain = client
        .lease_batch(&space("u"), (0..5).map(|i| element(i, None)).collect())
        .await?;
    assert_eq!(
        sorted_codes(&plain),
        [
            "CAS_UPLOAD_LIMIT",
            "CAS_UPLOAD_LIMIT",
            "awaiting_upload",
            "awaiting_upload",
            "awaiting_upload"
        ]
    );
    let b64 = |i: u8| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(leaf(&[b'b', i]).1)
    };
    let inline = client
        .lease_batch(
            &space("v"),
            (0..5).map(|i| element(i, Some(b64(i)))).collect(),
        )
        .await?;
    assert_eq!(
        sorted_codes(&inline),
        [
            "CAS_UPLOAD_LIMIT",
            "CAS_UPLOAD_LIMIT",
            "ready",
            "ready",
            "ready"
        ]
    );
    assert_eq!(client.usage(&space("v")).await?.node_count, 3);
    Ok(())
}

/// App `hub` of `env` with one node of `content` in Space `s`, leased for a second and held
/// by two root refs; the server (to be kept running), its client, the Space and the node.
async fn a_node_held_by_root_refs(
    env: &TestEnv,
    content: &[u8],
) -> anyhow::Result<(Server, AppCasClient, SpaceId, Hash)> {
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    let (h, bytes) = leaf(content);
    client.ensure_node(&sp, &h, &bytes, 1000).await?;
    client
        .update_root_refs(&sp, &rid("keep"), BTreeMap::from([(h, 2)]))
        .await?;
    Ok((server, client, sp, h))
}

/// fsck of App `hub` fails, and its report says `needle`.
fn assert_fsck_reports(env: &TestEnv, needle: &str) -> anyhow::Result<()> {
    let (ok, report) = env.fsck("hub", &[])?;
    assert!(!ok && report.to_string().contains(needle), "{report:#}");
    Ok(())
}

/// Garbage collection finds its candidates by the nodes' `rooted` flag, kept beside the root
/// ref count: a flag that disagrees with the count is reported by fsck, and a node whose count
/// is above zero is not collected even when its flag says otherwise.
async fn a_wrong_rooted_flag_is_reported_and_not_trusted(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let (_server, client, sp, h) =
        a_node_held_by_root_refs(&env, b"held by a root ref only").await?;
    let (ok, report) = env.fsck("hub", &[])?;
    assert!(ok, "{report:#}");
    sqlx::query("UPDATE nodes SET rooted = 0 WHERE app_id = 'hub' AND hash = $1")
        .bind(h.as_bytes().to_vec())
        .execute(&env.database().await?)
        .await?;
    assert_fsck_reports(&env, "root ref count 2 but rooted flag 0")?;
    // The lease has lapsed: only the count holds the node.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    client.gc(&sp, None).await?;
    assert_eq!(
        &client.read_node(&sp, &h).await?[..],
        b"held by a root ref only"
    );
    Ok(())
}

/// A node's root ref count is the sum of its balances: fsck reports a sum below zero, and a
/// sum held by a node that has no row.
async fn root_ref_counts_below_zero_or_without_a_node_are_reported(
    b: Backend,
) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let (_server, _client, _sp, h) =
        a_node_held_by_root_refs(&env, b"counted from its balances").await?;
    let db = env.database().await?;
    sqlx::query(
        "INSERT INTO root_ref_balances (app_id, space_id, ref_domain, hash, ref_count) \
         VALUES ('hub', 's', 'other', $1, -3)",
    )
    .bind(h.as_bytes().to_vec())
    .execute(&db)
    .await?;
    assert_fsck_reports(&env, "the domains' balances sum to -1, below zero")?;
    sqlx::query("DELETE FROM root_ref_balances WHERE ref_domain = 'other'")
        .execute(&db)
        .await?;
    sqlx::query("DELETE FROM nodes WHERE app_id = 'hub' AND hash = $1")
        .bind(h.as_bytes().to_vec())
        .execute(&db)
        .await?;
    assert_fsck_reports(&env, "root ref count 2 but no node row")?;
    Ok(())
}

e2e!(
    root_ref_counts_below_zero_or_without_a_node_are_reported,
    a_wrong_rooted_flag_is_reported_and_not_trusted,
    gc_frees_only_what_nothing_holds,
    gc_passes_are_bounded,
    marked_node_comes_back_by_reupload,
    failed_sweep_is_finished_later,
    abandoned_uploads_are_retired,
    upload_limit,
);
