//! Small nodes held in the database until they are packed: publishing one (uploaded or inline,
//! alone or as a delta) writes no object, reads find its bytes in its row (whole, by range,
//! after a restart), a GC pass packs it and clears the row, and collecting it leaves nothing.

use std::collections::BTreeMap;

use cas_format::wire::LeaseResponse;
use cas_format::{Hash, RequestId, SpaceId};
use cas_service::meta::MetaStore;
use tests::content::*;
use tests::*;

fn rid(s: &str) -> RequestId {
    s.parse().expect("request id")
}

async fn held(meta: &MetaStore, app: &TestApp, sp: &SpaceId, h: &Hash) -> anyhow::Result<bool> {
    let row = meta.node(&app.app, sp, h).await?;
    let row = row.ok_or_else(|| anyhow::anyhow!("no row for {h}"))?;
    anyhow::ensure!(row.pack.is_none() || !row.held, "{h} is packed and held");
    Ok(row.held)
}

/// Stores small nodes through a single lease and upload, through the batch route (inline) and
/// as a delta, and one large node; answers the small ones with their content, and the large.
async fn small_and_large(
    client: &cas_client::AppCasClient,
    sp: &SpaceId,
) -> anyhow::Result<(Vec<(Hash, Vec<u8>)>, Hash)> {
    let mut nodes = Vec::new();
    let one = text(1, 5_000);
    let (h, portable) = leaf(&one);
    let size = Some(portable.len() as u64);
    match client.lease_node(sp, &h, LEASE, size).await? {
        LeaseResponse::AwaitingUpload { upload, .. } => client.upload(&upload, portable).await?,
        other => anyhow::bail!("a new node needs an upload: {other:?}"),
    }
    match client.lease_node(sp, &h, LEASE, size).await? {
        LeaseResponse::Ready { .. } => {}
        other => anyhow::bail!("an uploaded node is ready: {other:?}"),
    }
    nodes.push((h, one.clone()));
    let two = edited(&one, "two");
    nodes.push((store(client, sp, leaf(&two).1, Some(h)).await?, two));
    for i in 0..6u64 {
        let c = text(10 + i, 300 + 500 * i as usize);
        nodes.push((store(client, sp, leaf(&c).1, None).await?, c));
    }
    // Bytes that do not compress: held, and too large to be kept in the row itself.
    let noise = noise(7, 6_000);
    nodes.push((store(client, sp, leaf(&noise).1, None).await?, noise));
    let large = text(99, 150_000);
    let hl = store(client, sp, leaf(&large).1, None).await?;
    let refs: BTreeMap<Hash, i64> = nodes
        .iter()
        .map(|(h, _)| (*h, 1))
        .chain([(hl, 1)])
        .collect();
    client.update_root_refs(sp, &rid("hold"), refs).await?;
    Ok((nodes, hl))
}

async fn read_back(
    client: &cas_client::AppCasClient,
    sp: &SpaceId,
    nodes: &[(Hash, Vec<u8>)],
) -> anyhow::Result<()> {
    read_all(client, sp, nodes).await?;
    for (h, c) in nodes {
        let part = client.read_content(sp, h, Some(100..250)).await?;
        anyhow::ensure!(part[..] == c[100..250], "{h} by range");
    }
    Ok(())
}

/// GC passes that do not pack (nothing is due for an hour).
fn pack_later(env: &mut TestEnv) {
    env.set("UNICAS_PACK_MIN_NODES", 1_000);
    env.set("UNICAS_PACK_DELAY_MS", 3_600_000);
}

/// Stops the server, then checks the invariants and fsck.
async fn stop_and_check(
    env: &TestEnv,
    meta: &MetaStore,
    app: &TestApp,
    server: Server,
) -> anyhow::Result<()> {
    env.check_invariants(meta, &app.app).await?;
    drop(server);
    let (ok, report) = env.fsck("hub", &[])?;
    anyhow::ensure!(ok, "{report}");
    Ok(())
}

/// Held until packed: no object is written for a small node (the large one has its own), the
/// usage counts the held bytes, reads find them before and after a restart, a GC pass that
/// packs moves them into a pack and clears the rows, fsck agrees at each step, and nodes
/// collected leave the Space's store empty. With `hold_max_bytes` 0 every node is an object.
async fn small_nodes_are_held_until_packed(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    pack_later(&mut env);
    let app = env.create_app("hub")?;
    let meta = env.meta().await?;
    let sp = space("s");
    let server = env.start()?;
    let client = app.client(&server);
    let (nodes, hl) = small_and_large(&client, &sp).await?;
    for (h, _) in &nodes {
        assert!(held(&meta, &app, &sp, h).await?, "{h} is held");
    }
    // Held bytes both in rows (up to 2 KiB) and kept apart (above): both are read back below.
    let mut sizes = Vec::new();
    for (h, _) in &nodes {
        sizes.push(
            meta.node(&app.app, &sp, h)
                .await?
                .expect("row")
                .stored_bytes,
        );
    }
    assert!(
        sizes.iter().any(|s| *s <= 2048) && sizes.iter().any(|s| *s > 2048),
        "held nodes on both sides of 2 KiB: {sizes:?}"
    );
    let delta = meta.node(&app.app, &sp, &nodes[1].0).await?.expect("row");
    assert!(delta.delta.is_some(), "the edit is held as a delta");
    assert!(
        !held(&meta, &app, &sp, &hl).await?,
        "the large node is an object"
    );
    let objects = env.node_objects(&app, &sp).await?;
    assert_eq!(
        objects.len(),
        1,
        "only the large node's object: {objects:?}"
    );
    read_back(&client, &sp, &nodes).await?;
    client.gc(&sp, None).await?;
    assert!(held(&meta, &app, &sp, &nodes[0].0).await?, "not packed yet");
    stop_and_check(&env, &meta, &app, server).await?;

    // Restarted with packing due: one pass packs every held node.
    env.set("UNICAS_PACK_MIN_NODES", 1);
    env.set("UNICAS_PACK_DELAY_MS", 0);
    let server = env.start()?;
    let client = app.client(&server);
    read_back(&client, &sp, &nodes).await?;
    client.gc(&sp, None).await?;
    for (h, _) in &nodes {
        let row = meta.node(&app.app, &sp, h).await?.expect("row");
        assert!(!row.held && row.pack.is_some(), "{h} is packed: {row:?}");
    }
    read_back(&client, &sp, &nodes).await?;
    let packs = meta.packs(&app.app, Some(&sp)).await?;
    let usage = client.usage(&sp).await?;
    let large = meta.node(&app.app, &sp, &hl).await?.expect("row");
    assert_eq!(
        usage.ready_stored_bytes as i64,
        packs.iter().map(|p| p.object_bytes).sum::<i64>() + large.stored_bytes
    );
    env.check_invariants(&meta, &app.app).await?;

    // Collected: nothing of the Space stays.
    client
        .update_root_refs(
            &sp,
            &rid("release"),
            nodes
                .iter()
                .map(|(h, _)| (*h, -1))
                .chain([(hl, -1)])
                .collect(),
        )
        .await?;
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    for _ in 0..3 {
        client.gc(&sp, None).await?;
    }
    assert_eq!(client.usage(&sp).await?.ready_stored_bytes, 0);
    assert!(env.node_objects(&app, &sp).await?.is_empty());
    stop_and_check(&env, &meta, &app, server).await?;

    // Holding off: small nodes are objects until packed.
    env.set("UNICAS_HOLD_MAX_BYTES", 0);
    pack_later(&mut env);
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("t");
    let (nodes, _) = small_and_large(&client, &sp).await?;
    for (h, _) in &nodes {
        assert!(!held(&meta, &app, &sp, h).await?, "{h} is an object");
    }
    assert_eq!(env.node_objects(&app, &sp).await?.len(), nodes.len() + 1);
    read_back(&client, &sp, &nodes).await?;
    Ok(())
}

/// Killed where an object would have been written before the row: a held node wrote nothing,
/// so nothing is left (no row, no object, no fsck finding), and the lease repeated after a
/// restart publishes it from the upload that survived.
async fn killed_before_a_held_row_leaves_nothing(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let sp = space("s");
    let (h, bytes) = leaf(b"held, in flight");
    env.crash_at("publish.after_object", |server| {
        let client = app.client(&server);
        let (sp, bytes) = (sp.clone(), bytes.clone());
        async move {
            tokio::spawn(async move { client.ensure_node(&sp, &h, &bytes, LEASE).await });
            server
        }
    })
    .await?;
    let meta = env.meta().await?;
    assert!(meta.node(&app.app, &sp, &h).await?.is_none(), "no row");
    assert!(env.node_objects(&app, &sp).await?.is_empty(), "no object");
    let (ok, report) = env.fsck("hub", &[])?;
    assert!(
        ok && report["findings"].as_array().is_some_and(|f| f.is_empty()),
        "{report:#}"
    );

    let server = env.start()?;
    let client = app.client(&server);
    let r = client.ensure_node(&sp, &h, &bytes, LEASE).await?;
    assert!(matches!(r.state, cas_client::Ensured::Ready { .. }));
    assert_eq!(r.uploaded_bytes, 0, "the upload survived the crash");
    assert!(held(&meta, &app, &sp, &h).await?);
    assert_eq!(&client.read_node(&sp, &h).await?[..], b"held, in flight");
    stop_and_check(&env, &meta, &app, server).await
}

e2e!(
    small_nodes_are_held_until_packed,
    killed_before_a_held_row_leaves_nothing
);
