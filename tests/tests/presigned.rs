//! Presigned S3 upload targets against an S3 server that verifies SigV4 (s3s-fs): the URL is
//! signed over `if-none-match: *` and the content type, so an upload without them, with other
//! values, with a tampered signature, after expiry, or a second time is refused.

use std::time::Duration;

use cas_format::wire::{LeaseResponse, UploadTarget};
use tests::*;

async fn put(
    target: &UploadTarget,
    body: Vec<u8>,
    skip: Option<&str>,
    replace: Option<(&str, &str)>,
) -> u16 {
    let mut req = reqwest::Client::new().put(&target.url).body(body);
    for (k, v) in &target.headers {
        if Some(k.as_str()) == skip {
            continue;
        }
        match replace {
            Some((name, value)) if name == k => req = req.header(k, value),
            _ => req = req.header(k, v),
        }
    }
    req.send().await.map(|r| r.status().as_u16()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presigned_uploads_are_signed_and_write_once() -> anyhow::Result<()> {
    let endpoint = std::env::var("UNICAS_TEST_S3S_ENDPOINT").map_err(|_| {
        anyhow::anyhow!("this test needs a signature-checking S3 server: run scripts/test")
    })?;
    let mut env = TestEnv::new(Backend::SQLITE_S3).await?;
    env.set("UNICAS_S3_ENDPOINT", &endpoint)
        // Long enough for the refused PUTs before the valid one on a loaded machine.
        .set("UNICAS_UPLOAD_URL_TTL_MS", 6000)
        .set("UNICAS_SMALL_UPLOAD_BYTES", 1024);
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    let content: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let (h, bytes) = leaf(&content);
    let LeaseResponse::AwaitingUpload { upload, .. } =
        client.lease_node(&sp, &h, 60_000, None).await?
    else {
        panic!("expected awaiting_upload")
    };
    assert!(
        upload.url.starts_with(&endpoint),
        "a large upload goes straight to S3: {}",
        upload.url
    );
    assert!(upload.url.contains("X-Amz-Signature="), "{}", upload.url);
    assert!(
        upload.url.to_ascii_lowercase().contains("if-none-match"),
        "if-none-match is a signed header: {}",
        upload.url
    );
    assert_eq!(
        upload.headers.get("if-none-match").map(String::as_str),
        Some("*")
    );

    assert_eq!(
        put(&upload, bytes.to_vec(), Some("if-none-match"), None).await,
        403,
        "without if-none-match"
    );
    assert_eq!(
        put(
            &upload,
            bytes.to_vec(),
            None,
            Some(("content-type", "text/plain"))
        )
        .await,
        403,
        "another content type"
    );
    let mut tampered = upload.clone();
    let at = tampered.url.find("X-Amz-Signature=").expect("signature") + "X-Amz-Signature=".len();
    let flipped = if &tampered.url[at..at + 1] == "0" {
        "1"
    } else {
        "0"
    };
    tampered.url.replace_range(at..at + 1, flipped);
    assert_eq!(
        put(&tampered, bytes.to_vec(), None, None).await,
        403,
        "tampered signature"
    );
    assert_eq!(put(&upload, bytes.to_vec(), None, None).await, 200);
    assert_eq!(
        put(&upload, bytes.to_vec(), None, None).await,
        412,
        "write-once"
    );
    assert!(matches!(
        client.lease_node(&sp, &h, 60_000, None).await?,
        LeaseResponse::Ready { .. }
    ));
    assert_eq!(&client.read_node(&sp, &h).await?[..], &content[..]);

    // A declared size is signed too: another length is refused.
    let (h2, bytes2) = leaf(&content[..50_000]);
    let LeaseResponse::AwaitingUpload { upload, .. } = client
        .lease_node(&sp, &h2, 60_000, Some(bytes2.len() as u64))
        .await?
    else {
        panic!()
    };
    assert!(
        upload.url.contains("content-length"),
        "the length is signed: {}",
        upload.url
    );
    assert_eq!(
        put(&upload, bytes.to_vec(), Some("content-length"), None).await,
        403,
        "a body of another length"
    );
    assert_eq!(put(&upload, bytes2.to_vec(), None, None).await, 200);
    assert!(matches!(
        client.lease_node(&sp, &h2, 60_000, None).await?,
        LeaseResponse::Ready { .. }
    ));

    // An expired URL.
    let (h3, bytes3) = leaf(&content[..60_000]);
    let LeaseResponse::AwaitingUpload { upload, .. } =
        client.lease_node(&sp, &h3, 60_000, None).await?
    else {
        panic!()
    };
    tokio::time::sleep(Duration::from_millis(6300)).await;
    assert_eq!(
        put(&upload, bytes3.to_vec(), None, None).await,
        403,
        "expired"
    );
    env.assert_consistent("hub")?;
    Ok(())
}
