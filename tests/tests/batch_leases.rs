//! `POST /v1/cas/leases`: many leases in one request, small nodes inline, one answer per
//! element in order, and one bad element failing alone.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use cas_format::Hash;
use cas_format::wire::{BatchLeaseElement, BatchLeaseResult, LeaseResponse};
use serde_json::{Value, json};
use tests::*;

const LEASE: u64 = 600_000;

fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

fn inline(hash: Hash, portable: &[u8]) -> BatchLeaseElement {
    BatchLeaseElement {
        hash,
        lease_duration_ms: LEASE,
        upload_bytes: None,
        content: Some(b64(portable)),
        content_bytes: None,
        delta_base: None,
    }
}

fn plain(hash: Hash, upload_bytes: Option<u64>) -> BatchLeaseElement {
    BatchLeaseElement {
        hash,
        lease_duration_ms: LEASE,
        upload_bytes,
        content: None,
        content_bytes: None,
        delta_base: None,
    }
}

fn ready(r: &BatchLeaseResult) -> bool {
    matches!(r, BatchLeaseResult::Lease(LeaseResponse::Ready { .. }))
}

/// 300 small new nodes stored by one request, read back; a parent stored inline with its
/// children in the same batch is published once they are.
async fn small_nodes_in_one_request(b: Backend) -> anyhow::Result<()> {
    small_nodes(TestEnv::new(b).await?).await
}

/// The same with every node an object of its own (none held in its row): the objects of a
/// group are written together.
async fn small_nodes_as_objects_in_one_request(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_HOLD_MAX_BYTES", 0);
    small_nodes(env).await
}

async fn small_nodes(env: TestEnv) -> anyhow::Result<()> {
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    let nodes: Vec<(Hash, bytes::Bytes, Vec<u8>)> = (0..300u32)
        .map(|i| {
            let content = format!("small node {i}")
                .repeat(1 + i as usize % 40)
                .into_bytes();
            let (h, portable) = leaf(&content);
            (h, portable, content)
        })
        .collect();
    let results = client
        .lease_batch(&sp, nodes.iter().map(|(h, p, _)| inline(*h, p)).collect())
        .await?;
    assert_eq!(results.len(), nodes.len());
    for ((h, _, _), r) in nodes.iter().zip(&results) {
        let BatchLeaseResult::Lease(LeaseResponse::Ready { hash, .. }) = r else {
            panic!("{h}: {r:?}");
        };
        assert_eq!(hash, h, "results are in the request's order");
    }
    for (h, _, content) in &nodes {
        assert_eq!(&client.read_node(&sp, h).await?[..], &content[..]);
    }
    assert_eq!(client.usage(&sp).await?.node_count, 300);
    // Leased again, without content: ready, nothing new stored.
    let again = client
        .lease_batch(&sp, nodes.iter().map(|(h, _, _)| plain(*h, None)).collect())
        .await?;
    assert!(again.iter().all(ready));
    assert_eq!(client.usage(&sp).await?.node_count, 300);

    // A parent and its two new children in one batch, the parent first.
    let (c1, c1_b) = leaf(b"child one");
    let (c2, c2_b) = leaf(b"child two");
    let (p, p_b) = node("application/x-test", &[c1, c2], b"parent");
    let results = client
        .lease_batch(
            &sp,
            vec![inline(p, &p_b), inline(c1, &c1_b), inline(c2, &c2_b)],
        )
        .await?;
    assert!(ready(&results[1]) && ready(&results[2]), "{results:?}");
    match &results[0] {
        BatchLeaseResult::Lease(LeaseResponse::Ready { .. }) => {}
        BatchLeaseResult::Lease(LeaseResponse::ValidatedAwaitingChildren { .. }) => {
            // Its bytes are kept: a lease without them publishes it now.
            let r = client.lease_batch(&sp, vec![plain(p, None)]).await?;
            assert!(ready(&r[0]), "{r:?}");
        }
        other => panic!("parent: {other:?}"),
    }
    assert_eq!(&client.read_node(&sp, &p).await?[..], b"parent");
    drop(server);
    env.assert_consistent("hub")?;
    env.check_invariants(&env.meta().await?, &app.app).await?;
    Ok(())
}

/// A tree of three levels in one group of inline nodes, parents first, a leaf shared by two
/// parents and listed twice: every node is published by the same request (children before
/// parents), each child counted once per edge; leased again inline for longer, every lease is
/// extended and kept.
async fn a_tree_in_one_group(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    let leaves: Vec<(Hash, bytes::Bytes)> = (0..5u8).map(|i| leaf(&[b'l', i])).collect();
    let (m1, m1_b) = node(
        "application/x-test",
        &[leaves[0].0, leaves[1].0, leaves[2].0],
        b"m1",
    );
    let (m2, m2_b) = node(
        "application/x-test",
        &[leaves[2].0, leaves[3].0, leaves[4].0],
        b"m2",
    );
    let (root, root_b) = node("application/x-test", &[m1, m2, m1], b"root");
    let mut elements = vec![inline(root, &root_b), inline(m2, &m2_b), inline(m1, &m1_b)];
    elements.extend(leaves.iter().map(|(h, p)| inline(*h, p)));
    elements.push(inline(leaves[2].0, &leaves[2].1));
    let results = client.lease_batch(&sp, elements.clone()).await?;
    assert!(results.iter().all(ready), "{results:?}");
    assert_eq!(client.usage(&sp).await?.node_count, 8);
    assert_eq!(&client.read_node(&sp, &root).await?[..], b"root");
    let meta = env.meta().await?;
    env.check_invariants(&meta, &app.app).await?;
    let longer = |e: &BatchLeaseElement| BatchLeaseElement {
        lease_duration_ms: 2 * LEASE,
        ..e.clone()
    };
    let expiry = |r: &BatchLeaseResult| match r {
        BatchLeaseResult::Lease(LeaseResponse::Ready {
            lease_expires_at, ..
        }) => *lease_expires_at,
        other => panic!("{other:?}"),
    };
    let before: Vec<i64> = results.iter().map(expiry).collect();
    let extended = client
        .lease_batch(&sp, elements.iter().map(longer).collect())
        .await?;
    let after: Vec<i64> = extended.iter().map(expiry).collect();
    for (b, a) in before.iter().zip(&after) {
        assert!(*a >= b + LEASE as i64 / 2, "extended: {before:?} {after:?}");
    }
    // Asked again, the running (longer) leases are what the rows hold.
    let again = client
        .lease_batch(&sp, elements.iter().map(longer).collect())
        .await?;
    assert_eq!(again.iter().map(expiry).collect::<Vec<_>>(), after);
    drop(server);
    env.assert_consistent("hub")?;
    env.check_invariants(&meta, &app.app).await?;
    Ok(())
}

/// The partition operations the server has committed so far.
async fn partition_operations(server: &Server) -> anyhow::Result<f64> {
    let scrape = reqwest::get(format!("{}/metrics", server.url))
        .await?
        .text()
        .await?;
    Ok(metric(&scrape, "unicas_commit_batch_operations_sum"))
}

/// Nodes first leased without their bytes (each answered `awaiting_upload`, as a client that
/// looks for what is missing is), then sent inline, are published together: a few partition
/// operations for all of them, not a few each, for the first leases as for the second. The URLs the first leases handed out are used
/// up: one that was used meanwhile leaves nothing behind that counts, the others refuse.
async fn leased_first_then_inline(b: Backend) -> anyhow::Result<()> {
    let (env, app, server, client, meta) = hub_app(b).await?;
    let sp = space("s");
    let leaves: Vec<(Hash, bytes::Bytes)> = (0..40u32)
        .map(|i| leaf(format!("leaf {i}").as_bytes()))
        .collect();
    let refs: Vec<Hash> = leaves.iter().map(|(h, _)| *h).collect();
    let (parent, parent_b) = node("application/x-test", &refs, b"parent");
    let mut all = leaves.clone();
    all.push((parent, parent_b));
    let start = partition_operations(&server).await?;
    let first = client
        .lease_batch(
            &sp,
            all.iter()
                .map(|(h, b)| plain(*h, Some(b.len() as u64)))
                .collect(),
        )
        .await?;
    let operations = partition_operations(&server).await? - start;
    assert!(
        operations <= 2.0,
        "{operations} partition operations to find 41 nodes missing: they went one by one"
    );
    let targets: Vec<cas_format::wire::UploadTarget> = first
        .iter()
        .map(|r| match r {
            BatchLeaseResult::Lease(LeaseResponse::AwaitingUpload { upload, .. }) => upload.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    // One of them uploaded through its URL before the inline bytes arrive.
    client.upload(&targets[1], leaves[1].1.clone()).await?;
    let before = partition_operations(&server).await?;
    let results = client
        .lease_batch(&sp, all.iter().map(|(h, b)| inline(*h, b)).collect())
        .await?;
    assert!(results.iter().all(ready), "{results:?}");
    let operations = partition_operations(&server).await? - before;
    assert!(
        operations <= 4.0,
        "{operations} partition operations for 41 inline nodes: they went one by one"
    );
    assert_eq!(client.usage(&sp).await?.node_count, 41);
    assert_eq!(&client.read_node(&sp, &parent).await?[..], b"parent");
    let mut late = reqwest::Client::new()
        .put(&targets[0].url)
        .body(leaves[0].1.to_vec());
    for (k, v) in &targets[0].headers {
        late = late.header(k, v);
    }
    assert_eq!(late.send().await?.status(), 412);
    // Leased again without bytes, for longer: every lease is extended, together.
    let start = partition_operations(&server).await?;
    let longer = client
        .lease_batch(
            &sp,
            all.iter()
                .map(|(h, _)| BatchLeaseElement {
                    lease_duration_ms: 2 * LEASE,
                    ..plain(*h, None)
                })
                .collect(),
        )
        .await?;
    assert!(longer.iter().all(ready), "{longer:?}");
    assert!(partition_operations(&server).await? - start <= 2.0);
    for (r, was) in longer.iter().zip(&results) {
        let expiry = |r: &BatchLeaseResult| match r {
            BatchLeaseResult::Lease(LeaseResponse::Ready {
                lease_expires_at, ..
            }) => *lease_expires_at,
            other => panic!("{other:?}"),
        };
        assert!(expiry(r) >= expiry(was) + LEASE as i64 / 2, "{r:?} {was:?}");
    }
    env.check_invariants(&meta, &app.app).await?;
    let usage = client.usage(&sp).await?;
    assert_eq!(usage.reserved_bytes, 0, "{usage:?}");
    drop(server);
    env.assert_consistent("hub")?;
    Ok(())
}

/// An inline node whose object could not be written leaves its generation validated with no
/// bytes anywhere: the next lease replaces it, and the node is stored the usual way.
async fn an_unwritten_inline_node_is_stored_again(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    // Every node an object (none held in its row), and every object write refused.
    env.set("UNICAS_HOLD_MAX_BYTES", 0);
    let app = env.create_app("hub")?;
    let sp = space("s");
    let (h, bytes) = leaf(b"its object is refused");
    let server = env.start_with(&[("UNICAS_FAILPOINTS", "blob.put=error")])?;
    let client = app.client(&server);
    let first = client
        .lease_batch(&sp, vec![plain(h, Some(bytes.len() as u64))])
        .await?;
    assert!(matches!(
        &first[0],
        BatchLeaseResult::Lease(LeaseResponse::AwaitingUpload { .. })
    ));
    let refused = client.lease_batch(&sp, vec![inline(h, &bytes)]).await?;
    assert!(
        matches!(&refused[0], BatchLeaseResult::Error(e) if e.error == "STORAGE_ERROR"),
        "{refused:?}"
    );
    drop(server);
    let server = env.start()?;
    let client = app.client(&server);
    client.ensure_node(&sp, &h, &bytes, LEASE).await?;
    assert_eq!(
        &client.read_node(&sp, &h).await?[..],
        b"its object is refused"
    );
    env.check_invariants(&env.meta().await?, &app.app).await?;
    drop(server);
    env.assert_consistent("hub")?;
    Ok(())
}

/// Every kind of bad element in one batch beside good ones: each bad one gets its own error,
/// the good ones are stored, and nothing of the bad ones is.
async fn one_bad_element_fails_alone(b: Backend) -> anyhow::Result<()> {
    bad_elements(b, false).await
}

/// As [`one_bad_element_fails_alone`], the nodes raw in a binary body (where base64 has no
/// place: that is refused whole, below).
async fn one_bad_element_fails_alone_in_a_binary_body(b: Backend) -> anyhow::Result<()> {
    bad_elements(b, true).await
}

/// Elements of the JSON form as the binary form carries them.
fn raw(elements: Vec<BatchLeaseElement>) -> Vec<(BatchLeaseElement, Option<bytes::Bytes>)> {
    let decode = |c: String| bytes::Bytes::from(STANDARD.decode(c).expect("base64"));
    elements
        .into_iter()
        .map(|mut e| {
            let node = e.content.take().map(decode);
            (e, node)
        })
        .collect()
}

async fn bad_elements(b: Backend, binary: bool) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    let (good1, good1_b) = leaf(b"good one");
    let (good2, good2_b) = leaf(b"good two");
    let (other, _) = leaf(b"another node");
    let (big, big_b) = leaf(&vec![7u8; 300 * 1024]);
    let (later, _) = leaf(b"uploaded the usual way");
    let mut bad_base64 = inline(other, b"x");
    bad_base64.content = Some("not base64!".into());
    let mut elements = vec![
        inline(good1, &good1_b),
        inline(other, &good2_b), // content of another hash
        bad_base64,
        inline(big, &big_b),         // over 256 KiB inline
        plain(later, Some(1 << 40)), // declares more than a node may hold
        plain(later, Some(30)),
        inline(good2, &good2_b),
    ];
    let mut expected = vec![
        "ready",
        "NODE_DIGEST_MISMATCH",
        "INVALID_REQUEST",
        "PAYLOAD_TOO_LARGE",
        "PAYLOAD_TOO_LARGE",
        "awaiting_upload",
        "ready",
    ];
    let results = if binary {
        elements.remove(2);
        expected.remove(2);
        client.lease_batch_raw(&sp, raw(elements)).await?
    } else {
        client.lease_batch(&sp, elements).await?
    };
    let code = |r: &BatchLeaseResult| match r {
        BatchLeaseResult::Error(e) => e.error.clone(),
        BatchLeaseResult::Lease(l) => l.state().to_string(),
    };
    let codes: Vec<String> = results.iter().map(code).collect();
    assert_eq!(codes, expected, "{results:?}");
    let usage = client.usage(&sp).await?;
    assert_eq!(usage.node_count, 2, "only the good nodes are stored");
    assert!(client.read_node(&sp, &other).await.is_err());
    assert!(client.read_node(&sp, &big).await.is_err());
    drop(server);
    env.assert_consistent("hub")?;
    Ok(())
}

/// A server of App `hub` (dropped before what it runs on) and what raw requests to its batch
/// route need: its URL and a capability to lease in Space `s`.
struct Route {
    server: Server,
    _env: TestEnv,
    app: TestApp,
    url: String,
    lease: String,
    http: reqwest::Client,
}

impl Route {
    async fn new(b: Backend) -> anyhow::Result<Route> {
        let env = TestEnv::new(b).await?;
        let app = env.create_app("hub")?;
        let server = env.start()?;
        let url = format!("{}/v1/cas/leases", server.url);
        let lease = app.token(&space("s"), &["cas:nodes:lease"]);
        Ok(Route {
            _env: env,
            server,
            app,
            url,
            lease,
            http: reqwest::Client::new(),
        })
    }

    /// A POST of `body`, as `media_type`, to the batch route of Space `space`, with `token`.
    fn post(
        &self,
        space: &str,
        media_type: &str,
        token: Option<&str>,
        body: Vec<u8>,
    ) -> reqwest::RequestBuilder {
        let req = self
            .http
            .post(&self.url)
            .query(&[("appId", "hub"), ("spaceId", space)])
            .header("content-type", media_type)
            .body(body);
        match token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }
}

/// A batch as a whole: empty, too many elements, too large a body, no or a wrong capability.
async fn whole_batches_are_refused_clearly(b: Backend) -> anyhow::Result<()> {
    let r = Route::new(b).await?;
    let (sp, lease) = (&space("s"), r.lease.as_str());
    let post =
        |token: Option<&str>, body: Vec<u8>| r.post("s", "application/json", token, body).send();
    let element =
        |i: u32| json!({"hash": leaf(&i.to_le_bytes()).0.to_string(), "leaseDurationMs": LEASE});
    let error = |v: Value| v["error"].as_str().unwrap_or_default().to_string();
    let answer = post(Some(lease), serde_json::to_vec(&json!({"leases": []}))?).await?;
    assert_eq!(answer.status(), 400);
    let many: Vec<Value> = (0..1001).map(element).collect();
    let answer = post(Some(lease), serde_json::to_vec(&json!({"leases": many}))?).await?;
    assert_eq!(answer.status(), 413);
    assert_eq!(error(answer.json().await?), "PAYLOAD_TOO_LARGE");
    let huge = json!({"leases": [{"hash": leaf(b"x").0.to_string(), "leaseDurationMs": LEASE,
        "content": "A".repeat(17 << 20)}]});
    // Refused at 16 MiB: the answer is 413, unless the server closed the connection on the
    // rest of the body before the client read it.
    // (A client of its own: that connection is not reused.)
    let sent = reqwest::Client::new()
        .post(&r.url)
        .query(&[("appId", "hub"), ("spaceId", "s")])
        .bearer_auth(lease)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&huge)?)
        .send()
        .await;
    if let Ok(answer) = sent {
        assert_eq!(answer.status(), 413);
    }
    let one = serde_json::to_vec(&json!({"leases": [element(1)]}))?;
    assert_eq!(post(None, one.clone()).await?.status(), 401);
    // A capability for Space `s` leases nothing in another Space.
    let elsewhere = r
        .post("other", "application/json", Some(lease), one.clone())
        .send()
        .await?;
    assert_eq!(elsewhere.status(), 403);
    let read_only = r.app.token(sp, &["cas:nodes:read"]);
    assert_eq!(post(Some(&read_only), one.clone()).await?.status(), 403);
    let unknown = serde_json::to_vec(&json!({"leases": [element(1)], "extra": 1}))?;
    assert_eq!(post(Some(lease), unknown).await?.status(), 400);
    let answer = post(Some(lease), one).await?;
    assert_eq!(answer.status(), 200);
    let v: Value = answer.json().await?;
    assert_eq!(v["results"][0]["state"], "awaiting_upload");
    let usage = r.app.client(&r.server).usage(sp).await?;
    assert_eq!(usage.node_count, 0);
    Ok(())
}

/// A binary body whose framing does not hold (its JSON's length, the lengths its elements
/// name against the bytes that follow, base64 where raw bytes belong) is refused whole with a
/// 400 that says why, and stores nothing; the same elements framed right are stored.
async fn binary_bodies_whose_lengths_lie_are_refused_whole(b: Backend) -> anyhow::Result<()> {
    let route = Route::new(b).await?;
    let sp = &space("s");
    let post = |media_type: &str, body: Vec<u8>| {
        route.post("s", media_type, Some(&route.lease), body).send()
    };
    const BINARY: &str = cas_format::wire::BATCH_LEASE_BINARY;
    let (h1, n1) = leaf(b"first node");
    let (h2, n2) = leaf(b"second node, longer");
    let element = |h: Hash, content_bytes: Value| json!({"hash": h.to_string(), "leaseDurationMs": LEASE, "contentBytes": content_bytes});
    let framed = |leases: Vec<Value>, tail: &[u8]| {
        let json = serde_json::to_vec(&json!({ "leases": leases })).expect("JSON");
        let mut body = (json.len() as u32).to_be_bytes().to_vec();
        body.extend_from_slice(&json);
        body.extend_from_slice(tail);
        body
    };
    let both: Vec<u8> = [&n1[..], &n2[..]].concat();
    let (l1, l2) = (n1.len() as u64, n2.len() as u64);
    let named = |a: u64, b: u64| vec![element(h1, json!(a)), element(h2, json!(b))];
    let mut said_too_long = framed(named(l1, l2), &both);
    said_too_long[..4].copy_from_slice(&1000u32.to_be_bytes());
    let mut with_base64 = element(h1, Value::Null);
    with_base64["content"] = json!(b64(&n1));
    let cases: Vec<(&str, Vec<u8>, String)> = vec![
        (BINARY, vec![0, 0], "starts with its JSON's length".into()),
        (BINARY, said_too_long, "is said to be 1000 bytes".into()),
        (
            BINARY,
            framed(named(l1, l2), &both[1..]),
            format!(
                "element 1 names {l2} bytes of content where {} are left",
                l2 - 1
            ),
        ),
        (
            BINARY,
            framed(named(l1, l2), &[&both[..], b"!"].concat()),
            format!(
                "{} bytes follow the JSON of the body, but its elements name",
                l1 + l2 + 1
            ),
        ),
        (
            BINARY,
            framed(named(l1, u64::MAX), &both),
            format!("names {} bytes", u64::MAX),
        ),
        (
            BINARY,
            framed(vec![with_base64], &n1),
            "base64 content in a binary body".into(),
        ),
        (
            BINARY,
            framed(named(l1, 1).split_off(1), b"x"),
            String::new(),
        ),
        (
            "application/json",
            serde_json::to_vec(&json!({"leases": named(l1, l2)}))?,
            "only a body of type".into(),
        ),
        (
            BINARY,
            [&3u32.to_be_bytes()[..], b"{le"].concat(),
            "invalid JSON body".into(),
        ),
        (
            BINARY,
            framed(named(l1, 0), &both),
            "but its elements name".into(),
        ),
    ];
    for (i, (media_type, body, says)) in cases.into_iter().enumerate() {
        let r = post(media_type, body).await?;
        let status = r.status();
        let v: Value = r.json().await?;
        if says.is_empty() {
            // Framed right: an element whose bytes are not its node fails alone.
            assert_eq!(status, 200, "case {i}: {v}");
            assert_eq!(
                v["results"][0]["error"], "NODE_DIGEST_MISMATCH",
                "case {i}: {v}"
            );
            continue;
        }
        assert_eq!(status, 400, "case {i}: {v}");
        assert_eq!(v["error"], "INVALID_REQUEST", "case {i}: {v}");
        let message = v["message"].as_str().unwrap_or_default();
        assert!(message.contains(&says), "case {i}: {message}");
    }
    let client = route.app.client(&route.server);
    assert_eq!(client.usage(sp).await?.node_count, 0, "nothing was stored");
    let r = post(BINARY, framed(named(l1, l2), &both)).await?;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await?;
    assert_eq!(v["results"][0]["state"], "ready", "{v}");
    assert_eq!(v["results"][1]["state"], "ready", "{v}");
    assert_eq!(
        &client.read_node(sp, &h2).await?[..],
        b"second node, longer"
    );
    assert_eq!(client.usage(sp).await?.node_count, 2);
    Ok(())
}

e2e!(
    small_nodes_in_one_request,
    small_nodes_as_objects_in_one_request,
    a_tree_in_one_group,
    leased_first_then_inline,
    an_unwritten_inline_node_is_stored_again,
    one_bad_element_fails_alone,
    one_bad_element_fails_alone_in_a_binary_body,
    binary_bodies_whose_lengths_lie_are_refused_whole,
    whole_batches_are_refused_clearly,
);
