//! The data plane end to end: upload flows, reads, rejections, upload URLs, usage (root refs
//! in `root_ref_batches`, browser clients in `upstream`).

use cas_client::{ClientError, Ensured};
use cas_format::wire::{LeaseResponse, Usage};
use cas_format::{Hash, Value};
use tests::*;

const LEASE: u64 = 60_000;

fn api_code(e: &ClientError) -> String {
    e.code().unwrap_or("none").to_string()
}

/// A raw HTTP client for what the library would not send.
fn http() -> reqwest::Client {
    reqwest::Client::new()
}

async fn put_raw(target: &cas_format::wire::UploadTarget, body: Vec<u8>) -> reqwest::Response {
    let mut req = http().put(&target.url).body(body);
    for (k, v) in &target.headers {
        req = req.header(k, v);
    }
    req.send().await.unwrap()
}

async fn upload_flow(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("project-1");

    // A leaf: awaiting_upload, PUT, then ready.
    let (h, bytes) = leaf(b"hello, unicas\n");
    let first = client.lease_node(&sp, &h, LEASE, None).await?;
    let LeaseResponse::AwaitingUpload { upload, .. } = first else {
        panic!("expected awaiting_upload, got {first:?}")
    };
    assert_eq!(upload.method, "PUT");
    assert_eq!(upload.headers["if-none-match"], "*");
    assert_eq!(upload.headers["content-type"], cas_format::NODE_MEDIA_TYPE);
    client.upload(&upload, bytes.clone()).await?;
    let ready = client.lease_node(&sp, &h, LEASE, None).await?;
    let LeaseResponse::Ready {
        lease_started_at,
        lease_expires_at,
        ..
    } = ready
    else {
        panic!("expected ready, got {ready:?}")
    };
    assert!(lease_expires_at >= lease_started_at + LEASE as i64);
    assert_eq!(&client.read_node(&sp, &h).await?[..], b"hello, unicas\n");
    let meta = client.read_metadata(&sp, &h).await?;
    assert_eq!(meta.metadata.size, 14);
    assert_eq!(meta.metadata.content_type, "application/octet-stream");
    assert!(meta.metadata.refs.is_empty());
    assert_eq!(meta.state.child_ref_count, 0);
    // A second lease of a ready node uploads nothing.
    let again = client.ensure_node(&sp, &h, &bytes, LEASE).await?;
    assert_eq!(again.uploaded_bytes, 0);

    // A parent uploaded before its children: valid, waiting for them.
    let (c1, c1_bytes) = leaf(b"child one");
    let (c2, c2_bytes) = leaf(b"child two");
    let (p, p_bytes) = node("application/x-test-tree", &[c2, c1, c2], b"tree");
    let report = client.ensure_node(&sp, &p, &p_bytes, LEASE).await?;
    assert_eq!(report.state, Ensured::AwaitingChildren(vec![c2, c1]));
    assert_eq!(report.uploaded_bytes, p_bytes.len() as u64);
    // Later leases recheck readiness only: nothing more to upload.
    let LeaseResponse::ValidatedAwaitingChildren { child_hashes, .. } =
        client.lease_node(&sp, &p, LEASE, None).await?
    else {
        panic!("expected validated_awaiting_children")
    };
    assert_eq!(child_hashes, vec![c2, c1]);
    // Not readable while not ready.
    assert_eq!(
        client.read_node(&sp, &p).await.unwrap_err().status(),
        Some(404)
    );
    client.ensure_node(&sp, &c1, &c1_bytes, LEASE).await?;
    let LeaseResponse::ValidatedAwaitingChildren { child_hashes, .. } =
        client.lease_node(&sp, &p, LEASE, None).await?
    else {
        panic!("expected validated_awaiting_children")
    };
    assert_eq!(child_hashes, vec![c2]);
    client.ensure_node(&sp, &c2, &c2_bytes, LEASE).await?;
    let report = client.ensure_node(&sp, &p, &p_bytes, LEASE).await?;
    assert!(matches!(report.state, Ensured::Ready { .. }));
    assert_eq!(report.uploaded_bytes, 0);
    let meta = client.read_metadata(&sp, &p).await?;
    assert_eq!(meta.metadata.refs, vec![c2, c1, c2]);
    assert_eq!(
        client.read_metadata(&sp, &c2).await?.state.child_ref_count,
        2
    );
    assert_eq!(
        client.read_metadata(&sp, &c1).await?.state.child_ref_count,
        1
    );

    // The same bytes in another Space are another node.
    let other = space("project-2");
    assert!(matches!(
        client.lease_node(&other, &h, LEASE, None).await?,
        LeaseResponse::AwaitingUpload { .. }
    ));
    assert_eq!(
        client.read_node(&other, &h).await.unwrap_err().status(),
        Some(404)
    );

    let usage = client.usage(&sp).await?;
    assert_eq!(usage.node_count, 4);
    assert_eq!(usage.ready_content_bytes, 14 + 9 + 9 + 4);
    assert_eq!(usage.ready_stored_bytes, usage.ready_content_bytes);
    assert_eq!(usage.not_ready_node_count, 0);
    assert_eq!(usage.leased_node_count, 4);
    assert_eq!(usage.reserved_bytes, 0);
    let other_usage = client.usage(&other).await?;
    assert_eq!(other_usage.node_count, 0);
    assert!(
        other_usage.reserved_bytes > 0,
        "an active upload reserves bytes"
    );
    Ok(())
}

async fn svalue_nodes(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    let (c, c_bytes) = leaf(b"file");
    let value = Value::map([
        (
            "entries",
            Value::map([("a.txt", Value::Blob(c)), ("b.txt", Value::Blob(c))]),
        ),
        ("n", Value::from(3i64)),
    ]);
    let (h, bytes) = svalue_node(&value);
    client.ensure_node(&sp, &c, &c_bytes, LEASE).await?;
    let r = client.ensure_node(&sp, &h, &bytes, LEASE).await?;
    assert!(matches!(r.state, Ensured::Ready { .. }));
    let content = client.read_node(&sp, &h).await?;
    let (back, refs) = cas_format::svalue::decode(&content)?;
    assert_eq!(back, value);
    assert_eq!(refs, vec![c, c]);
    assert_eq!(
        client.read_metadata(&sp, &c).await?.state.child_ref_count,
        2
    );
    Ok(())
}

async fn range_reads(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    let content: Vec<u8> = (0..100u8).collect();
    let (h, bytes) = leaf(&content);
    client.ensure_node(&sp, &h, &bytes, LEASE).await?;
    let (empty, empty_bytes) = leaf(b"");
    client.ensure_node(&sp, &empty, &empty_bytes, LEASE).await?;
    let token = app.token(&sp, &["cas:nodes:read"]);
    let get = |hash: Hash, range: Option<&'static str>| {
        let mut req = http()
            .get(format!("{}/v1/cas/nodes/{hash}", server.url))
            .query(&[("appId", "hub"), ("spaceId", "s")])
            .bearer_auth(&token);
        if let Some(r) = range {
            req = req.header("range", r);
        }
        req.send()
    };
    let r = get(h, None).await?;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["accept-ranges"], "bytes");
    assert_eq!(r.headers()["content-type"], "application/octet-stream");
    assert_eq!(
        r.headers()["x-unicas-content-type"],
        "application/octet-stream"
    );
    assert_eq!(r.headers()["x-cas-refs"], "", "a leaf has no children");
    assert_eq!(r.bytes().await?.to_vec(), content);
    // A node's own content type and its ordered children, as an upstream client reads them;
    // an active type is served sandboxed and never sniffed.
    let (page, page_bytes) = node("text/html; charset=utf-8", &[h, empty, h], b"<p>hi</p>");
    client.ensure_node(&sp, &page, &page_bytes, LEASE).await?;
    let r = get(page, None).await?;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    assert_eq!(
        r.headers()["x-cas-refs"],
        format!("{},{},{}", h.to_hex(), empty.to_hex(), h.to_hex()).as_str()
    );
    assert_eq!(r.headers()["content-security-policy"], "sandbox");
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    assert_eq!(&r.bytes().await?[..], b"<p>hi</p>");
    for (range, start, end) in [
        ("bytes=10-19", 10, 20),
        ("bytes=90-", 90, 100),
        ("bytes=-5", 95, 100),
        ("bytes=95-500", 95, 100),
    ] {
        let r = get(h, Some(range)).await?;
        assert_eq!(r.status(), 206, "{range}");
        assert_eq!(
            r.headers()["content-range"],
            format!("bytes {start}-{}/100", end - 1).as_str(),
            "{range}"
        );
        assert_eq!(
            r.bytes().await?.to_vec(),
            content[start..end].to_vec(),
            "{range}"
        );
    }
    for range in ["bytes=100-", "bytes=200-300", "bytes=-0"] {
        let r = get(h, Some(range)).await?;
        assert_eq!(r.status(), 416, "{range}");
        assert_eq!(r.headers()["content-range"], "bytes */100");
        let body: serde_json::Value = r.json().await?;
        assert_eq!(body["error"], "INVALID_REQUEST");
    }
    let r = get(empty, Some("bytes=0-0")).await?;
    assert_eq!(r.status(), 416);
    assert_eq!(r.headers()["content-range"], "bytes */0");
    let r = get(empty, None).await?;
    assert_eq!(r.status(), 200);
    assert!(r.bytes().await?.is_empty());
    // Several ranges are not served as such: the whole body comes back.
    let r = get(h, Some("bytes=0-1,5-6")).await?;
    assert_eq!(r.status(), 200);
    // Through the library.
    assert_eq!(
        &client.read_content(&sp, &h, Some(20..30)).await?[..],
        &content[20..30]
    );
    // Unknown node.
    assert_eq!(get(Hash::digest(b"nothing"), None).await?.status(), 404);
    let r = http()
        .get(format!("{}/v1/cas/nodes/NOTAHASH", server.url))
        .query(&[("appId", "hub"), ("spaceId", "s")])
        .bearer_auth(&token)
        .send()
        .await?;
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<serde_json::Value>().await?["error"],
        "INVALID_REQUEST"
    );
    Ok(())
}

async fn upload_rejections(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_NODE_MAX_REFS", 4)
        .set("UNICAS_NODE_MAX_BYTES", 4096);
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");

    // Each case: the hash the client asks for, the bad bytes it uploads, the expected code.
    let (good, good_bytes) = leaf(b"good");
    let (other, other_bytes) = leaf(b"other");
    let mut bad_signature = good_bytes.to_vec();
    bad_signature[0] = b'X';
    let big = vec![7u8; 5000];
    let (big_hash, big_bytes) = leaf(&big);
    let five: Vec<Hash> = (0..5u8).map(|i| leaf(&[i]).0).collect();
    let (many_refs, many_refs_bytes) = node("application/x-test", &five, b"");
    // An SValue whose header refs differ from its SBlobs.
    let enc = cas_format::svalue::encode(&Value::Array(vec![Value::Blob(good)]))?;
    let (svalue_bad_refs, svalue_bad_refs_bytes) =
        node(cas_format::SVALUE_CONTENT_TYPE, &[good, good], &enc.bytes);
    // Content that is not canonical CBOR under the SValue type.
    let (svalue_invalid, svalue_invalid_bytes) =
        node(cas_format::SVALUE_CONTENT_TYPE, &[], &[0x18, 0x01]);
    let cases: Vec<(Hash, Vec<u8>, &str)> = vec![
        (good, other_bytes.to_vec(), "NODE_DIGEST_MISMATCH"),
        (good, bad_signature, "INVALID_CANONICAL_NODE"),
        (
            good,
            good_bytes[..good_bytes.len() - 1].to_vec(),
            "INVALID_CANONICAL_NODE",
        ),
        (big_hash, big_bytes[..4096].to_vec(), "NODE_TOO_LARGE"),
        (many_refs, many_refs_bytes.to_vec(), "TOO_MANY_REFS"),
        (
            svalue_bad_refs,
            svalue_bad_refs_bytes.to_vec(),
            "SVALUE_REFS_MISMATCH",
        ),
        (
            svalue_invalid,
            svalue_invalid_bytes.to_vec(),
            "INVALID_SVALUE",
        ),
    ];
    let _ = other;
    for (hash, bad, code) in cases {
        let LeaseResponse::AwaitingUpload { upload, .. } =
            client.lease_node(&sp, &hash, LEASE, None).await?
        else {
            panic!("{code}: expected awaiting_upload")
        };
        let put = put_raw(&upload, bad).await;
        assert_eq!(put.status(), 200, "{code}");
        let r = client.lease_node(&sp, &hash, LEASE, None).await?;
        let LeaseResponse::AwaitingReplacementUpload {
            rejection,
            upload: second,
            ..
        } = r
        else {
            panic!("{code}: expected awaiting_replacement_upload, got {r:?}")
        };
        assert_eq!(rejection.code, code, "{}", rejection.message);
        assert_ne!(second.url, upload.url, "{code}: a fresh target");
        // Nothing readable, nothing counted.
        assert_eq!(
            client.read_node(&sp, &hash).await.unwrap_err().status(),
            Some(404)
        );
    }
    // The good node still uploads through its fresh target.
    let r = client.ensure_node(&sp, &good, &good_bytes, LEASE).await?;
    assert!(matches!(r.state, Ensured::Ready { .. }));
    // Its own bytes refused: the library reports the code.
    let e = client
        .ensure_node(&sp, &many_refs, &many_refs_bytes, LEASE)
        .await
        .unwrap_err();
    assert_eq!(api_code(&e), "TOO_MANY_REFS");
    // A body above the node limit: the service's own targets refuse it outright; a presigned
    // object-store target (S3, no declared size) stores it and the next lease refuses it
    // without reading it.
    let LeaseResponse::AwaitingUpload { upload, .. } =
        client.lease_node(&sp, &big_hash, LEASE, None).await?
    else {
        panic!()
    };
    let put = put_raw(&upload, big_bytes.to_vec()).await;
    if b.blobs == Blobs::S3 {
        assert_eq!(put.status(), 200);
        let r = client.lease_node(&sp, &big_hash, LEASE, None).await?;
        let LeaseResponse::AwaitingReplacementUpload { rejection, .. } = r else {
            panic!("{r:?}")
        };
        assert_eq!(rejection.code, "NODE_TOO_LARGE");
    } else {
        assert_eq!(put.status(), 413);
    }
    // A declared size above the limit is refused at the lease.
    let e = client
        .lease_node(&sp, &big_hash, LEASE, Some(5000))
        .await
        .unwrap_err();
    assert_eq!(
        (e.status(), api_code(&e).as_str()),
        (Some(413), "PAYLOAD_TOO_LARGE")
    );
    let usage = client.usage(&sp).await?;
    assert_eq!(usage.node_count, 1);
    Ok(())
}

async fn upload_urls_are_write_once_and_signed(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_UPLOAD_URL_TTL_MS", 1500);
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    let (h, bytes) = leaf(b"write once");
    let small = Some(bytes.len() as u64);
    let LeaseResponse::AwaitingUpload { upload, .. } =
        client.lease_node(&sp, &h, LEASE, small).await?
    else {
        panic!()
    };
    assert!(
        upload.url.starts_with(&server.url),
        "a small upload goes through the service"
    );
    // Tampered signature, tampered hash.
    let mut tampered = upload.clone();
    let last = tampered.url.pop().unwrap();
    tampered.url.push(if last == '0' { '1' } else { '0' });
    assert_eq!(put_raw(&tampered, bytes.to_vec()).await.status(), 403);
    let mut other_hash = upload.clone();
    other_hash.url = other_hash
        .url
        .replace(&h.to_string(), &Hash::digest(b"x").to_string());
    assert_eq!(put_raw(&other_hash, bytes.to_vec()).await.status(), 403);
    // Headers are required.
    let r = http().put(&upload.url).body(bytes.to_vec()).send().await?;
    assert_eq!(r.status(), 415);
    let r = http()
        .put(&upload.url)
        .header("content-type", cas_format::NODE_MEDIA_TYPE)
        .body(bytes.to_vec())
        .send()
        .await?;
    assert_eq!(r.status(), 428);
    // First PUT stores, second is refused.
    assert_eq!(put_raw(&upload, bytes.to_vec()).await.status(), 200);
    let second = put_raw(&upload, b"something else".to_vec()).await;
    assert_eq!(second.status(), 412);
    assert_eq!(
        second.json::<serde_json::Value>().await?["error"],
        "UPLOAD_ALREADY_STORED"
    );
    assert!(matches!(
        client.lease_node(&sp, &h, LEASE, small).await?,
        LeaseResponse::Ready { .. }
    ));
    // Still refused after publication.
    assert_eq!(put_raw(&upload, bytes.to_vec()).await.status(), 412);
    // An expired URL.
    let (h2, bytes2) = leaf(b"too late");
    let LeaseResponse::AwaitingUpload { upload, .. } = client
        .lease_node(&sp, &h2, LEASE, Some(bytes2.len() as u64))
        .await?
    else {
        panic!()
    };
    tokio::time::sleep(std::time::Duration::from_millis(1700)).await;
    let r = put_raw(&upload, bytes2.to_vec()).await;
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.json::<serde_json::Value>().await?["error"],
        "UPLOAD_URL_EXPIRED"
    );
    Ok(())
}

async fn usage_matches_a_recount(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    for i in 0..5u8 {
        let (h, bytes) = leaf(&vec![i; 100 * (i as usize + 1)]);
        client.ensure_node(&sp, &h, &bytes, LEASE).await?;
    }
    let usage: Usage = client.usage(&sp).await?;
    assert_eq!(usage.node_count, 5);
    assert_eq!(usage.ready_content_bytes, 1500);
    let db = env.database().await?;
    use sqlx::Row;
    let row = sqlx::query("SELECT COUNT(*) AS n, CAST(COALESCE(SUM(size), 0) AS BIGINT) AS s FROM nodes WHERE app_id = 'hub' AND space_id = 's'")
        .fetch_one(&db)
        .await?;
    assert_eq!(row.try_get::<i64, _>("n")?, usage.node_count);
    assert_eq!(row.try_get::<i64, _>("s")?, usage.ready_content_bytes);
    Ok(())
}

/// A node with more refs than one statement names (the operator raised the limit): every
/// edge is kept, in order, and counted on its child.
async fn wide_nodes_keep_every_edge(b: Backend) -> anyhow::Result<()> {
    const DISTINCT: usize = 1100;
    const REFS: usize = 14_000;
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_NODE_MAX_REFS", REFS as u64);
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    let leaves: Vec<(Hash, bytes::Bytes)> = (0..DISTINCT as u32)
        .map(|i| leaf(&i.to_le_bytes()))
        .collect();
    for group in leaves.chunks(50) {
        let mut uploads = tokio::task::JoinSet::new();
        for (h, bytes) in group {
            let (client, sp, h, bytes) = (client.clone(), sp.clone(), *h, bytes.clone());
            uploads.spawn(async move { client.ensure_node(&sp, &h, &bytes, LEASE).await });
        }
        while let Some(done) = uploads.join_next().await {
            done??;
        }
    }
    let refs: Vec<Hash> = (0..REFS).map(|i| leaves[i % DISTINCT].0).collect();
    let (parent, bytes) = node("application/x-test", &refs, b"wide");
    client.ensure_node(&sp, &parent, &bytes, LEASE).await?;
    for k in [0, 299, 300, DISTINCT - 1] {
        let expected = (0..REFS).filter(|i| i % DISTINCT == k).count() as i64;
        let state = client.read_metadata(&sp, &leaves[k].0).await?.state;
        assert_eq!(state.child_ref_count, expected, "child {k}");
    }
    let db = env.database().await?;
    use sqlx::Row;
    let row = sqlx::query(
        "SELECT COUNT(*) AS n, MIN(ord) AS lo, MAX(ord) AS hi FROM edges \
         WHERE app_id = 'hub' AND space_id = 's'",
    )
    .fetch_one(&db)
    .await?;
    assert_eq!(row.try_get::<i64, _>("n")?, REFS as i64);
    assert_eq!(row.try_get::<i64, _>("lo")?, 0);
    assert_eq!(row.try_get::<i64, _>("hi")?, REFS as i64 - 1);
    // fsck recounts every child's count from the edges.
    env.assert_consistent("hub")?;
    Ok(())
}

/// Compression at rest: stored bytes shrink, readers (whole and ranges) see the content.
async fn compression_at_rest(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_COMPRESS_MIN_BYTES", 4096);
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    let text_of = |len: usize| -> Vec<u8> {
        let line = b"the quick brown fox jumps over the lazy dog\n";
        (0..len).map(|i| line[i % line.len()]).collect()
    };
    let text = text_of(200_000);
    let (h, bytes) = leaf(&text);
    client.ensure_node(&sp, &h, &bytes, LEASE).await?;
    // Incompressible and small nodes stay as they are.
    let noise: Vec<u8> = (0..50_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let (n, n_bytes) = leaf(&noise);
    client.ensure_node(&sp, &n, &n_bytes, LEASE).await?;
    let (small, small_bytes) = leaf(b"small");
    client.ensure_node(&sp, &small, &small_bytes, LEASE).await?;
    let usage = client.usage(&sp).await?;
    assert_eq!(
        usage.ready_content_bytes,
        (text.len() + noise.len() + 5) as i64
    );
    assert!(
        usage.ready_stored_bytes < usage.ready_content_bytes / 2,
        "stored {} of {}",
        usage.ready_stored_bytes,
        usage.ready_content_bytes
    );
    assert_eq!(&client.read_node(&sp, &h).await?[..], &text[..]);
    for (start, end) in [(0u64, 10u64), (100_000, 100_500), (199_990, 200_000)] {
        let got = client.read_content(&sp, &h, Some(start..end)).await?;
        assert_eq!(
            &got[..],
            &text[start as usize..end as usize],
            "{start}..{end}"
        );
    }
    assert_eq!(&client.read_node(&sp, &n).await?[..], &noise[..]);
    // Larger content is compressed only when a sample spread over it compresses: text is, noise
    // is stored as it is (an adopted upload with its header), in memory (to 4 MiB) or streamed.
    let mut stored = client.usage(&sp).await?.ready_stored_bytes;
    for (len, compressible) in [1usize << 20, 5 << 20]
        .map(|l| [(l, true), (l, false)])
        .concat()
    {
        let mut content = text_of(len);
        if !compressible {
            rand::RngCore::fill_bytes(&mut rand::rng(), &mut content);
        }
        let (h, bytes) = leaf(&content);
        client.ensure_node(&sp, &h, &bytes, LEASE).await?;
        let now = client.usage(&sp).await?.ready_stored_bytes;
        let grew = (now - stored) as usize;
        stored = now;
        match compressible {
            true => assert!(grew < len / 2, "{len} bytes of text stored as {grew}"),
            false => assert!((len..len + 64).contains(&grew), "noise stored as {grew}"),
        }
        assert_eq!(&client.read_node(&sp, &h).await?[..], &content[..]);
    }
    // fsck reads every object back through decompression and checks its hash.
    env.assert_consistent("hub")?;
    Ok(())
}

e2e!(
    compression_at_rest,
    upload_flow,
    svalue_nodes,
    range_reads,
    upload_rejections,
    upload_urls_are_write_once_and_signed,
    usage_matches_a_recount,
    wide_nodes_keep_every_edge,
);
