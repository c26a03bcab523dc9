//! The data plane end to end: upload flows, reads, rejections, upload URLs, root refs, usage.

use std::collections::BTreeMap;

use cas_client::{ClientError, Ensured};
use cas_format::wire::{LeaseResponse, RootRefPage, Usage};
use cas_format::{Hash, Value};
use serde_json::json;
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

async fn root_refs(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let (sa, sb) = (space("a"), space("b"));
    let (x, xb) = leaf(b"x");
    let (y, yb) = leaf(b"y");
    for s in [&sa, &sb] {
        client.ensure_node(s, &x, &xb, LEASE).await?;
        client.ensure_node(s, &y, &yb, LEASE).await?;
    }
    let rid = |s: &str| s.parse::<cas_format::RequestId>().unwrap();

    let r1 = client
        .update_root_refs(
            &sa,
            &rid("doc:1:version:1:add-refs"),
            BTreeMap::from([(x, 2), (y, 1)]),
        )
        .await?;
    assert!(r1.success && !r1.idempotent);
    assert_eq!(r1.revision, 1);
    // App-global revisions: another Space takes the next one.
    let r2 = client
        .update_root_refs(
            &sb,
            &rid("doc:1:version:1:add-refs"),
            BTreeMap::from([(x, 1)]),
        )
        .await?;
    assert_eq!((r2.revision, r2.idempotent), (2, false));
    // Replay: same revision, idempotent, nothing applied twice.
    let replay = client
        .update_root_refs(
            &sa,
            &rid("doc:1:version:1:add-refs"),
            BTreeMap::from([(x, 2), (y, 1)]),
        )
        .await?;
    assert_eq!((replay.revision, replay.idempotent), (1, true));
    assert_eq!(client.read_metadata(&sa, &x).await?.state.root_ref_count, 2);

    let balances = |page: &RootRefPage| -> BTreeMap<Hash, i64> {
        page.items.iter().map(|i| (i.hash, i.ref_count)).collect()
    };
    let before = client.list_root_refs(&sa, 100, None).await?;
    assert_eq!(before.revision, 2);
    assert_eq!(balances(&before), BTreeMap::from([(x, 2), (y, 1)]));

    // Every refusal is all-or-nothing: x is valid in each batch and must stay at 2.
    let unknown = Hash::digest(b"unknown");
    let cases: Vec<(BTreeMap<Hash, i64>, u16, &str)> = vec![
        (
            BTreeMap::from([(x, 1), (y, 5)]),
            409,
            "IDEMPOTENCY_CONFLICT",
        ),
        (
            BTreeMap::from([(x, 1), (unknown, 1)]),
            404,
            "NODE_NOT_FOUND",
        ),
        (BTreeMap::from([(x, 1), (y, -2)]), 409, "NEGATIVE_AGGREGATE"),
        (BTreeMap::from([(x, 1), (y, 0)]), 400, "INVALID_REQUEST"),
        (
            BTreeMap::from([(x, 1), (y, 1_000_001)]),
            400,
            "INVALID_REQUEST",
        ),
        (BTreeMap::new(), 400, "INVALID_REQUEST"),
        (
            (0..1001u32)
                .map(|i| (Hash::digest(&i.to_le_bytes()), 1))
                .collect(),
            413,
            "PAYLOAD_TOO_LARGE",
        ),
    ];
    for (i, (changes, status, code)) in cases.into_iter().enumerate() {
        let id = if code == "IDEMPOTENCY_CONFLICT" {
            rid("doc:1:version:1:add-refs")
        } else {
            rid(&format!("bad:{i}"))
        };
        let e = client
            .update_root_refs(&sa, &id, changes)
            .await
            .unwrap_err();
        assert_eq!(
            (e.status(), api_code(&e).as_str()),
            (Some(status), code),
            "{e}"
        );
    }
    // Overflow: a count at the edge of the JSON-safe range, set directly in the database.
    let db = env.database().await?;
    sqlx::query("UPDATE nodes SET root_ref_count = $1 WHERE app_id = 'hub' AND space_id = 'b' AND hash = $2")
        .bind((1i64 << 53) - 2)
        .bind(y.as_bytes().to_vec())
        .execute(&db)
        .await?;
    let e = client
        .update_root_refs(&sb, &rid("overflow"), BTreeMap::from([(x, 1), (y, 2)]))
        .await
        .unwrap_err();
    assert_eq!(api_code(&e), "NODE_CONFLICT");
    let after = client.list_root_refs(&sa, 100, None).await?;
    assert_eq!(after.revision, 2, "no refused update took a revision");
    assert_eq!(balances(&after), balances(&before));
    assert_eq!(client.read_metadata(&sb, &x).await?.state.root_ref_count, 1);

    // Removing to zero drops the balance row.
    let r = client
        .update_root_refs(
            &sa,
            &rid("doc:1:truncate:1-1:remove-refs"),
            BTreeMap::from([(y, -1)]),
        )
        .await?;
    assert_eq!(r.revision, 3);
    assert_eq!(
        balances(&client.list_root_refs(&sa, 100, None).await?),
        BTreeMap::from([(x, 2)])
    );

    // Raw HTTP: bad bodies.
    let token = app.token(&sa, &["cas:root-refs:update"]);
    for body in [
        "not json".to_string(),
        json!({"requestId": "has space", "changes": {x.to_string(): 1}}).to_string(),
        json!({"requestId": "", "changes": {x.to_string(): 1}}).to_string(),
        json!({"requestId": "ok", "changes": {x.to_string(): 1.5}}).to_string(),
        json!({"requestId": "ok", "changes": {"ABC": 1}}).to_string(),
        format!("{{\"requestId\":\"ok\",\"changes\":{{\"{x}\":1,\"{x}\":2}}}}"),
    ] {
        let r = http()
            .post(format!("{}/v1/cas/root-refs", server.url))
            .query(&[("appId", "hub"), ("spaceId", "a")])
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await?;
        assert_eq!(r.status(), 400, "{body}");
        assert_eq!(
            r.json::<serde_json::Value>().await?["error"],
            "INVALID_REQUEST"
        );
    }
    // Fields this service does not know are ignored, as the public contract allows.
    let r = http()
        .post(format!("{}/v1/cas/root-refs", server.url))
        .query(&[("appId", "hub"), ("spaceId", "a")])
        .bearer_auth(&token)
        .json(&json!({"requestId": "extra", "changes": {x.to_string(): 1}, "extra": 1}))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<serde_json::Value>().await?["success"], true);
    Ok(())
}

/// Browser clients: the data plane answers CORS preflights from the allowed origins and
/// exposes the headers a client reads; the admin plane answers none. Lease bodies accept
/// unknown fields and refuse a zero duration.
async fn browser_clients_and_lenient_bodies(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let sp = space("s");
    let (h, bytes) = leaf(b"read from a page");
    let preflight = |server: &Server, path: &str, origin: &'static str| {
        http()
            .request(reqwest::Method::OPTIONS, format!("{}{path}", server.url))
            .header("origin", origin)
            .header("access-control-request-method", "GET")
            .header("access-control-request-headers", "authorization, range")
            .send()
    };
    let node_path = format!("/v1/cas/nodes/{h}?appId=hub&spaceId=s");
    {
        let server = env.start()?;
        let client = app.client(&server);
        client.ensure_node(&sp, &h, &bytes, LEASE).await?;
        let r = preflight(&server, &node_path, "https://pages.example").await?;
        assert!(r.status().is_success(), "{}", r.status());
        assert_eq!(r.headers()["access-control-allow-origin"], "*");
        let allowed = r.headers()["access-control-allow-headers"]
            .to_str()?
            .to_lowercase();
        assert!(
            allowed.contains("authorization") && allowed.contains("range"),
            "{allowed}"
        );
        assert!(
            r.headers()
                .get("access-control-allow-credentials")
                .is_none()
        );
        let r = http()
            .get(format!("{}{node_path}", server.url))
            .header("origin", "https://pages.example")
            .bearer_auth(app.token(&sp, &["cas:nodes:read"]))
            .send()
            .await?;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["access-control-allow-origin"], "*");
        let exposed = r.headers()["access-control-expose-headers"]
            .to_str()?
            .to_lowercase();
        assert!(
            exposed.contains("x-cas-refs") && exposed.contains("content-range"),
            "{exposed}"
        );
        // The admin plane (cookies) and the operations routes (no capability) never answer
        // cross-origin.
        for path in ["/admin/session", "/healthz", "/metrics"] {
            let r = preflight(&server, path, "https://pages.example").await?;
            assert!(
                r.headers().get("access-control-allow-origin").is_none(),
                "{path}"
            );
            let r = http()
                .get(format!("{}{path}", server.url))
                .header("origin", "https://pages.example")
                .send()
                .await?;
            assert!(
                r.headers().get("access-control-allow-origin").is_none(),
                "{path}"
            );
        }

        let lease = |body: serde_json::Value| {
            http()
                .post(format!("{}/v1/cas/nodes/{h}/lease", server.url))
                .query(&[("appId", "hub"), ("spaceId", "s")])
                .bearer_auth(app.token(&sp, &["cas:nodes:lease"]))
                .json(&body)
                .send()
        };
        let r = lease(json!({"leaseDurationMs": 60_000, "clientHint": "x"})).await?;
        assert_eq!(r.status(), 200);
        assert_eq!(r.json::<serde_json::Value>().await?["state"], "ready");
        let r = lease(json!({"leaseDurationMs": 0})).await?;
        assert_eq!(r.status(), 400);
        assert_eq!(
            r.json::<serde_json::Value>().await?["error"],
            "INVALID_REQUEST"
        );
    }
    // Only the listed origins.
    let server = env.start_with(&[("UNICAS_CORS_ORIGINS", "https://a.example")])?;
    let r = preflight(&server, &node_path, "https://a.example").await?;
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://a.example"
    );
    let r = preflight(&server, &node_path, "https://b.example").await?;
    assert!(r.headers().get("access-control-allow-origin").is_none());
    Ok(())
}

async fn root_ref_pages_are_stable(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    let mut hashes = Vec::new();
    for i in 0..7u8 {
        let (h, bytes) = leaf(&[i; 3]);
        client.ensure_node(&sp, &h, &bytes, LEASE).await?;
        hashes.push(h);
    }
    let all: BTreeMap<Hash, i64> = hashes.iter().map(|h| (*h, 1)).collect();
    let rid = |s: &str| s.parse::<cas_format::RequestId>().unwrap();
    client
        .update_root_refs(&sp, &rid("add"), all.clone())
        .await?;
    let first = client.list_root_refs(&sp, 3, None).await?;
    assert_eq!(first.items.len(), 3);
    let cursor = first.next_cursor.clone().expect("more pages");
    // The balances change after the first page was read.
    client
        .update_root_refs(
            &sp,
            &rid("change"),
            hashes.iter().map(|h| (*h, 1)).collect(),
        )
        .await?;
    let mut seen: BTreeMap<Hash, i64> = first.items.iter().map(|i| (i.hash, i.ref_count)).collect();
    let mut next = Some(cursor);
    while let Some(c) = next {
        let page = client.list_root_refs(&sp, 3, Some(&c)).await?;
        assert_eq!(
            page.revision, first.revision,
            "every page at the first page's revision"
        );
        seen.extend(page.items.iter().map(|i| (i.hash, i.ref_count)));
        next = page.next_cursor;
    }
    assert_eq!(
        seen, all,
        "the pages show the balances as of the first page"
    );
    let now = client.list_root_refs(&sp, 200, None).await?;
    assert!(now.items.iter().all(|i| i.ref_count == 2));
    assert!(now.next_cursor.is_none());
    // A cursor from the future is refused.
    let e = client
        .list_root_refs(&sp, 3, Some(&format!("999.{}", hashes[0])))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(400));
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

/// Compression at rest: stored bytes shrink, readers (whole and ranges) see the content.
async fn compression_at_rest(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_COMPRESS_MIN_BYTES", 4096);
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    let text: Vec<u8> = (0..200_000u32)
        .map(|i| b"the quick brown fox jumps over the lazy dog\n"[(i % 44) as usize])
        .collect();
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
    root_refs,
    root_ref_pages_are_stable,
    usage_matches_a_recount,
    browser_clients_and_lenient_bodies,
);
