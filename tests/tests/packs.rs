//! Packs at rest: GC passes pack small nodes into pack objects, reads find them there (whole and
//! by range), collected entries are rewritten away, a pack's damage is an error and an `fsck`
//! finding, and a packer killed at any step leaves nothing fsck or the invariants object to.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use cas_format::{Hash, RequestId, SpaceId};
use cas_service::blob::{ListedObject, node_key, pack_key};
use cas_service::meta::{MetaStore, NodeRow, PackState};
use tests::content::*;
use tests::*;

fn rid(s: &str) -> RequestId {
    s.parse().expect("request id")
}

async fn row(meta: &MetaStore, app: &TestApp, sp: &SpaceId, h: Hash) -> anyhow::Result<NodeRow> {
    meta.node(&app.app, sp, &h)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no row for {h}"))
}

/// The objects under a Space's pack prefix.
async fn pack_objects(
    env: &TestEnv,
    app: &TestApp,
    sp: &SpaceId,
) -> anyhow::Result<Vec<ListedObject>> {
    Ok(env.blobs().await?.list(&pack_key(&app.app, sp, "")).await?)
}

/// Stores `n` versions of a cell (each a delta against the one before) and `others` unrelated
/// small nodes; holds a root ref on each. Answers every node with its content.
async fn versions_and_others(
    client: &cas_client::AppCasClient,
    sp: &SpaceId,
    seed: u64,
    n: usize,
    others: usize,
) -> anyhow::Result<Vec<(Hash, Vec<u8>)>> {
    let mut nodes = Vec::new();
    let mut content = text(seed, 3_000);
    let mut base = None;
    for i in 0..n {
        content = edited(&content, &format!("version {i}"));
        let h = store(client, sp, leaf(&content).1, base).await?;
        base = Some(h);
        nodes.push((h, content.clone()));
    }
    for i in 0..others {
        let c = text(seed * 1_000 + i as u64, 200 + 37 * i);
        nodes.push((store(client, sp, leaf(&c).1, None).await?, c));
    }
    let refs: BTreeMap<Hash, i64> = nodes.iter().map(|(h, _)| (*h, 1)).collect();
    client
        .update_root_refs(sp, &rid(&format!("hold-{seed}")), refs)
        .await?;
    Ok(nodes)
}

/// Small nodes are packed by a GC pass (a large one stays an object of its own), read back
/// whole and by range, the objects they leave are deleted, the store's stored bytes are the
/// packs' and the large object's, and collected entries are rewritten away once they are half
/// of their pack.
async fn small_nodes_are_packed_and_read_back(b: Backend) -> anyhow::Result<()> {
    let (env, app, _server, client, meta) = hub_app(b).await?;
    let sp = space("s");
    let nodes = versions_and_others(&client, &sp, 1, 12, 30).await?;
    let large = text(99, 200_000);
    let hl = store(&client, &sp, leaf(&large).1, None).await?;
    client
        .update_root_refs(&sp, &rid("large"), [(hl, 1)].into())
        .await?;
    let loose_before: Vec<NodeRow> = {
        let mut v = Vec::new();
        for (h, _) in &nodes {
            v.push(row(&meta, &app, &sp, *h).await?);
        }
        v
    };
    let before = client.usage(&sp).await?.ready_stored_bytes;

    client.gc(&sp, None).await?;
    let packs = meta.packs(&app.app, Some(&sp)).await?;
    assert_eq!(packs.len(), 1, "{packs:?}");
    let pack = &packs[0];
    assert_eq!(pack.state, PackState::Live);
    assert_eq!(pack.live_nodes, nodes.len() as i64);
    let mut blocks = std::collections::BTreeSet::new();
    for (h, _) in &nodes {
        let r = row(&meta, &app, &sp, *h).await?;
        let span = r.pack.expect("a small node is packed");
        assert_eq!(r.object_gen, pack.pack_id);
        blocks.insert(span.block_offset);
    }
    assert!(blocks.len() > 1, "16 KiB blocks: the pack has several");
    assert!(
        row(&meta, &app, &sp, hl).await?.pack.is_none(),
        "a large node stays alone"
    );
    read_all(&client, &sp, &nodes).await?;
    let (h, c) = &nodes[5];
    assert_eq!(
        &client.read_content(&sp, h, Some(100..900)).await?[..],
        &c[100..900]
    );
    // The objects the packed nodes had are deleted (by the same pass), and what the Space
    // stores is the pack and the large object.
    let blobs = env.blobs().await?;
    for r in &loose_before {
        let key = node_key(&app.app, &sp, &r.hash, &r.object_gen);
        assert!(blobs.get(&key, None).await?.is_none(), "{key} stays");
    }
    let large_row = row(&meta, &app, &sp, hl).await?;
    let usage = client.usage(&sp).await?;
    assert_eq!(
        usage.ready_stored_bytes as i64,
        pack.object_bytes + large_row.stored_bytes
    );
    assert!(
        usage.ready_stored_bytes < before,
        "{} vs {before}",
        usage.ready_stored_bytes
    );
    env.check_invariants(&meta, &app.app).await?;

    // Another pass has nothing to pack: the pack stays.
    client.gc(&sp, None).await?;
    assert_eq!(meta.packs(&app.app, Some(&sp)).await?, packs);

    // Two thirds of the small nodes go: their entries die, and the pack is rewritten.
    let (gone, kept) = nodes.split_at(nodes.len() * 2 / 3);
    let release: BTreeMap<Hash, i64> = gone.iter().map(|(h, _)| (*h, -1)).collect();
    client
        .update_root_refs(&sp, &rid("release"), release)
        .await?;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    client.gc(&sp, None).await?;
    client.gc(&sp, None).await?;
    let after = meta.packs(&app.app, Some(&sp)).await?;
    assert_eq!(after.len(), 1, "{after:?}");
    assert_ne!(after[0].pack_id, pack.pack_id, "rewritten");
    assert_eq!(after[0].live_nodes, kept.len() as i64);
    assert!(after[0].object_bytes < pack.object_bytes);
    assert_eq!(
        pack_objects(&env, &app, &sp).await?.len(),
        1,
        "the old pack's object is deleted"
    );
    read_all(&client, &sp, kept).await?;
    for (h, _) in gone {
        assert!(meta.node(&app.app, &sp, h).await?.is_none());
    }
    env.check_invariants(&meta, &app.app).await?;
    env.assert_consistent("hub")?;
    Ok(())
}

/// Readers never see an error or other bytes while every GC pass rewrites the pack they read
/// from (each round collects one more of its entries, and any dead entry makes it worth
/// rewriting here).
async fn repack_during_concurrent_reads(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_REPACK_DEAD_PERCENT", 1);
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let meta = env.meta().await?;
    let sp = space("s");
    let all = versions_and_others(&client, &sp, 7, 6, 10).await?;
    let (released, kept) = all.split_at(8);
    let kept = Arc::new(kept.to_vec());
    client.gc(&sp, None).await?;
    tokio::time::sleep(Duration::from_millis(1_100)).await;

    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for r in 0..3 {
        let (client, sp, kept, stop, reads) = (
            app.client(&server),
            sp.clone(),
            kept.clone(),
            stop.clone(),
            reads.clone(),
        );
        readers.push(tokio::spawn(async move {
            let mut i = r;
            while !stop.load(Ordering::Relaxed) {
                let (h, c) = &kept[i % kept.len()];
                let got = client.read_node(&sp, h).await?;
                anyhow::ensure!(got[..] == c[..], "{h} read back other bytes");
                reads.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            anyhow::Ok(())
        }));
    }
    let mut pack_ids = std::collections::BTreeSet::new();
    for (round, (h, _)) in released.iter().enumerate() {
        client
            .update_root_refs(&sp, &rid(&format!("release-{round}")), [(*h, -1)].into())
            .await?;
        // Rewrites the pack (dead since the last round), then collects this entry.
        client.gc(&sp, None).await?;
        for p in meta.packs(&app.app, Some(&sp)).await? {
            pack_ids.insert(p.pack_id);
        }
    }
    client.gc(&sp, None).await?;
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.await??;
    }
    assert!(
        pack_ids.len() >= 6,
        "the pack was rewritten {} times",
        pack_ids.len()
    );
    assert!(reads.load(Ordering::Relaxed) > 50, "the readers read");
    let packs = meta.packs(&app.app, Some(&sp)).await?;
    assert_eq!(packs.len(), 1, "{packs:?}");
    assert_eq!(packs[0].live_nodes, kept.len() as i64);
    assert_eq!(pack_objects(&env, &app, &sp).await?.len(), 1);
    read_all(&client, &sp, &kept).await?;
    env.check_invariants(&meta, &app.app).await?;
    env.assert_consistent("hub")?;
    Ok(())
}

/// A delta packed as a frame (its base in an older pack) outlives its base: GC stores it alone
/// before the base's entry dies, and it is packed again on its own content.
async fn a_packed_base_collected_while_its_dependent_lives(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    // No merging: the dependent goes into a pack of its own, as a delta against the base.
    env.set("UNICAS_PACK_MERGE_BYTES", 0);
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let meta = env.meta().await?;
    let sp = space("s");
    let v1 = text(5, 8_000);
    let v2 = edited(&v1, "two");
    let h1 = store(&client, &sp, leaf(&v1).1, None).await?;
    client
        .update_root_refs(&sp, &rid("v1"), [(h1, 1)].into())
        .await?;
    client.gc(&sp, None).await?;
    assert!(row(&meta, &app, &sp, h1).await?.pack.is_some());
    let h2 = store(&client, &sp, leaf(&v2).1, Some(h1)).await?;
    client
        .update_root_refs(&sp, &rid("v2"), [(h2, 1)].into())
        .await?;
    client.gc(&sp, None).await?;
    let r2 = row(&meta, &app, &sp, h2).await?;
    assert!(r2.pack.is_some(), "packed");
    assert_eq!(
        r2.delta.map(|d| d.hash),
        Some(h1),
        "as a delta against the packed base"
    );
    assert_ne!(r2.object_gen, row(&meta, &app, &sp, h1).await?.object_gen);

    client
        .update_root_refs(&sp, &rid("drop-v1"), [(h1, -1)].into())
        .await?;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    for _ in 0..3 {
        client.gc(&sp, None).await?;
    }
    assert!(
        meta.node(&app.app, &sp, &h1).await?.is_none(),
        "the base is collected"
    );
    let r2 = row(&meta, &app, &sp, h2).await?;
    assert_eq!(r2.delta, None, "stored alone");
    assert!(r2.pack.is_some(), "and packed again");
    assert_eq!(&client.read_node(&sp, &h2).await?[..], &v2[..]);
    assert_eq!(meta.packs(&app.app, Some(&sp)).await?.len(), 1);
    assert_eq!(pack_objects(&env, &app, &sp).await?.len(), 1);
    env.check_invariants(&meta, &app.app).await?;
    env.assert_consistent("hub")?;
    Ok(())
}

/// A server killed (SIGKILL) at each step of packing and of repacking: the invariants hold at
/// once, every node reads back after a restart, the next passes delete what the packer left,
/// and fsck finds the store consistent with no pack object without a row.
async fn killed_at_every_step_of_packing(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_GC_STALE_MARK_MS", 300);
    let app = env.create_app("hub")?;
    let meta = env.meta().await?;
    let steps = ["pack.after_begin", "pack.after_object", "pack.after_commit"];
    for (i, failpoint) in steps.into_iter().enumerate() {
        for repack in [false, true] {
            let sp = space(&format!("s{i}-{repack}"));
            let seed = 10 * i as u64 + repack as u64;
            let nodes = {
                let server = env.start()?;
                let client = app.client(&server);
                let nodes = versions_and_others(&client, &sp, seed, 5, 8).await?;
                if repack {
                    // A pack, two thirds of which are then collected.
                    client.gc(&sp, None).await?;
                    let gone: BTreeMap<Hash, i64> =
                        nodes[..9].iter().map(|(h, _)| (*h, -1)).collect();
                    client.update_root_refs(&sp, &rid("release"), gone).await?;
                    tokio::time::sleep(Duration::from_millis(1_100)).await;
                    // This pass collects them; the next one rewrites the pack.
                    client.gc(&sp, None).await?;
                    nodes[9..].to_vec()
                } else {
                    nodes
                }
            };
            env.kill_during_gc(&app, &sp, failpoint).await?;
            env.check_invariants(&meta, &app.app).await?;

            let server = env.start()?;
            let client = app.client(&server);
            read_all(&client, &sp, &nodes).await?;
            tokio::time::sleep(Duration::from_millis(400)).await;
            for _ in 0..3 {
                client.gc(&sp, None).await?;
            }
            read_all(&client, &sp, &nodes).await?;
            let packs = meta.packs(&app.app, Some(&sp)).await?;
            assert!(
                packs
                    .iter()
                    .all(|p| p.state == PackState::Live && p.live_nodes > 0),
                "{failpoint}, repack {repack}: {packs:?}"
            );
            let objects = pack_objects(&env, &app, &sp).await?;
            assert_eq!(
                objects.len(),
                packs.len(),
                "{failpoint}, repack {repack}: pack objects {objects:?}, rows {packs:?}"
            );
            for (h, _) in &nodes {
                assert!(
                    row(&meta, &app, &sp, *h).await?.pack.is_some(),
                    "{failpoint}: packed"
                );
            }
            env.check_invariants(&meta, &app.app).await?;
        }
    }
    env.assert_consistent("hub")?;
    Ok(())
}

/// A damaged pack block or index row is an error on read (never other bytes), and fsck finds
/// the damaged entry.
async fn a_damaged_pack_is_an_error(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let meta = env.meta().await?;
    let sp = space("s");
    let nodes = {
        let server = env.start()?;
        let client = app.client(&server);
        let nodes = versions_and_others(&client, &sp, 3, 4, 40).await?;
        client.gc(&sp, None).await?;
        nodes
    };
    let packs = meta.packs(&app.app, Some(&sp)).await?;
    assert_eq!(packs.len(), 1);
    let pack = &packs[0];
    // The last block's frame, one byte flipped in its middle.
    let mut last: Option<NodeRow> = None;
    for (h, _) in &nodes {
        let r = row(&meta, &app, &sp, *h).await?;
        if last
            .as_ref()
            .is_none_or(|l| l.pack.unwrap().block_offset < r.pack.unwrap().block_offset)
        {
            last = Some(r);
        }
    }
    let damaged = last.expect("a packed node");
    let span = damaged.pack.unwrap();
    let blobs = env.blobs().await?;
    let key = pack_key(&app.app, &sp, &pack.pack_id);
    let (reader, _) = blobs.get(&key, None).await?.expect("the pack");
    let mut object = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(
        &mut tokio::io::AsyncReadExt::take(reader, 1 << 24),
        &mut object,
    )
    .await?;
    object[(span.block_offset + span.block_bytes / 2) as usize] ^= 0x20;
    env.replace_object(&key, object).await?;

    let server = env.start()?;
    let client = app.client(&server);
    let err = client.read_node(&sp, &damaged.hash).await.unwrap_err();
    assert_eq!(err.status(), Some(500), "{err}");
    assert!(
        client
            .read_content(&sp, &damaged.hash, Some(0..10))
            .await
            .is_err()
    );
    // Nodes in other blocks still read.
    let (first, content) = &nodes[0];
    if row(&meta, &app, &sp, *first)
        .await?
        .pack
        .unwrap()
        .block_offset
        != span.block_offset
    {
        assert_eq!(&client.read_node(&sp, first).await?[..], &content[..]);
    }
    // An index row pointing elsewhere in its block: an error, not a neighbour's bytes.
    let (other, _) = nodes
        .iter()
        .find(|(h, _)| *h != damaged.hash)
        .expect("another node");
    let other_row = row(&meta, &app, &sp, *other).await?;
    let db = env.database().await?;
    sqlx::query("UPDATE nodes SET pack_entry_offset = pack_entry_offset + 1 WHERE app_id = 'hub' AND space_id = 's' AND hash = $1")
        .bind(other.as_bytes().to_vec())
        .execute(&db)
        .await?;
    drop(server);
    let server = env.start()?;
    let client = app.client(&server);
    let err = client.read_node(&sp, other).await.unwrap_err();
    assert_eq!(err.status(), Some(500), "{err}");
    drop(server);

    let (ok, report) = env.fsck("hub", &[])?;
    assert!(!ok, "{report}");
    let text = report.to_string();
    assert!(text.contains(&damaged.hash.to_string()), "{report}");
    assert!(text.contains(&other_row.hash.to_string()), "{report}");
    Ok(())
}

/// A notebook cell with an image inline (base64 in its JSON) is packed as the image's bytes
/// and its text (`base64-runs`), costs less than the same cell packed as text would, reads
/// back whole and by range, before and after the pack is rewritten, and fsck agrees.
async fn images_in_text_are_packed_as_their_bytes(b: Backend) -> anyhow::Result<()> {
    use base64::Engine;
    let (env, app, server, client, meta) = hub_app(b).await?;
    let sp = space("s");
    // An image's bytes are already compressed: a PNG's look random.
    let png: Vec<u8> = text(7, 30_000)
        .iter()
        .map(|b| b.wrapping_mul(167) ^ 0x5a)
        .collect();
    let png = zstd::bulk::compress(&png, 19)?;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&png);
    let cell = format!(
        "  {{\n   \"cell_type\": \"code\",\n   \"outputs\": [{{\"data\": {{\"image/png\": \"{b64}\\n\"}}}}],\n   \"source\": [\"plt.plot(x)\"]\n  }}\n"
    )
    .into_bytes();
    let nodes = vec![(
        store(&client, &sp, leaf(&cell).1, None).await?,
        cell.clone(),
    )];
    client
        .update_root_refs(&sp, &rid("cell"), [(nodes[0].0, 1)].into())
        .await?;
    client.gc(&sp, None).await?;
    let r = row(&meta, &app, &sp, nodes[0].0).await?;
    assert!(r.pack.is_some(), "packed");
    assert_eq!(r.encoding, cas_service::blob::Encoding::Base64Runs);
    read_all(&client, &sp, &nodes).await?;
    let part = client
        .read_content(&sp, &nodes[0].0, Some(40..5_000))
        .await?;
    assert_eq!(&part[..], &cell[40..5_000]);
    // What the pack holds is about the image's bytes, not their text (a third more).
    let stored = client.usage(&sp).await?.ready_stored_bytes as usize;
    assert!(
        stored < png.len() + 500,
        "{stored} bytes stored for an image of {}",
        png.len()
    );
    // Rewritten with a newer node: the entry is made again from its content.
    let more = store(&client, &sp, leaf(b"x = 1").1, None).await?;
    client
        .update_root_refs(&sp, &rid("more"), [(more, 1)].into())
        .await?;
    client.gc(&sp, None).await?;
    read_all(&client, &sp, &nodes).await?;
    env.check_invariants(&meta, &app.app).await?;
    drop(server);
    let (ok, report) = env.fsck("hub", &[])?;
    assert!(ok, "{report}");
    Ok(())
}

e2e!(
    images_in_text_are_packed_as_their_bytes,
    small_nodes_are_packed_and_read_back,
    repack_during_concurrent_reads,
    a_packed_base_collected_while_its_dependent_lives,
    killed_at_every_step_of_packing,
    a_damaged_pack_is_an_error,
);
