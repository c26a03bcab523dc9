//! Requests as a client of the public UniCAS Space API sends them: version 2 capabilities
//! (ES256, `typ: unidocs-cap+jwt`, grants by selector) on path Spaces, over raw HTTP; and
//! what browser clients need (CORS) and the body rules of the contract.

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use tests::*;

const ALL: &[&str] = ALL_PERMISSIONS;

/// Upload, publish and read a parent and its child in `/team/notes` with a `/team/**`
/// capability; the selectors' limits, the claims a version 2 token must carry, and the
/// root-ref routes' refusal without a valid domain.
async fn an_upstream_client_works_on_path_spaces(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app_with("up", "ES256")?;
    let ed = env.create_app("ed")?;
    let server = env.start()?;
    let web = reqwest::Client::new();
    let token = app.sign(Some(UPSTREAM_TYP), &app.v2_claims("/team/**", ALL));
    let q = |space: &str| vec![("appId", "up".to_string()), ("spaceId", space.to_string())];
    let lease = |hash: cas_format::Hash, token: String, space: &'static str| {
        web.post(format!("{}/v1/cas/nodes/{hash}/lease", server.url))
            .query(&q(space))
            .bearer_auth(token)
            .json(&json!({"leaseDurationMs": 600_000, "clientTrace": "ignored"}))
            .send()
    };
    let (child, child_bytes) = leaf(b"a cell of the notebook");
    let (parent, parent_bytes) = node("text/markdown", &[child], b"# notes\n");
    for (h, bytes) in [(child, &child_bytes), (parent, &parent_bytes)] {
        let r = lease(h, token.clone(), "/team/notes").await?;
        assert_eq!(r.status(), 200);
        let answer: Value = r.json().await?;
        assert_eq!(answer["state"], "awaiting_upload", "{answer}");
        let url = answer["upload"]["url"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let mut put = web.put(&url).body(bytes.to_vec());
        for (k, v) in answer["upload"]["headers"]
            .as_object()
            .into_iter()
            .flatten()
        {
            put = put.header(k.as_str(), v.as_str().unwrap_or_default());
        }
        assert!(put.send().await?.status().is_success());
        let r = lease(h, token.clone(), "/team/notes").await?;
        let answer: Value = r.json().await?;
        assert_eq!(answer["state"], "ready", "{answer}");
    }
    let r = web
        .get(format!("{}/v1/cas/nodes/{parent}", server.url))
        .query(&q("/team/notes"))
        .bearer_auth(&token)
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/markdown");
    assert_eq!(r.headers()["x-cas-refs"], child.to_hex().as_str());
    assert_eq!(&r.bytes().await?[..], b"# notes\n");
    let get = |path: &str, space: &'static str, token: &str| {
        web.get(format!("{}{path}", server.url))
            .query(&q(space))
            .bearer_auth(token)
            .send()
    };
    let r = get(
        &format!("/v1/cas/nodes/{child}/metadata"),
        "/team/notes",
        &token,
    )
    .await?;
    assert_eq!(r.status(), 200);
    let usage: Value = get("/v1/cas/usage", "/team/notes", &token)
        .await?
        .json()
        .await?;
    assert_eq!(usage["nodeCount"], 2, "{usage}");
    // Another Space below the selector is another partition.
    let usage: Value = get("/v1/cas/usage", "/team/other", &token)
        .await?
        .json()
        .await?;
    assert_eq!(usage["nodeCount"], 0, "{usage}");

    // What the selector does not cover, and a grant without the permission.
    for (space, code) in [
        ("/team", "resource_scope_mismatch"),
        ("/elsewhere/x", "resource_scope_mismatch"),
    ] {
        let r = get("/v1/cas/usage", space, &token).await?;
        assert_eq!(r.status(), 403, "{space}");
        assert_eq!(r.json::<Value>().await?["error"], code, "{space}");
    }
    let prefix = app.sign(
        Some(UPSTREAM_TYP),
        &app.v2_claims("/team/note*", &["cas:nodes:read"]),
    );
    let r = get(
        &format!("/v1/cas/nodes/{child}/metadata"),
        "/team/notes",
        &prefix,
    )
    .await?;
    assert_eq!(r.status(), 200, "a terminal segment prefix");
    let r = get("/v1/cas/usage", "/team/notes", &prefix).await?;
    assert_eq!(r.status(), 403);
    assert_eq!(r.json::<Value>().await?["error"], "insufficient_permission");

    // Root refs: a version 2 capability must name a valid domain (see `ref_domains`).
    let r = get("/v1/cas/root-refs", "/team/notes", &token).await?;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await?["refDomain"], "docs");
    for domain in [None, Some("Not-A-Domain")] {
        let t = app.v2_token("/team/**", ALL, domain);
        let r = get("/v1/cas/root-refs", "/team/notes", &t).await?;
        assert_eq!(r.status(), 403, "{domain:?}");
        assert_eq!(
            r.json::<Value>().await?["error"],
            "ROOT_REF_INVALID",
            "{domain:?}"
        );
    }

    // Claims a version 2 capability must carry, and versions this server does not know.
    let mut no_jti = app.v2_claims("/team/**", ALL);
    no_jti.as_object_mut().map(|c| c.remove("jti"));
    let mut v3 = app.v2_claims("/team/**", ALL);
    v3["ver"] = json!(3);
    let mut bad_selector = app.v2_claims("/team/**", ALL);
    bad_selector["grants"] = json!([{"selector": "team", "permissions": ALL}]);
    for (what, t) in [
        ("no typ", app.sign(None, &app.v2_claims("/team/**", ALL))),
        ("no jti", app.sign(Some(UPSTREAM_TYP), &no_jti)),
        ("ver 3", app.sign(Some(UPSTREAM_TYP), &v3)),
        ("bad selector", app.sign(Some(UPSTREAM_TYP), &bad_selector)),
    ] {
        let r = get("/v1/cas/usage", "/team/notes", &t).await?;
        assert_eq!(r.status(), 401, "{what}");
        assert_eq!(r.json::<Value>().await?["error"], "invalid_token", "{what}");
    }
    // A version 2 capability is ES256: one signed with another key of its App's is refused.
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(ed.kid.clone());
    header.typ = Some("unidocs-cap+jwt".into());
    let ed_token = jsonwebtoken::encode(
        &header,
        &ed.v2_claims("/team/**", ALL),
        &EncodingKey::from_ed_pem(ed.key.private_pem.as_bytes())?,
    )?;
    let r = web
        .get(format!("{}/v1/cas/usage", server.url))
        .query(&[("appId", "ed"), ("spaceId", "/team/notes")])
        .bearer_auth(&ed_token)
        .send()
        .await?;
    assert_eq!(r.status(), 403);
    assert_eq!(r.json::<Value>().await?["error"], "unsupported_algorithm");
    // A path Space in a grant of this service's own shape names it exactly.
    let own = app.token(
        &"/team/notes".parse::<cas_format::SpaceId>()?,
        &["cas:usage:read"],
    );
    assert_eq!(
        get("/v1/cas/usage", "/team/notes", &own).await?.status(),
        200
    );
    assert_eq!(
        get("/v1/cas/usage", "/team/other", &own).await?.status(),
        403
    );

    // A collection pass in the path Space, and a store fsck finds consistent.
    let r = web
        .post(format!("{}/v1/cas/gc", server.url))
        .query(&q("/team/notes"))
        .bearer_auth(&token)
        .json(&json!({"maxNodes": 10, "note": "ignored"}))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    drop(server);
    env.assert_consistent("up")?;
    Ok(())
}

/// Browser clients: without `cors_origins` nothing is answered cross-origin; with it, the data
/// plane answers CORS preflights from the allowed origins and exposes the headers a client
/// reads; the admin plane answers none. Lease bodies accept unknown fields and refuse a zero
/// duration.
async fn browser_clients_and_lenient_bodies(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let web = reqwest::Client::new();
    let app = env.create_app("hub")?;
    let sp = space("s");
    let (h, bytes) = leaf(b"read from a page");
    let preflight = |server: &Server, path: &str, origin: &'static str| {
        web.request(reqwest::Method::OPTIONS, format!("{}{path}", server.url))
            .header("origin", origin)
            .header("access-control-request-method", "GET")
            .header("access-control-request-headers", "authorization, range")
            .send()
    };
    let node_path = format!("/v1/cas/nodes/{h}?appId=hub&spaceId=s");
    {
        let server = env.start()?;
        let r = preflight(&server, &node_path, "https://pages.example").await?;
        assert!(
            r.headers().get("access-control-allow-origin").is_none(),
            "CORS is off by default"
        );
    }
    {
        let server = env.start_with(&[("UNICAS_CORS_ORIGINS", "*")])?;
        let client = app.client(&server);
        client.ensure_node(&sp, &h, &bytes, 60_000).await?;
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
        let r = web
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
        for header in ["x-cas-refs", "content-range", "content-length"] {
            assert!(exposed.contains(header), "{header}: {exposed}");
        }
        // The admin plane (cookies) and the operations routes (no capability) never answer
        // cross-origin.
        for path in ["/admin/session", "/healthz", "/metrics"] {
            let r = preflight(&server, path, "https://pages.example").await?;
            assert!(
                r.headers().get("access-control-allow-origin").is_none(),
                "{path}"
            );
            let r = web
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
            web.post(format!("{}/v1/cas/nodes/{h}/lease", server.url))
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

e2e!(
    an_upstream_client_works_on_path_spaces,
    browser_clients_and_lenient_bodies
);
