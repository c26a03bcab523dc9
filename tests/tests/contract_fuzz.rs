//! A property-based run of the public UniCAS contract against a running server: schemathesis
//! generates requests from the upstream OpenAPI document (valid and invalid ones) for a
//! bounded time and checks that no answer is a server error and every status, header, content
//! type and body is one the document allows. The server holds nodes and root refs in a path
//! Space, and the capability (version 2, ES256, `refDomain`) selects every path Space, so the
//! generated requests reach the handlers instead of stopping at authorization.

use std::path::PathBuf;
use std::process::Command;

use serde_json::json;
use tests::*;

/// The schemathesis executable (`scripts/schemathesis-runtime` makes it; the test command
/// runs that script and sets `UNICAS_TEST_SCHEMATHESIS`).
fn schemathesis() -> anyhow::Result<PathBuf> {
    let path = match std::env::var_os("UNICAS_TEST_SCHEMATHESIS") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/unicas-test/schemathesis-venv/bin/schemathesis"),
    };
    anyhow::ensure!(
        path.exists(),
        "no schemathesis at {}: run scripts/schemathesis-runtime (the test command does) or set UNICAS_TEST_SCHEMATHESIS",
        path.display()
    );
    Ok(path)
}

#[tokio::test]
async fn generated_requests_get_answers_the_contract_allows() -> anyhow::Result<()> {
    let st = schemathesis()?;
    let env = TestEnv::new(Backend::SQLITE_FS).await?;
    let app = env.create_app_with("up", "ES256")?;
    let server = env.start()?;
    // Something to find: a parent and its child, with a root ref in the token's domain.
    let token = app.v2_token("/**", ALL_PERMISSIONS, Some("docs"));
    let web = reqwest::Client::new();
    let client = app.client(&server);
    let sp = space("/team/notes");
    let (child, child_bytes) = leaf(b"a cell");
    let (parent, parent_bytes) = node("text/markdown", &[child], b"# notes\n");
    client
        .ensure_node(&sp, &child, &child_bytes, 600_000)
        .await?;
    client
        .ensure_node(&sp, &parent, &parent_bytes, 600_000)
        .await?;
    let r = web
        .post(format!("{}/v1/cas/root-refs", server.url))
        .query(&[("appId", "up"), ("spaceId", "/team/notes")])
        .bearer_auth(&token)
        .json(&json!({"requestId": "seed", "changes": {parent.to_hex(): 1}}))
        .send()
        .await?;
    assert_eq!(r.status(), 200);

    // The App is the issuer's; half the generated Spaces and hashes name what is stored. A
    // content read answers with the node's own Content-Type (which the contract allows any
    // of), so the content-type check is left out there.
    let config = env.dir.path().join("schemathesis.toml");
    std::fs::write(
        &config,
        format!(
            r#"[generation]
codec = "ascii"

[checks]
not_a_server_error.enabled = true
status_code_conformance.enabled = true
content_type_conformance.enabled = true
response_schema_conformance.enabled = true
response_headers_conformance.enabled = true
negative_data_rejection.enabled = false
positive_data_acceptance.enabled = false
missing_required_header.enabled = false
unsupported_method.enabled = false
allow_header_conformance.enabled = false
use_after_free.enabled = false
ensure_resource_availability.enabled = false
ignored_auth.enabled = false

[dictionaries.stored]
values = ["{parent}", "{child}"]

[dictionaries.spaces]
values = ["/team/notes"]

[parameters]
"query.appId" = "up"
"path.hash" = {{ dictionary = "stored", probability = 0.5 }}
"query.spaceId" = {{ dictionary = "spaces", probability = 0.5 }}

[[operations]]
include-operation-id = "readContent"
checks.content_type_conformance.enabled = false
"#
        ),
    )?;
    let document = format!(
        "{}/openapi/upstream-app-space-v1.json",
        env!("CARGO_MANIFEST_DIR")
    );
    // Its cache of found failures goes into the test's directory, not the checkout.
    let workdir = env.dir.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(st)
            .current_dir(workdir)
            .arg("--config-file")
            .arg(&config)
            .args(["run", &document, "--url", &server.url])
            .args(["--header", &format!("Authorization: Bearer {token}")])
            .args([
                "--max-time",
                "60",
                "--workers",
                "1",
                "--request-timeout",
                "10",
                "--suppress-health-check",
                "all",
                "--no-color",
            ])
            .output()
    })
    .await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "schemathesis found answers outside the contract:\n{stdout}\n{stderr}"
    );
    // It did generate and send requests (the summary counts them).
    assert!(stdout.contains("passed"), "{stdout}");
    Ok(())
}
