//! The public UniCAS Space API contract, operation by operation: every operation of the
//! upstream OpenAPI document is called as an upstream client calls it (a path Space, a
//! version 2 ES256 capability with selector grants and a `refDomain`, raw HTTP), and every
//! answer (status, headers, body) is checked against that document, including an error case
//! of every status code it lists.

use std::collections::BTreeSet;
use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::{Method, RequestBuilder};
use serde_json::{Value, json};
use tests::contract::Contract;
use tests::*;

const SPACE: &str = "/team/notes";

/// Sends a request of `operation`, checks its answer against the contract, and returns the
/// status and the JSON body (`Null` for node bytes) and the headers.
async fn call(
    contract: &Contract,
    operation: &str,
    request: RequestBuilder,
) -> anyhow::Result<(u16, Value, reqwest::header::HeaderMap)> {
    let r = request.send().await?;
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let body = r.bytes().await?;
    let value = contract.check(operation, status, &headers, &body)?;
    Ok((status, value, headers))
}

/// The requests of one server, as an upstream client makes them.
struct Upstream {
    web: reqwest::Client,
    base: String,
}

impl Upstream {
    fn req(&self, method: Method, path: &str, space: &str, token: Option<&str>) -> RequestBuilder {
        let r = self
            .web
            .request(method, format!("{}{path}", self.base))
            .query(&[("appId", "up"), ("spaceId", space)]);
        match token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Leases `hash` and, when asked to, uploads `bytes` to the target it names.
    async fn put_node(
        &self,
        contract: &Contract,
        token: &str,
        hash: cas_format::Hash,
        bytes: &[u8],
        lease_ms: u64,
    ) -> anyhow::Result<()> {
        let path = format!("/v1/cas/nodes/{hash}/lease");
        let lease = || {
            self.req(Method::POST, &path, SPACE, Some(token))
                .json(&json!({"leaseDurationMs": lease_ms}))
        };
        let (status, answer, _) = call(contract, "leaseNode", lease()).await?;
        anyhow::ensure!(status == 200, "{answer}");
        if answer["state"] == "awaiting_upload" {
            let mut put = self
                .web
                .put(answer["upload"]["url"].as_str().unwrap_or_default())
                .body(bytes.to_vec());
            for (k, v) in answer["upload"]["headers"]
                .as_object()
                .into_iter()
                .flatten()
            {
                put = put.header(k.as_str(), v.as_str().unwrap_or_default());
            }
            anyhow::ensure!(put.send().await?.status().is_success());
            let (status, answer, _) = call(contract, "leaseNode", lease()).await?;
            anyhow::ensure!(status == 200 && answer["state"] == "ready", "{answer}");
        }
        Ok(())
    }
}

async fn every_operation_answers_as_the_contract_says(b: Backend) -> anyhow::Result<()> {
    let contract = Contract::load()?;
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_JSON_BODY_LIMIT", 4096);
    let app = env.create_app_with("up", "ES256")?;
    let token = app.v2_token("/team/**", ALL_PERMISSIONS, Some("docs"));
    let t = Some(token.as_str());
    let (child, child_bytes) = leaf(b"the cell of a notebook");
    let (parent, parent_bytes) = node("text/markdown", &[child], b"# a notebook\n");
    let (stranger, _) = leaf(b"never stored");
    let content = |h: cas_format::Hash| format!("/v1/cas/nodes/{h}");
    let metadata = |h: cas_format::Hash| format!("/v1/cas/nodes/{h}/metadata");
    let lease = |h: cas_format::Hash| format!("/v1/cas/nodes/{h}/lease");
    let c = &contract;
    {
        let server = env.start()?;
        let up = Upstream {
            web: reqwest::Client::new(),
            base: server.url.clone(),
        };
        // Every operation's success.
        up.put_node(c, &token, child, &child_bytes, 600_000).await?;
        up.put_node(c, &token, parent, &parent_bytes, 600_000)
            .await?;
        let (s, _, h) = call(
            c,
            "readContent",
            up.req(Method::GET, &content(parent), SPACE, t),
        )
        .await?;
        assert_eq!(
            (s, h["x-cas-refs"].to_str()?),
            (200, child.to_hex().as_str())
        );
        let range = up
            .req(Method::GET, &content(parent), SPACE, t)
            .header("range", "bytes=0-1");
        assert_eq!(call(c, "readContent", range).await?.0, 206);
        let range = up
            .req(Method::GET, &content(parent), SPACE, t)
            .header("range", "bytes=100000-");
        assert_eq!(call(c, "readContent", range).await?.0, 416);
        let (s, m, _) = call(
            c,
            "readMetadata",
            up.req(Method::GET, &metadata(child), SPACE, t),
        )
        .await?;
        assert_eq!((s, m["state"]["childRefCount"].as_i64()), (200, Some(1)));
        let (s, u, _) = call(
            c,
            "getUsage",
            up.req(Method::GET, "/v1/cas/usage", SPACE, t),
        )
        .await?;
        assert_eq!((s, u["nodeCount"].as_i64()), (200, Some(2)));
        let update = |request_id: &str, changes: Value| {
            up.req(Method::POST, "/v1/cas/root-refs", SPACE, t)
                .json(&json!({"requestId": request_id, "changes": changes}))
        };
        let (s, r, _) = call(
            c,
            "updateRootRefs",
            update("add", json!({parent.to_hex(): 1})),
        )
        .await?;
        assert_eq!((s, r["idempotent"].as_bool()), (200, Some(false)));
        let (s, r, _) = call(
            c,
            "updateRootRefs",
            update("add", json!({parent.to_hex(): 1})),
        )
        .await?;
        assert_eq!((s, r["idempotent"].as_bool()), (200, Some(true)));
        let (s, page, _) = call(
            c,
            "listRootRefs",
            up.req(Method::GET, "/v1/cas/root-refs", SPACE, t),
        )
        .await?;
        assert_eq!((s, page["refDomain"].as_str()), (200, Some("docs")));
        assert_eq!(page["items"][0]["refCount"], 1);
        let gc = |body: Value| up.req(Method::POST, "/v1/cas/gc", SPACE, t).json(&body);
        assert_eq!(call(c, "runGc", gc(json!({"maxNodes": 10}))).await?.0, 200);

        // 400: requests the contract refuses.
        for (op, request) in [
            (
                "readContent",
                up.req(Method::GET, "/v1/cas/nodes/nothex", SPACE, t),
            ),
            (
                "readMetadata",
                up.req(Method::GET, "/v1/cas/nodes/ABC/metadata", SPACE, t),
            ),
            (
                "leaseNode",
                up.req(Method::POST, &lease(stranger), SPACE, t)
                    .json(&json!({"leaseDurationMs": 0})),
            ),
            (
                "getUsage",
                up.req(Method::GET, "/v1/cas/usage", "/not a space", t),
            ),
            ("runGc", gc(json!({"maxNodes": 0}))),
            (
                "listRootRefs",
                up.req(Method::GET, "/v1/cas/root-refs", SPACE, t)
                    .query(&[("limit", "0")]),
            ),
            ("updateRootRefs", update("empty", json!({}))),
        ] {
            let (s, e, _) = call(c, op, request).await?;
            assert_eq!(s, 400, "{op}: {e}");
        }

        // 401: no token, a token that does not verify, an issuer nobody registered.
        let stranger_key = TestKey::generate(env.dir.path(), "ES256")?;
        let outsider = TestApp {
            app: "up".parse()?,
            issuer: "https://issuer.test/nobody".into(),
            kid: "nobody-1".into(),
            key: stranger_key,
        };
        let unknown = outsider.v2_token("/team/**", ALL_PERMISSIONS, Some("docs"));
        let ops = contract.operations();
        for (token, code) in [
            (None, "missing_token"),
            (Some("not.a.token"), "invalid_token"),
            (Some(unknown.as_str()), "unknown_issuer"),
        ] {
            for (op, (method, path)) in &ops {
                let path = path.replace("{hash}", &parent.to_hex());
                let method: Method = method.to_uppercase().parse()?;
                let (s, e, _) = call(c, op, up.req(method, &path, SPACE, token)).await?;
                assert_eq!((s, e["error"].as_str()), (401, Some(code)), "{op}");
            }
        }

        // 403: a Space no grant selects, a grant without the permission, an algorithm the
        // contract does not sign with, and root refs without a domain.
        let read_only = app.v2_token("/team/**", &["cas:nodes:read"], Some("docs"));
        let mut hs = Header::new(Algorithm::HS256);
        hs.kid = Some(app.kid.clone());
        hs.typ = Some(UPSTREAM_TYP.into());
        let hmac = jsonwebtoken::encode(
            &hs,
            &app.v2_claims("/team/**", ALL_PERMISSIONS),
            &EncodingKey::from_secret(b"guessed")?,
        )?;
        let no_domain = app.v2_token("/team/**", ALL_PERMISSIONS, None);
        for (op, request, code) in [
            (
                "readContent",
                up.req(Method::GET, &content(parent), "/elsewhere", t),
                "resource_scope_mismatch",
            ),
            (
                "getUsage",
                up.req(Method::GET, "/v1/cas/usage", SPACE, Some(&read_only)),
                "insufficient_permission",
            ),
            (
                "leaseNode",
                up.req(Method::POST, &lease(parent), SPACE, Some(&read_only))
                    .json(&json!({"leaseDurationMs": 60_000})),
                "insufficient_permission",
            ),
            (
                "runGc",
                up.req(Method::POST, "/v1/cas/gc", SPACE, Some(&read_only))
                    .json(&json!({})),
                "insufficient_permission",
            ),
            (
                "readMetadata",
                up.req(Method::GET, &metadata(parent), SPACE, Some(&hmac)),
                "unsupported_algorithm",
            ),
            (
                "listRootRefs",
                up.req(Method::GET, "/v1/cas/root-refs", SPACE, Some(&no_domain)),
                "ROOT_REF_INVALID",
            ),
            (
                "updateRootRefs",
                up.req(Method::POST, "/v1/cas/root-refs", SPACE, Some(&no_domain))
                    .json(&json!({"requestId": "x", "changes": {parent.to_hex(): 1}})),
                "ROOT_REF_INVALID",
            ),
        ] {
            let (s, e, _) = call(c, op, request).await?;
            assert_eq!((s, e["error"].as_str()), (403, Some(code)), "{op}");
        }

        // 404, 409 and 413.
        for (op, request, status, code) in [
            (
                "readContent",
                up.req(Method::GET, &content(stranger), SPACE, t),
                404,
                "NODE_NOT_FOUND",
            ),
            (
                "readMetadata",
                up.req(Method::GET, &metadata(stranger), SPACE, t),
                404,
                "NODE_NOT_FOUND",
            ),
            (
                "updateRootRefs",
                update("unknown", json!({stranger.to_hex(): 1})),
                404,
                "NODE_NOT_FOUND",
            ),
            (
                "updateRootRefs",
                update("below", json!({parent.to_hex(): -2})),
                409,
                "NEGATIVE_AGGREGATE",
            ),
            (
                "updateRootRefs",
                update("add", json!({parent.to_hex(): 2})),
                409,
                "IDEMPOTENCY_CONFLICT",
            ),
            (
                "leaseNode",
                up.req(Method::POST, &lease(stranger), SPACE, t)
                    .json(&json!({"leaseDurationMs": 60_000, "pad": "x".repeat(8192)})),
                413,
                "PAYLOAD_TOO_LARGE",
            ),
        ] {
            let (s, e, _) = call(c, op, request).await?;
            assert_eq!((s, e["error"].as_str()), (status, Some(code)), "{op}: {e}");
        }

        // 403 APP_SUSPENDED, for as long as the App is suspended.
        env.cli(&["app", "suspend", "up"])?;
        let suspended = async {
            loop {
                let (s, e, _) = call(
                    c,
                    "getUsage",
                    up.req(Method::GET, "/v1/cas/usage", SPACE, t),
                )
                .await?;
                if s == 403 {
                    return anyhow::Ok(e);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let e = tokio::time::timeout(Duration::from_secs(10), suspended).await??;
        assert_eq!(e["error"], "APP_SUSPENDED");
        env.cli(&["app", "resume", "up"])?;
    }

    // 429: more uploads under way than the server allows.
    {
        let server = env.start_with(&[("UNICAS_MAX_ACTIVE_UPLOADS", "1")])?;
        let up = Upstream {
            web: reqwest::Client::new(),
            base: server.url.clone(),
        };
        let mut statuses = Vec::new();
        for i in 0..3u8 {
            let (h, _) = leaf(&[i; 40]);
            let request = up
                .req(Method::POST, &lease(h), SPACE, t)
                .json(&json!({"leaseDurationMs": 60_000}));
            let (s, e, headers) = call(c, "leaseNode", request).await?;
            if s == 429 {
                assert_eq!(e["error"], "CAS_UPLOAD_LIMIT");
                assert!(headers.contains_key("retry-after"));
            }
            statuses.push(s);
        }
        assert!(statuses.contains(&429), "{statuses:?}");
    }

    // 503: the object store fails while a collection pass runs.
    {
        let server = env.start_with(&[("UNICAS_FAILPOINTS", "gc.after_mark=error")])?;
        let up = Upstream {
            web: reqwest::Client::new(),
            base: server.url.clone(),
        };
        let (h, bytes) = leaf(b"nothing holds me");
        up.put_node(c, &token, h, &bytes, 1000).await?;
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let request = up
            .req(Method::POST, "/v1/cas/gc", SPACE, t)
            .json(&json!({"maxNodes": 10}));
        let (s, e, _) = call(c, "runGc", request).await?;
        assert_eq!((s, e["error"].as_str()), (503, Some("STORAGE_ERROR")));
    }

    // 401 registry_unavailable: the issuer registry cannot be read (and nothing is cached).
    {
        let server = env.start_with(&[("UNICAS_FAILPOINTS", "registry.load=error")])?;
        let up = Upstream {
            web: reqwest::Client::new(),
            base: server.url.clone(),
        };
        let request = up.req(Method::GET, "/v1/cas/usage", SPACE, t);
        let (s, e, headers) = call(c, "getUsage", request).await?;
        assert_eq!(
            (s, e["error"].as_str()),
            (401, Some("registry_unavailable"))
        );
        assert!(headers.contains_key("retry-after"), "a client may retry");
    }

    // Every status the contract lists was answered, and checked, at least once.
    let listed: BTreeSet<u16> = contract
        .operations()
        .keys()
        .map(|op| contract.statuses(op))
        .collect::<anyhow::Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect();
    let seen = contract.seen();
    let answered: BTreeSet<u16> = seen.iter().map(|(_, s, _)| *s).collect();
    assert_eq!(answered, listed, "statuses answered vs listed");
    for op in contract.operations().keys() {
        for status in [200, 400, 401, 403] {
            assert!(
                seen.iter().any(|(o, s, _)| o == op && *s == status),
                "{op} never answered {status}"
            );
        }
    }
    env.assert_consistent("up")?;
    Ok(())
}

e2e!(every_operation_answers_as_the_contract_says);
