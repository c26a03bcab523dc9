//! Uploads adopted as their objects: an uploaded node whose content does not compress and is
//! too large to be held in its row becomes its object as it was received (its portable
//! bytes): on the filesystem the upload linked into place (written once), on S3 the upload
//! the client wrote there copied within the store (not sent again by the service). It reads
//! back whole and by range, serves as a delta base, is verified by fsck (which finds damage
//! in it) and is collected by GC like any other node; two publications of one upload at once
//! leave the winner's object intact; an S3 upload that is no longer the version validated is
//! not copied. Content that compresses and small content are stored as before.

use anyhow::Context;
use cas_format::Hash;
use cas_format::wire::LeaseResponse;
use cas_service::blob::{Encoding, node_key};
use tests::content::*;
use tests::*;

async fn uploads_that_do_not_compress_become_their_objects(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    // On S3, uploads over 64 KiB go to the store through presigned URLs (smaller ones, as
    // nodes up to 1 MiB by default, through the service into the database).
    env.set("UNICAS_SMALL_UPLOAD_BYTES", 64 << 10);
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
    assert_eq!(r1.encoding, Encoding::Portable, "{r1:?}");
    assert_eq!(r1.stored_bytes, p1.len() as i64, "its portable bytes");
    if on_files {
        let objects = env.blobs().await?.list("uploads/").await?;
        assert!(
            objects.is_empty(),
            "no upload left once published: {objects:?}"
        );
    } else {
        // Copied within the store, not sent: the one object written so far, and no PUT.
        let scrape = reqwest::get(format!("{}/metrics", server.url))
            .await?
            .text()
            .await?;
        let requests = |op: &str| {
            let series =
                format!(r#"unicas_object_store_requests_total{{operation="{op}",outcome="ok"}}"#);
            metric(&scrape, &series)
        };
        assert_eq!(requests("copy"), 1.0, "{scrape}");
        assert!(requests("put").is_nan(), "{scrape}");
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
    let mut damaged = pd.to_vec();
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

/// Leases the node `h`, uploads `portable` to the target its lease names, and starts the lease
/// that publishes it in a task of its own.
async fn upload_then_publish(
    client: &cas_client::AppCasClient,
    sp: &cas_format::SpaceId,
    h: Hash,
    portable: bytes::Bytes,
) -> anyhow::Result<tokio::task::JoinHandle<Result<LeaseResponse, cas_client::ClientError>>> {
    let LeaseResponse::AwaitingUpload { upload, .. } =
        client.lease_node(sp, &h, LEASE, None).await?
    else {
        anyhow::bail!("{h} is not awaiting its upload");
    };
    client.upload(&upload, portable).await?;
    let (client, sp) = (client.clone(), sp.clone());
    Ok(tokio::spawn(async move {
        client.lease_node(&sp, &h, LEASE, None).await
    }))
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
        let early = upload_then_publish(&client, &sp, h, portable)
            .await
            .with_context(|| format!("round {round}"))?;
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
        assert_eq!(row.encoding, Encoding::Portable, "round {round}");
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

/// An S3 upload replaced after the read that validated it (as only someone with the store's
/// own credentials can: its presigned URL only creates) is not copied into place: the node
/// is stored from the bytes that were validated, and reads back as them.
async fn a_replaced_upload_is_not_copied(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    // The publication waits before its object is written: after the upload was validated.
    let server = env.start_with(&[("UNICAS_FAILPOINTS", "blob.put=delay:2000")])?;
    let client = app.client(&server);
    let sp = space("s");
    let content = noise(20, 300_000);
    let (h, portable) = leaf(&content);
    let publication = upload_then_publish(&client, &sp, h, portable).await?;
    tokio::time::sleep(std::time::Duration::from_millis(1_000)).await;
    let blobs = env.blobs().await?;
    let uploads = blobs.list("uploads/").await?;
    let [staged] = &uploads[..] else {
        anyhow::bail!("one upload expected: {uploads:?}");
    };
    env.replace_object(&staged.key, leaf(&noise(21, 300_000)).1.to_vec())
        .await?;
    let answer = publication.await??;
    assert!(matches!(answer, LeaseResponse::Ready { .. }), "{answer:?}");
    let row = row_of(&env.meta().await?, &app.app, &sp, h).await?;
    assert_eq!(
        row.encoding,
        Encoding::Identity,
        "sent, not copied: {row:?}"
    );
    assert_eq!(&client.read_node(&sp, &h).await?[..], &content[..]);
    env.assert_only_object_of(&app, &sp, &row).await?;
    env.assert_consistent("hub")?;
    drop(server);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replaced_upload_is_not_copied_sqlite() -> anyhow::Result<()> {
    a_replaced_upload_is_not_copied(Backend::SQLITE_S3).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replaced_upload_is_not_copied_postgres() -> anyhow::Result<()> {
    a_replaced_upload_is_not_copied(Backend::POSTGRES_S3).await
}
