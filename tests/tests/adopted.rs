//! Uploads adopted as their objects: on the filesystem, an uploaded node whose content does
//! not compress, that names no delta base and is too large to be held in its row becomes its
//! object as it was received (its portable bytes, written once). It reads back whole and by
//! range, serves as a delta base, is verified by fsck (which finds damage in it) and is
//! collected by GC like any other node; two publications of one upload at once leave the
//! winner's object intact. Content that compresses, small content, and object
//! stores whose objects are not files are stored as before.

use anyhow::Context;
use cas_format::Hash;
use cas_format::wire::LeaseResponse;
use cas_service::blob::{Encoding, node_key};
use tests::content::*;
use tests::*;

async fn uploads_that_do_not_compress_become_their_objects(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let meta = env.meta().await?;
    let sp = space("s");
    let row = |h: Hash| row_of(&meta, &app.app, &sp, h);
    let on_files = b.blobs == Blobs::Fs;

    // Uploaded by the single routes: lease, PUT, lease.
    let v1 = noise(1, 300_000);
    let (h1, p1) = leaf(&v1);
    client.ensure_node(&sp, &h1, &p1, LEASE).await?;
    let r1 = row(h1).await?;
    if on_files {
        assert_eq!(r1.encoding, Encoding::Portable, "{r1:?}");
        assert_eq!(r1.stored_bytes, p1.len() as i64, "its portable bytes");
        let objects = env.blobs().await?.list("uploads/").await?;
        assert!(
            objects.is_empty(),
            "no upload left once published: {objects:?}"
        );
    } else {
        assert_ne!(r1.encoding, Encoding::Portable, "{r1:?}");
    }
    assert_eq!(&client.read_node(&sp, &h1).await?[..], &v1[..]);
    for (from, to) in [(0, 1), (0, 4096), (150_000, 150_100), (299_000, 300_000)] {
        let part = client.read_content(&sp, &h1, Some(from..to)).await?;
        assert_eq!(&part[..], &v1[from as usize..to as usize], "{from}..{to}");
    }

    // Content that compresses, and content below what is worth adopting, as before.
    let t = text(2, 300_000);
    let (ht, pt) = leaf(&t);
    client.ensure_node(&sp, &ht, &pt, LEASE).await?;
    assert_eq!(row(ht).await?.encoding, Encoding::Zstd);
    let (hs, ps) = leaf(&noise(3, 40_000));
    client.ensure_node(&sp, &hs, &ps, LEASE).await?;
    let rs = row(hs).await?;
    assert!(
        rs.encoding == Encoding::Identity && rs.stored_bytes == 40_000,
        "{rs:?}"
    );

    // A later version names it as its delta base: a delta against the adopted object, rebuilt
    // from it on every read.
    let mut v2 = v1.clone();
    v2[100_000..100_020].copy_from_slice(b"twenty edited bytes!");
    let h2 = store(&client, &sp, leaf(&v2).1, Some(h1)).await?;
    let r2 = row(h2).await?;
    assert_eq!(r2.encoding, Encoding::ZstdDelta, "{r2:?}");
    assert_eq!(r2.delta.map(|d| d.hash), Some(h1));
    assert_eq!(&client.read_node(&sp, &h2).await?[..], &v2[..]);
    let part = client.read_content(&sp, &h2, Some(99_990..100_030)).await?;
    assert_eq!(&part[..], &v2[99_990..100_030]);
    env.assert_consistent("hub")?;

    // A byte of the content damaged: fsck finds it.
    let (hd, pd) = leaf(&noise(4, 200_000));
    client.ensure_node(&sp, &hd, &pd, LEASE).await?;
    let rd = row(hd).await?;
    let key = node_key(&app.app, &sp, &hd, &rd.object_gen);
    let mut damaged = if on_files {
        pd.to_vec()
    } else {
        noise(4, 200_000)
    };
    let last = damaged.len() - 1;
    damaged[last] ^= 1;
    env.replace_object(&key, damaged).await?;
    let (ok, report) = env.fsck("hub", &[])?;
    assert!(!ok, "{report:#}");
    let findings = report["findings"].to_string();
    assert!(
        findings.contains("object-hash") && findings.contains(&hd.to_hex()),
        "{report:#}"
    );

    // Nothing holds them once their leases lapse: GC takes them and their objects.
    tokio::time::sleep(std::time::Duration::from_millis(1_300)).await;
    for _ in 0..3 {
        client.gc(&sp, Some(1000)).await?;
    }
    for h in [h1, h2, ht, hs, hd] {
        assert!(
            meta.node(&app.app, &sp, &h).await?.is_none(),
            "{h} collected"
        );
    }
    let left = env.node_objects(&app, &sp).await?;
    assert!(left.is_empty(), "{left:?}");
    drop(server);
    Ok(())
}

/// Two leases publish one uploaded node at once, each writing its own attempt's object: on the
/// filesystem both are names of the one uploaded file. The loser removes its name only; the
/// winner's object keeps the bytes, the node reads back, and fsck finds nothing.
async fn racing_publications_of_one_upload(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    // Each publication waits after writing its object, so the second writes while the first
    // is about to commit its row.
    let server = env.start_with(&[("UNICAS_FAILPOINTS", "publish.after_object=delay:700")])?;
    let client = app.client(&server);
    let meta = env.meta().await?;
    let sp = space("s");
    for round in 0..3u64 {
        let content = noise(10 + round, 300_000);
        let (h, portable) = leaf(&content);
        let LeaseResponse::AwaitingUpload { upload, .. } =
            client.lease_node(&sp, &h, LEASE, None).await?
        else {
            anyhow::bail!("round {round}: not awaiting its upload");
        };
        client.upload(&upload, portable).await?;
        let early = {
            let (client, sp) = (client.clone(), sp.clone());
            tokio::spawn(async move { client.lease_node(&sp, &h, LEASE, None).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        let late = client.lease_node(&sp, &h, LEASE, None).await?;
        let early = early.await??;
        for r in [&early, &late] {
            assert!(
                matches!(r, LeaseResponse::Ready { .. }),
                "round {round}: {r:?}"
            );
        }
        assert_eq!(&client.read_node(&sp, &h).await?[..], &content[..]);
        let row = row_of(&meta, &app.app, &sp, h).await?;
        if b.blobs == Blobs::Fs {
            assert_eq!(row.encoding, Encoding::Portable, "round {round}");
        }
        // Only the published attempt's object is left.
        env.assert_only_object_of(&app, &sp, &row)
            .await
            .with_context(|| format!("round {round}"))?;
    }
    env.assert_consistent("hub")?;
    drop(server);
    Ok(())
}

e2e!(
    uploads_that_do_not_compress_become_their_objects,
    racing_publications_of_one_upload,
);
