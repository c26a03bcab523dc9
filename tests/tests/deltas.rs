//! Deltas at rest: a node whose lease names a `deltaBase` is stored as a delta against it when
//! that pays, read back byte for byte (whole and by range), stored alone by GC before its base
//! goes, and never read as other bytes when a base is damaged.

use anyhow::Context;
use cas_format::Hash;
use cas_service::blob::{Encoding, node_key};
use serde_json::Value;
use tests::content::*;
use tests::hub::{HubClient, HubEnv, HubServer, data};
use tests::*;

/// A chain of versions stored as deltas (inline and uploaded), read whole and by range; GC
/// takes the bases while the newest is held and stores it alone first; a base that is gone is
/// not used; fsck (which rebuilds every delta) finds it all consistent.
async fn deltas_are_read_back_and_outlive_their_bases(b: Backend) -> anyhow::Result<()> {
    let (env, app, server, client, meta) = hub_app(b).await?;
    let sp = space("s");
    let row = |h: Hash| row_of(&meta, &app.app, &sp, h);

    // Small versions travel inline in batch leases; large ones are uploaded.
    for size in [20_000usize, 600_000] {
        let v1 = text(size as u64, size);
        let v2 = edited(&v1, "two");
        let v3 = edited(&v2, "three");
        let h1 = store(&client, &sp, leaf(&v1).1, None).await?;
        let h2 = store(&client, &sp, leaf(&v2).1, Some(h1)).await?;
        let h3 = store(&client, &sp, leaf(&v3).1, Some(h2)).await?;
        let (r1, r2, r3) = (row(h1).await?, row(h2).await?, row(h3).await?);
        assert_eq!(
            r1.encoding,
            Encoding::Zstd,
            "{size}: the base alone, compressed"
        );
        assert_eq!(r2.encoding, Encoding::ZstdDelta, "{size}");
        assert_eq!(r2.delta.map(|d| (d.hash, d.depth)), Some((h1, 1)));
        assert_eq!(r3.delta.map(|d| (d.hash, d.depth)), Some((h2, 2)));
        assert!(
            r3.stored_bytes * 20 < r1.stored_bytes,
            "{size}: a delta of a small edit is a small part of the base: {} vs {}",
            r3.stored_bytes,
            r1.stored_bytes
        );
        assert_eq!(&client.read_node(&sp, &h3).await?[..], &v3[..]);
        assert_eq!(&client.read_node(&sp, &h2).await?[..], &v2[..]);
        let (from, to) = (size as u64 / 3, size as u64 / 3 + 1000);
        let part = client.read_content(&sp, &h3, Some(from..to)).await?;
        assert_eq!(
            &part[..],
            &v3[from as usize..to as usize],
            "{size}: a range"
        );

        // Only the newest is kept; the two bases lapse and are collected.
        let keep: cas_format::RequestId = format!("keep-{size}").parse()?;
        client
            .update_root_refs(&sp, &keep, [(h3, 1)].into())
            .await?;
        tokio::time::sleep(std::time::Duration::from_millis(1_300)).await;
        let gc = client.gc(&sp, Some(1000)).await?;
        assert!(gc.deleted >= 2, "{size}: {gc:?}");
        let r3 = row(h3).await?;
        assert_eq!(r3.delta, None, "{size}: stored alone before its bases went");
        // Alone: compressed in an object of its own, or (small enough) as it is in a pack.
        assert!(
            r3.encoding == Encoding::Zstd || (r3.pack.is_some() && size <= 64 << 10),
            "{size}: {r3:?}"
        );
        assert!(meta.node(&app.app, &sp, &h1).await?.is_none());
        assert_eq!(&client.read_node(&sp, &h3).await?[..], &v3[..]);
        // A hint naming a node that is gone is ignored.
        let v4 = edited(&v3, "four");
        let h4 = store(&client, &sp, leaf(&v4).1, Some(h1)).await?;
        assert_eq!(row(h4).await?.delta, None);
        assert_eq!(&client.read_node(&sp, &h4).await?[..], &v4[..]);
        // One that names itself or an unrelated node costs nothing either.
        let (h5, p5) = leaf(&edited(&v4, "five"));
        let h5 = store(&client, &sp, p5, Some(h5)).await?;
        assert_eq!(row(h5).await?.delta, None);
    }
    // The chain depth is bounded.
    let mut v = text(9, 5_000);
    let mut prev = store(&client, &sp, leaf(&v).1, None).await?;
    for i in 0..12 {
        v = edited(&v, &format!("step {i}"));
        prev = store(&client, &sp, leaf(&v).1, Some(prev)).await?;
        let depth = row(prev).await?.delta.map_or(0, |d| d.depth);
        assert!(depth <= 8, "{depth}");
    }
    assert_eq!(&client.read_node(&sp, &prev).await?[..], &v[..]);
    // A base in another Space is not looked at: the hint is ignored.
    let only_there = edited(&v, "only in another Space");
    let elsewhere = store(&client, &space("other"), leaf(&only_there).1, None).await?;
    let next = edited(&only_there, "after a hint from elsewhere");
    let h = store(&client, &sp, leaf(&next).1, Some(elsewhere)).await?;
    assert_eq!(row(h).await?.delta, None, "a base of another Space");
    assert_eq!(&client.read_node(&sp, &h).await?[..], &next[..]);

    drop(server);
    let report = env.assert_consistent("hub")?;
    assert!(
        report["nodesChecked"].as_u64().unwrap_or(0) > 10,
        "{report}"
    );
    env.check_invariants(&meta, &app.app).await?;
    Ok(())
}

/// A delta whose base object is damaged is an error on read and in fsck, never other bytes,
/// also after a restart (nothing cached).
async fn a_damaged_base_is_an_error(b: Backend) -> anyhow::Result<()> {
    let (env, app, server, client, meta) = hub_app(b).await?;
    let sp = space("s");
    // Larger than what is held in the database until packed: the base is an object.
    let v1 = text(1, 100_000);
    let v2 = edited(&v1, "two");
    let h1 = store(&client, &sp, leaf(&v1).1, None).await?;
    let h2 = store(&client, &sp, leaf(&v2).1, Some(h1)).await?;
    let r1 = meta.node(&app.app, &sp, &h1).await?.expect("base row");
    let r2 = meta.node(&app.app, &sp, &h2).await?.expect("delta row");
    assert_eq!(r2.encoding, Encoding::ZstdDelta);
    drop(server);

    // The base's object replaced by other bytes of the same length: a frame of other text.
    let key = node_key(&app.app, &sp, &h1, &r1.object_gen);
    let mut forged = zstd::bulk::compress(&text(2, 100_000), 3)?;
    forged.resize(r1.stored_bytes as usize, b'\n');
    env.replace_object(&key, forged).await?;

    let server = env.start()?;
    let client = app.client(&server);
    let err = client.read_node(&sp, &h2).await.unwrap_err();
    assert_eq!(err.status(), Some(500), "{err}");
    assert!(client.read_content(&sp, &h2, Some(0..100)).await.is_err());
    assert!(client.read_node(&sp, &h1).await.is_err(), "the base itself");
    drop(server);
    let (ok, report) = env.fsck("hub", &[])?;
    assert!(!ok, "{report}");
    let text = report.to_string();
    assert!(text.contains(&h2.to_string()), "{report}");
    Ok(())
}

/// Killed while GC stores a dependent alone (after writing its new object; after pointing its
/// row at it): after a restart the dependent reads back, the next passes finish, and fsck finds
/// the store consistent.
async fn killed_while_gc_stores_a_dependent_alone(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_GC_STALE_MARK_MS", 300);
    let app = env.create_app("hub")?;
    let meta = env.meta().await?;
    for (i, failpoint) in ["gc.rebase_after_object", "gc.after_rebase"]
        .into_iter()
        .enumerate()
    {
        let sp = space(&format!("s{i}"));
        // Larger than a packed node: the dependent stays a delta object until GC rewrites it.
        let v1 = text(i as u64 + 20, 100_000);
        let v2 = edited(&v1, failpoint);
        let h2 = {
            let server = env.start()?;
            let client = app.client(&server);
            let h1 = store(&client, &sp, leaf(&v1).1, None).await?;
            let h2 = store(&client, &sp, leaf(&v2).1, Some(h1)).await?;
            let keep: cas_format::RequestId = format!("keep-{i}").parse()?;
            client
                .update_root_refs(&sp, &keep, [(h2, 1)].into())
                .await?;
            h2
        };
        assert!(
            meta.node(&app.app, &sp, &h2)
                .await?
                .and_then(|r| r.delta)
                .is_some()
        );
        tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
        env.kill_during_gc(&app, &sp, failpoint).await?;
        env.check_invariants(&meta, &app.app).await?;

        let server = env.start()?;
        let client = app.client(&server);
        assert_eq!(
            &client.read_node(&sp, &h2).await?[..],
            &v2[..],
            "{failpoint}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        for _ in 0..3 {
            client.gc(&sp, None).await?;
        }
        let row = meta.node(&app.app, &sp, &h2).await?.expect("the kept node");
        assert_eq!(row.delta, None, "{failpoint}: stored alone");
        assert_eq!(
            client.usage(&sp).await?.node_count,
            1,
            "{failpoint}: the base is gone"
        );
        assert_eq!(
            &client.read_node(&sp, &h2).await?[..],
            &v2[..],
            "{failpoint}"
        );
    }
    env.check_invariants(&meta, &app.app).await?;
    env.assert_consistent("hub")?;
    Ok(())
}

/// The hub names the previous version of each changed file, chunk and directory: ten saves
/// of one notebook, each adding a line, grow the store by a fraction of what the same saves
/// cost without deltas, and every version reads back.
async fn hub_saves_are_stored_as_deltas(b: Backend) -> anyhow::Result<()> {
    let mut grown = Vec::new();
    for depth in [0u32, 8] {
        let (_env, _server, a, pid) = hub_with_depth(b, depth).await?;
        let mut nb = String::from_utf8(text(3, 60_000))?;
        let nid = a.notebook(&pid, "n", &[("nb.py", &nb)]).await?;
        let stored = |v: Value| v["readyStoredBytes"].as_i64().unwrap_or(-1);
        let storage = format!("/api/v1/projects/{pid}/storage");
        let before = stored(data(&a.get(&storage).await?, 200));
        let mut versions = Vec::new();
        for i in 2..=11i64 {
            let at = (i as usize * 5_003) % nb.len();
            let at = (0..=at)
                .rev()
                .find(|&k| nb.is_char_boundary(k))
                .unwrap_or(0);
            nb.insert_str(at, &format!("\n# save {i}\n"));
            let saved = data(
                &a.save(&pid, &nid, Some(i - 1), &[("nb.py", &nb)], &[])
                    .await?,
                201,
            );
            versions.push((
                saved["version_id"].as_str().unwrap_or_default().to_string(),
                nb.clone(),
            ));
        }
        let after = stored(data(&a.get(&storage).await?, 200));
        grown.push(after - before);
        for (vid, content) in &versions {
            let (st, body) = a
                .get_bytes(&format!(
                    "/api/v1/projects/{pid}/notebooks/{nid}/versions/{vid}/files/nb.py"
                ))
                .await?;
            assert_eq!(st, 200, "{vid}");
            assert_eq!(&body[..], content.as_bytes(), "{vid}");
        }
    }
    deltas_cut("ten saves", &grown, 2);
    Ok(())
}

/// A hub whose CAS keeps delta chains up to `depth` (0: none), a user's client and a project.
async fn hub_with_depth(
    b: Backend,
    depth: u32,
) -> anyhow::Result<(HubEnv, HubServer, HubClient, String)> {
    let mut env = HubEnv::new(b).await?;
    env.set("UNICAS_DELTA_MAX_DEPTH", depth);
    let token = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&token));
    let pid = a.project("P").await?;
    Ok((env, server, a, pid))
}

/// Reports what `what` grew the store by without deltas (`grown[0]`) and with them
/// (`grown[1]`), and checks that deltas cut it by more than `factor` times.
fn deltas_cut(what: &str, grown: &[i64], factor: i64) {
    eprintln!(
        "{what}: {} bytes stored without deltas, {} with",
        grown[0], grown[1]
    );
    assert!(
        grown[1] * factor < grown[0],
        "{what} grew the store by {} bytes with deltas, {} without",
        grown[1],
        grown[0]
    );
}

/// A file added at a path the previous version does not have, as an edited copy of a file of
/// the same name elsewhere, is stored as a delta against that file and its chunks against
/// that file's chunks (the hub pairs files by name, as git's packer does); both read back.
async fn a_copy_at_a_new_path_is_stored_as_a_delta(b: Backend) -> anyhow::Result<()> {
    let mut grown = Vec::new();
    for depth in [0u32, 8] {
        let (_env, _server, a, pid) = hub_with_depth(b, depth).await?;
        let first = String::from_utf8(text(5, 60_000))?;
        // Every chunk differs (as when a notebook is run again), so nothing dedups.
        let copy = first.replace("data", "Data");
        let nid = a.notebook(&pid, "n", &[("listings/nb.py", &first)]).await?;
        let stored = |v: Value| v["readyStoredBytes"].as_i64().unwrap_or(-1);
        let storage = format!("/api/v1/projects/{pid}/storage");
        let before = stored(data(&a.get(&storage).await?, 200));
        data(
            &a.save(&pid, &nid, Some(1), &[("chapters/one/nb.py", &copy)], &[])
                .await?,
            201,
        );
        let after = stored(data(&a.get(&storage).await?, 200));
        grown.push(after - before);
        let files = format!("/api/v1/projects/{pid}/notebooks/{nid}/workspace/files");
        for (path, content) in [("listings/nb.py", &first), ("chapters/one/nb.py", &copy)] {
            let (st, body) = a.get_bytes(&format!("{files}/{path}")).await?;
            assert_eq!(st, 200, "{path}");
            assert_eq!(&body[..], content.as_bytes(), "{path}");
        }
    }
    deltas_cut("a copy at a new path", &grown, 3);
    Ok(())
}

/// Two requests publish the same new node at once, one as a delta against a base it names and
/// one alone (two clients saving the same content): each attempt writes an object of its own,
/// so whichever finishes second cannot replace the bytes the winner's row describes; the
/// loser's object is removed, the node reads back, and fsck finds nothing.
async fn racing_publications_keep_the_winners_bytes(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    // Every node an object of its own; each publication waits after writing it, so the second
    // request writes while the first is about to commit its row.
    env.set("UNICAS_HOLD_MAX_BYTES", 0);
    let app = env.create_app("hub")?;
    let server = env.start_with(&[("UNICAS_FAILPOINTS", "publish.after_object=delay:700")])?;
    let client = app.client(&server);
    let sp = space("s");
    // Larger than what travels inline: both requests upload, then publish from the upload.
    let base = text(11, 300_000);
    let hb = store(&client, &sp, leaf(&base).1, None).await?;
    let meta = env.meta().await?;
    let mut expected = vec![(hb, base.clone())];
    for round in 0..4u32 {
        let v = edited(&base, &format!("round {round}"));
        let (h, portable) = leaf(&v);
        // Rounds alternate which of the two starts first.
        let (first, second) = if round % 2 == 0 {
            (Some(hb), None)
        } else {
            (None, Some(hb))
        };
        let early = {
            let (client, sp, portable) = (client.clone(), sp.clone(), portable.clone());
            tokio::spawn(async move { store(&client, &sp, portable, first).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        store(&client, &sp, portable, second).await?;
        early.await??;
        assert_eq!(
            &client.read_node(&sp, &h).await?[..],
            &v[..],
            "round {round}"
        );
        let row = row_of(&meta, &app.app, &sp, h).await?;
        // Only the published attempt's object is left.
        env.assert_only_object_of(&app, &sp, &row)
            .await
            .with_context(|| format!("round {round}"))?;
        expected.push((h, v));
    }
    read_all(&client, &sp, &expected).await?;
    env.assert_consistent("hub")?;
    drop(server);
    Ok(())
}

e2e!(
    deltas_are_read_back_and_outlive_their_bases,
    racing_publications_keep_the_winners_bytes,
    a_damaged_base_is_an_error,
    killed_while_gc_stores_a_dependent_alone,
);

hub_e2e!(
    hub_saves_are_stored_as_deltas,
    a_copy_at_a_new_path_is_stored_as_a_delta
);
