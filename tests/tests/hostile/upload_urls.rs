//! Class 4: an upload URL that expired while its upload slot is open is never handed out
//! again: the next lease answers a fresh URL (a fresh expiry), the old one stays refused where
//! the store checks signatures, and the node can be stored at once.

use std::time::Duration;

use cas_format::wire::LeaseResponse;
use tests::{Backend, Blobs, TestEnv, e2e, node, space};

e2e!(an_expired_upload_url_is_renewed);

fn target(r: &LeaseResponse) -> cas_format::wire::UploadTarget {
    match r {
        LeaseResponse::AwaitingUpload { upload, .. } => upload.clone(),
        other => panic!("expected an upload target, got {}", other.state()),
    }
}

async fn an_expired_upload_url_is_renewed(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_UPLOAD_URL_TTL_MS", 1500);
    env.set("UNICAS_UPLOAD_TTL_MS", 600_000);
    let app = env.create_app("a")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    // Large enough that an S3 store hands out a presigned URL of the bucket itself.
    let content = vec![7u8; (1 << 20) + 4096];
    let (h, portable) = node("application/octet-stream", &[], &content);
    let len = Some(portable.len() as u64);

    let first = target(&client.lease_node(&sp, &h, 60_000, len).await?);
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let now = cas_service::now_ms();
    assert!(first.expires_at <= now, "the first URL should have expired");
    let second = target(&client.lease_node(&sp, &h, 60_000, len).await?);
    assert!(
        second.expires_at > now + 500,
        "a lease answered an expired URL again (expires {}, now {now})",
        second.expires_at
    );
    assert_ne!(second.url, first.url);
    if b.blobs == Blobs::Fs {
        // The service's own URLs check their expiry, before reading the body (sent empty here:
        // the early 403 of a large body races with the body's write, a broken pipe).
        let r = reqwest::Client::new()
            .put(&first.url)
            .headers(
                first
                    .headers
                    .iter()
                    .map(|(k, v)| (k.parse().expect("header"), v.parse().expect("value")))
                    .collect(),
            )
            .body(Vec::new())
            .send()
            .await?;
        assert_eq!(r.status(), 403, "an expired URL was accepted");
    }
    client.upload(&second, portable.clone()).await?;
    match client.lease_node(&sp, &h, 60_000, len).await? {
        LeaseResponse::Ready { .. } => {}
        other => panic!("not stored after the renewed URL: {}", other.state()),
    }
    assert_eq!(client.read_content(&sp, &h, None).await?, content);
    Ok(())
}
