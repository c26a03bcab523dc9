//! Operating the service: OpenAPI, health, readiness, metrics, limits, operator commands.

use serde_json::{Value, json};
use tests::*;

fn http() -> reqwest::Client {
    reqwest::Client::new()
}

async fn openapi_of(server: &Server) -> anyhow::Result<Value> {
    Ok(http()
        .get(format!("{}/openapi.json", server.url))
        .send()
        .await?
        .json()
        .await?)
}

#[tokio::test]
async fn openapi_describes_every_route() -> anyhow::Result<()> {
    let env = TestEnv::new(Backend::SQLITE_FS).await?;
    let server = env.start()?;
    let doc = openapi_of(&server).await?;
    let paths = doc["paths"].as_object().expect("paths");
    for (path, methods) in [
        ("/v1/cas/nodes/{hash}", &["get"][..]),
        ("/v1/cas/nodes/{hash}/metadata", &["get"]),
        ("/v1/cas/nodes/{hash}/lease", &["post"]),
        ("/v1/cas/usage", &["get"]),
        ("/v1/cas/gc", &["post"]),
        ("/v1/cas/root-refs", &["get", "post"]),
        ("/v1/cas/uploads/{generation}", &["put"]),
        ("/healthz", &["get"]),
        ("/readyz", &["get"]),
        ("/metrics", &["get"]),
    ] {
        for m in methods {
            let op = &paths[path][m];
            assert!(op.is_object(), "{m} {path} is not documented");
            assert!(
                op["responses"].as_object().is_some_and(|r| !r.is_empty()),
                "{m} {path}"
            );
        }
    }
    let schemas = doc["components"]["schemas"].as_object().expect("schemas");
    for s in [
        "LeaseRequest",
        "LeaseResponse",
        "ErrorBody",
        "Usage",
        "RootRefUpdate",
        "RootRefPage",
        "GcResponse",
        "NodeMetadataResponse",
    ] {
        assert!(schemas.contains_key(s), "schema {s} missing");
    }
    assert!(doc["components"]["securitySchemes"]["capability"].is_object());
    Ok(())
}

/// The published document (`tests/openapi/NAME.json`) against the served one: only additions.
fn keeps_published_contract(name: &str, served: &Value) -> anyhow::Result<()> {
    let path = format!("{}/openapi/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let published: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    let broken = tests::openapi::breaking_changes(&published, served);
    assert!(
        broken.is_empty(),
        "the served {name} document drops or changes what {path} promised:\n{}",
        broken.join("\n")
    );
    Ok(())
}

#[tokio::test]
async fn openapi_documents_keep_what_they_published() -> anyhow::Result<()> {
    let env = TestEnv::new(Backend::SQLITE_FS).await?;
    let server = env.start()?;
    let doc = openapi_of(&server).await?;
    keeps_published_contract("cas", &doc)?;
    let hub_env = tests::hub::HubEnv::new(Backend::SQLITE_FS).await?;
    let hub = hub_env.start()?;
    let (status, doc) = hub.client(None).get("/api/v1/openapi.json").await?;
    assert_eq!(status, 200);
    keeps_published_contract("hub", &doc)
}

/// The served data-plane document describes what the public UniCAS contract's document has:
/// every operation, its parameters (a path Space fits the served `spaceId`), its success
/// statuses, and the properties of its bodies and answers.
#[tokio::test]
async fn the_data_plane_document_is_compatible_with_the_public_contract() -> anyhow::Result<()> {
    let env = TestEnv::new(Backend::SQLITE_FS).await?;
    let server = env.start()?;
    let served = openapi_of(&server).await?;
    let path = format!(
        "{}/openapi/upstream-app-space-v1.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let contract: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    let found = tests::openapi::incompatibilities(&contract, &served);
    assert!(found.is_empty(), "{}", found.join("\n"));
    // The comparison does find what is missing.
    let mut less = served.clone();
    less["paths"]["/v1/cas/usage"] = json!({});
    less["components"]["schemas"]["RootRefPage"]["properties"]
        .as_object_mut()
        .map(|p| p.remove("refDomain"));
    let found = tests::openapi::incompatibilities(&contract, &less);
    assert_eq!(found.len(), 2, "{found:?}");
    Ok(())
}

#[tokio::test]
async fn health_readiness_and_metrics() -> anyhow::Result<()> {
    let env = TestEnv::new(Backend::SQLITE_FS).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    assert_eq!(
        http()
            .get(format!("{}/healthz", server.url))
            .send()
            .await?
            .status(),
        200
    );
    assert_eq!(
        http()
            .get(format!("{}/readyz", server.url))
            .send()
            .await?
            .status(),
        200
    );
    let client = app.client(&server);
    let (h, bytes) = leaf(b"counted");
    client.ensure_node(&space("s"), &h, &bytes, 60_000).await?;
    let first = client
        .lease_node(&space("s"), &leaf(b"bad").0, 60_000, None)
        .await?;
    if let cas_format::wire::LeaseResponse::AwaitingUpload { upload, .. } = first {
        client.upload(&upload, bytes.clone()).await?;
        client
            .lease_node(&space("s"), &leaf(b"bad").0, 60_000, None)
            .await?;
    }
    client.gc(&space("s"), None).await?;
    let text = http()
        .get(format!("{}/metrics", server.url))
        .send()
        .await?
        .text()
        .await?;
    for needle in [
        "unicas_http_requests_total{method=\"POST\",route=\"/v1/cas/nodes/{hash}/lease\",status=\"200\"}",
        "unicas_lease_outcomes_total{state=\"ready\"}",
        "unicas_lease_outcomes_total{state=\"awaiting_upload\"}",
        "unicas_upload_rejections_total{code=\"NODE_DIGEST_MISMATCH\"} 1",
        "unicas_gc_deleted_nodes_total",
        "unicas_gc_reclaimed_content_bytes_total",
    ] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }
    // An unknown route answers the JSON error body.
    let r = http()
        .get(format!("{}/v1/nothing", server.url))
        .send()
        .await?;
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await?["error"], "NOT_FOUND");
    Ok(())
}

#[tokio::test]
async fn rate_and_body_limits() -> anyhow::Result<()> {
    let mut env = TestEnv::new(Backend::SQLITE_FS).await?;
    env.set("UNICAS_RATE_LIMIT_PER_IP", 5)
        .set("UNICAS_JSON_BODY_LIMIT", 200);
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let token = app.token(&space("s"), &["cas:root-refs:update", "cas:usage:read"]);
    let big = json!({"requestId": "x", "changes": {"a".repeat(64): 1}, "pad": "y".repeat(300)});
    let r = http()
        .post(format!("{}/v1/cas/root-refs", server.url))
        .query(&[("appId", "hub"), ("spaceId", "s")])
        .bearer_auth(&token)
        .json(&big)
        .send()
        .await?;
    assert_eq!(r.status(), 413);
    assert_eq!(r.json::<Value>().await?["error"], "PAYLOAD_TOO_LARGE");
    let mut limited = None;
    for _ in 0..40 {
        let r = http().get(format!("{}/healthz", server.url)).send().await?;
        if r.status() == 429 {
            limited = Some(r);
            break;
        }
    }
    let r = limited.expect("a burst of 40 requests at 5/s is limited");
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.json::<Value>().await?["error"], "RATE_LIMITED");
    Ok(())
}

/// The defaults never slow a well-behaved client: thousands of requests per second from one
/// address pass.
#[tokio::test]
async fn default_limits_let_thousands_of_requests_through() -> anyhow::Result<()> {
    let env = TestEnv::new(Backend::SQLITE_FS).await?;
    let server = env.start()?;
    let client = http();
    let url = format!("{}/healthz", server.url);
    let start = std::time::Instant::now();
    let results: Vec<u16> = futures_util::future::join_all((0..3000).map(|_| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            client
                .get(&url)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        }
    }))
    .await;
    let elapsed = start.elapsed();
    assert!(
        results.iter().all(|s| *s == 200),
        "every request passes: {:?}",
        results.iter().filter(|s| **s != 200).count()
    );
    eprintln!("3000 requests in {elapsed:?}");
    Ok(())
}

#[tokio::test]
async fn operator_commands() -> anyhow::Result<()> {
    let env = TestEnv::new(Backend::SQLITE_FS).await?;
    let out = env.cli(&["check-config"])?;
    assert!(out.contains("database and object store answer"), "{out}");
    env.create_app("hub")?;
    let list = env.cli(&["app", "list"])?;
    assert!(
        list.contains("hub\thttps://issuer.test/hub\tactive"),
        "{list}"
    );
    assert!(list.contains("key hub-key-1\tEdDSA\tactive"), "{list}");
    assert!(
        env.cli(&["app", "create", "hub", "--issuer", "another"])
            .is_err(),
        "duplicate App"
    );
    assert!(
        env.cli(&[
            "app",
            "create",
            "dup",
            "--issuer",
            "https://issuer.test/hub"
        ])
        .is_err(),
        "issuer taken"
    );
    assert!(
        env.cli(&["app", "create", "bad/id", "--issuer", "x"])
            .is_err(),
        "invalid App id"
    );
    assert!(env.cli(&["app", "suspend", "nobody"]).is_err());
    let gc = env.cli(&["gc", "--app", "hub", "--space", "s"])?;
    let v: Value = serde_json::from_str(gc.trim())?;
    assert_eq!(v["deleted"], 0);
    // A bad configuration is refused with a reason.
    let out = env
        .server_command()
        .env("UNICAS_LEASE_MIN_MS", "0")
        .arg("check-config")
        .output()?;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("lease_min_ms"));
    // A TOML file is read; the environment overrides it.
    let file = env.dir.path().join("unicas.toml");
    std::fs::write(&file, "audience = \"from-file\"\nlease_min_ms = 5000\n")?;
    let out = env
        .server_command()
        .env_remove("UNICAS_LEASE_MIN_MS")
        .args(["--config", file.to_str().unwrap(), "check-config"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("audience      from-file") && text.contains("leases        5000.."),
        "{text}"
    );
    std::fs::write(&file, "no_such_key = 1\n")?;
    let out = env
        .server_command()
        .args(["--config", file.to_str().unwrap(), "check-config"])
        .output()?;
    assert!(!out.status.success(), "unknown keys are refused");
    Ok(())
}
