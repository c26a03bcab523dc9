//! Class 10: disk and concurrency. Pushes, imports and staged uploads spool a bounded number
//! at once (beyond: 503 `busy` with `Retry-After`), and below a free-space floor the hub and
//! the service answer 507 instead of filling the disk; nothing is stored either way.

use std::time::Duration;

use bytes::Bytes;
use cas_format::wire::{BatchLeaseElement, BatchLeaseResult, LeaseResponse};
use tests::hub::{HubEnv, data, refused, tar_of};
use tests::{Backend, Blobs, TestEnv, e2e, hub_e2e, node, space};

use crate::support::{push, push_notebook, revisions};

hub_e2e!(spools_are_bounded_and_keep_a_floor);
e2e!(the_service_keeps_a_floor);

async fn spools_are_bounded_and_keep_a_floor(b: Backend) -> anyhow::Result<()> {
    let mut env = HubEnv::new(b).await?;
    env.set("UNICAS_HUB_MAX_CONCURRENT_SPOOLS", 1);
    let token = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&token));
    let pid = a.project("P").await?;
    let (nid, sync) = push_notebook(&a, &pid, "ci").await?;
    let uploads = format!("/api/v1/projects/{pid}/uploads");

    // A slow upload holds the only spool slot.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    let body = reqwest::Body::wrap_stream(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }));
    let slow = {
        let a = a.clone();
        let uploads = uploads.clone();
        tokio::spawn(async move {
            a.post_bytes(&uploads, "application/octet-stream", body, &[])
                .await
        })
    };
    tx.send(Ok(Bytes::from(vec![1u8; 64 << 10]))).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Meanwhile: every other spooling request is busy, with a Retry-After.
    let busy = a
        .request(reqwest::Method::POST, &uploads)
        .header("content-type", "application/octet-stream")
        .body("x")
        .send()
        .await?;
    assert_eq!(busy.status(), 503);
    assert!(busy.headers().contains_key("retry-after"));
    let body: serde_json::Value = busy.json().await?;
    assert_eq!(body["error"]["code"], "busy");
    refused(
        &push(&server.url, &sync, tar_of(&[("a.py", b"1")])).await?,
        503,
        "busy",
    );
    // The slow upload finishes, and the slot is free again.
    tx.send(Ok(Bytes::from(vec![2u8; 64 << 10]))).await?;
    drop(tx);
    data(&slow.await??, 201);
    data(
        &push(&server.url, &sync, tar_of(&[("a.py", b"1")])).await?,
        200,
    );
    drop(server);

    // Below the floor: 507, and nothing stored.
    let server = env.start_with(&[("UNICAS_HUB_MIN_FREE_BYTES", "1000000000000000000")])?;
    let a = server.client(Some(&token));
    refused(
        &a.post_bytes(&uploads, "application/octet-stream", vec![1u8; 1000], &[])
            .await?,
        507,
        "insufficient_storage",
    );
    refused(
        &push(&server.url, &sync, tar_of(&[("a.py", b"2")])).await?,
        507,
        "insufficient_storage",
    );
    assert_eq!(revisions(&a, &pid, &nid).await?, [1]);
    Ok(())
}

async fn the_service_keeps_a_floor(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_MIN_FREE_BYTES", "1000000000000000000");
    let app = env.create_app("a")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    let (h, bytes) = node("application/octet-stream", &[], b"hello");
    let e = match client
        .lease_node(&sp, &h, 60_000, Some(bytes.len() as u64))
        .await?
    {
        LeaseResponse::AwaitingUpload { upload, .. } => client
            .clone()
            .with_retry(cas_client::RetryPolicy {
                attempts: 1,
                ..Default::default()
            })
            .upload(&upload, bytes)
            .await
            .expect_err("an upload below the floor"),
        other => panic!("{}", other.state()),
    };
    assert_eq!(e.status(), Some(507), "{e}");
    assert_eq!(e.code(), Some("INSUFFICIENT_STORAGE"));
    assert_eq!(client.usage(&sp).await?.node_count, 0);

    // A node sent inline, too large to be held in its row, is written as an object of its
    // own from memory: on the filesystem that is refused below the floor like any spool
    // write (the element's own 507); S3 takes it as the body of its PUT, which fills no
    // local disk.
    let (h, bytes) = node("application/octet-stream", &[], &[7u8; 100 << 10]);
    let element = BatchLeaseElement {
        hash: h,
        lease_duration_ms: 60_000,
        upload_bytes: Some(bytes.len() as u64),
        content: None,
        content_bytes: None,
        delta_base: None,
    };
    let results = client
        .lease_batch_raw(&sp, vec![(element, Some(bytes))])
        .await?;
    let usage = client.usage(&sp).await?;
    match (b.blobs, &results[..]) {
        (Blobs::Fs, [BatchLeaseResult::Error(e)]) => {
            assert_eq!(e.error, "INSUFFICIENT_STORAGE", "{}", e.message);
            assert_eq!(usage.node_count, 0);
        }
        (Blobs::S3, [BatchLeaseResult::Lease(LeaseResponse::Ready { hash, .. })]) => {
            assert_eq!(*hash, h);
            assert_eq!(usage.node_count, 1);
            assert_eq!(client.read_content(&sp, &h, None).await?.len(), 100 << 10);
        }
        (blobs, other) => panic!("{blobs:?}: {other:?}"),
    }
    Ok(())
}
