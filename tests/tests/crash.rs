//! Crash safety: the server process is killed (SIGKILL) at the worst moments, restarted, and
//! the invariants checked.

use std::collections::BTreeMap;
use std::time::Duration;

use cas_client::Ensured;
use cas_format::wire::LeaseResponse;
use cas_service::blob::Encoding;
use tests::*;

const LEASE: u64 = 60_000;

/// Killed between writing a node's object and committing its row: the object is an orphan
/// (reported, inside its grace period), and the repeated lease after a restart publishes it.
/// Once for a small node, once for one whose upload becomes its object (`adopted.rs`): on the
/// filesystem the killed attempt's object and the repeated one are the same file; on S3 (every
/// upload through a presigned URL) each is a copy of the upload.
async fn crash_between_object_and_row(b: Backend) -> anyhow::Result<()> {
    crash_between_object_and_row_of(b, b"the node in flight").await?;
    crash_between_object_and_row_of(b, &tests::content::noise(7, 300_000)).await
}

async fn crash_between_object_and_row_of(b: Backend, content: &[u8]) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    // Every node an object (a small node held in its row has none: `held.rs`), every S3
    // upload through a presigned URL.
    env.set("UNICAS_HOLD_MAX_BYTES", 0);
    env.set("UNICAS_SMALL_UPLOAD_BYTES", 0);
    let app = env.create_app("hub")?;
    let sp = space("s");
    let (child, child_b) = leaf(b"child, published before the crash");
    let (h, bytes) = node("application/x-test", &[child, child], content);
    {
        let server = env.start()?;
        app.client(&server)
            .ensure_node(&sp, &child, &child_b, LEASE)
            .await?;
    }
    env.crash_at("publish.after_object", |server| {
        let client = app.client(&server);
        let (h, bytes) = (h, bytes.clone());
        let sp = sp.clone();
        async move {
            let LeaseResponse::AwaitingUpload { upload, .. } =
                client.lease_node(&sp, &h, LEASE, None).await.unwrap()
            else {
                panic!()
            };
            client.upload(&upload, bytes).await.unwrap();
            // This lease validates, writes the object, and stops at the failpoint.
            tokio::spawn(async move { client.lease_node(&sp, &h, LEASE, None).await });
            server
        }
    })
    .await?;

    // After the crash: an object without a row, which fsck reports as in its grace period.
    let (ok, report) = env.fsck("hub", &[])?;
    assert!(
        ok,
        "an orphan inside its grace period is not an inconsistency: {report:#}"
    );
    assert!(
        report["findings"].to_string().contains("orphan-in-grace"),
        "{report:#}"
    );
    let meta = env.meta().await?;
    assert!(
        meta.node(&app.app, &sp, &h).await?.is_none(),
        "no row was committed"
    );
    env.check_invariants(&meta, &app.app).await?;

    // Restart and repeat the lease: ready, with nothing uploaded again.
    let server = env.start()?;
    let client = app.client(&server);
    let r = client.ensure_node(&sp, &h, &bytes, LEASE).await?;
    assert!(matches!(r.state, Ensured::Ready { .. }));
    assert_eq!(r.uploaded_bytes, 0, "the upload survived the crash");
    assert_eq!(&client.read_node(&sp, &h).await?[..], content);
    assert_eq!(
        client
            .read_metadata(&sp, &child)
            .await?
            .state
            .child_ref_count,
        2
    );
    env.check_invariants(&meta, &app.app).await?;
    // The repeated lease published its own attempt and queued the killed attempt's object,
    // which the next GC pass deletes.
    let (ok, report) = env.fsck("hub", &[])?;
    assert!(
        ok && report["findings"].to_string().contains("queued-deletion"),
        "{report:#}"
    );
    client.gc(&sp, Some(100)).await?;
    let (ok, report) = env.fsck("hub", &[])?;
    assert!(
        ok && report["findings"].as_array().unwrap().is_empty(),
        "{report:#}"
    );
    Ok(())
}

/// The same crash, repaired by `fsck --repair-orphans`: the upload's evidence proves the
/// object, so fsck publishes the row; for a small node and for one whose upload became its
/// object (its portable bytes: linked on the filesystem, copied within S3).
async fn fsck_adopts_a_proven_orphan(b: Backend) -> anyhow::Result<()> {
    fsck_adopts_a_proven_orphan_of(b, b"adopt me", Encoding::Identity).await?;
    let noise = tests::content::noise(8, 300_000);
    fsck_adopts_a_proven_orphan_of(b, &noise, Encoding::Portable).await
}

async fn fsck_adopts_a_proven_orphan_of(
    b: Backend,
    content: &[u8],
    encoding: Encoding,
) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_HOLD_MAX_BYTES", 0);
    env.set("UNICAS_SMALL_UPLOAD_BYTES", 0);
    let app = env.create_app("hub")?;
    let sp = space("s");
    let (h, bytes) = leaf(content);
    env.crash_at("publish.after_object", |server| {
        let client = app.client(&server);
        let (h, bytes) = (h, bytes.clone());
        let sp = sp.clone();
        async move {
            // Uploads, then stops at the failpoint inside the publishing lease.
            tokio::spawn(async move { client.ensure_node(&sp, &h, &bytes, LEASE).await });
            server
        }
    })
    .await?;
    let meta = env.meta().await?;
    assert!(
        meta.node(&app.app, &sp, &h).await?.is_none(),
        "no row after the crash"
    );
    let (ok, report) = env.fsck("hub", &["--repair-orphans"])?;
    assert!(ok, "{report:#}");
    assert_eq!(report["orphansAdopted"], 1, "{report:#}");
    let row = meta.node(&app.app, &sp, &h).await?;
    assert_eq!(row.map(|r| r.encoding), Some(encoding));
    let server = env.start()?;
    let client = app.client(&server);
    assert_eq!(&client.read_node(&sp, &h).await?[..], content);
    env.check_invariants(&meta, &app.app).await?;
    env.assert_consistent("hub")?;
    Ok(())
}

/// Killed after GC deleted objects but before it deleted the rows: the rows stay marked and the
/// next pass after the restart finishes them.
async fn crash_in_the_middle_of_gc(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_GC_STALE_MARK_MS", 300);
    let app = env.create_app("hub")?;
    let sp = space("s");
    let (child, child_b) = leaf(b"child");
    let (p, p_b) = node("application/x-test", &[child], b"parent");
    let (kept, kept_b) = leaf(b"kept by a root ref");
    {
        let server = env.start()?;
        let client = app.client(&server);
        for (h, bytes) in [(&child, &child_b), (&p, &p_b), (&kept, &kept_b)] {
            client.ensure_node(&sp, h, bytes, 1000).await?;
        }
        client
            .update_root_refs(&sp, &"keep".parse()?, BTreeMap::from([(kept, 1)]))
            .await?;
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    env.crash_at("gc.after_delete", |server| {
        let client = app.client(&server);
        let sp = sp.clone();
        async move {
            tokio::spawn(async move { client.gc(&sp, None).await });
            server
        }
    })
    .await?;
    let meta = env.meta().await?;
    env.check_invariants(&meta, &app.app).await?;
    let server = env.start()?;
    let client = app.client(&server);
    assert_eq!(
        client.read_node(&sp, &p).await.unwrap_err().status(),
        Some(404)
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut deleted = 0;
    for _ in 0..3 {
        deleted += client.gc(&sp, None).await?.deleted;
    }
    assert_eq!(deleted, 2, "the parent, then its child");
    assert_eq!(
        &client.read_node(&sp, &kept).await?[..],
        b"kept by a root ref"
    );
    env.check_invariants(&meta, &app.app).await?;
    env.assert_consistent("hub")?;
    Ok(())
}

/// SIGTERM: the server drains and exits cleanly.
async fn graceful_shutdown(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let (h, bytes) = leaf(b"before shutdown");
    app.client(&server)
        .ensure_node(&space("s"), &h, &bytes, LEASE)
        .await?;
    assert!(server.terminate()?, "exit status after SIGTERM");
    let server = env.start()?;
    assert_eq!(
        &app.client(&server).read_node(&space("s"), &h).await?[..],
        b"before shutdown"
    );
    Ok(())
}

e2e!(
    crash_between_object_and_row,
    fsck_adopts_a_proven_orphan,
    crash_in_the_middle_of_gc,
    graceful_shutdown,
);
