//! Class 5: browser-facing safety. A page on another site reaches neither the hub nor the
//! admin plane: not by DNS rebinding (a `Host` the deployment does not answer to is refused)
//! and not by a cross-site form or `fetch` (a change from another `Origin` is refused), while
//! curl and API clients (no `Origin`) work as before. Stored files never run with the API's
//! origin, and the head of a workspace is never cached past a save.

use reqwest::Method;
use serde_json::json;
use tests::hub::{HubClient, HubEnv, data, refused};
use tests::{Backend, TestEnv, node, space};
use tests::{e2e, hub_e2e};

hub_e2e!(the_hub_refuses_other_sites, files_never_run_as_the_hub);
e2e!(the_cas_admin_plane_refuses_other_sites);

async fn the_hub_refuses_other_sites(b: Backend) -> anyhow::Result<()> {
    let mut env = HubEnv::new(b).await?;
    env.set("UNICAS_HUB_AUTH", "none");
    let server = env.start()?;
    let c = server.client(None);
    let port = server
        .url
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_string();
    let count = |v: &serde_json::Value| v["items"].as_array().map_or(0, Vec::len);
    let before = count(&data(&c.get("/api/v1/projects").await?, 200));

    // DNS rebinding: the page's own name, resolved to loopback.
    let got = HubClient::send(
        c.request(Method::GET, "/api/v1/projects")
            .header("host", format!("evil.example:{port}")),
    )
    .await?;
    refused(&got, 421, "host_not_allowed");
    // A cross-site POST (a form or a fetch): refused, nothing created.
    for (origin, site) in [
        ("http://evil.example", None),
        ("null", None),
        (
            &*format!("http://127.0.0.1:{}", port.parse::<u16>()? + 1),
            None,
        ),
        (&*format!("http://127.0.0.1:{port}"), Some("cross-site")),
    ] {
        let mut r = c
            .request(Method::POST, "/api/v1/projects")
            .header("origin", origin)
            .json(&json!({"name": "planted"}));
        if let Some(s) = site {
            r = r.header("sec-fetch-site", s);
        }
        refused(&HubClient::send(r).await?, 403, "origin_not_allowed");
    }
    // An import sent as a form's text/plain.
    let got = HubClient::send(
        c.request(
            Method::POST,
            "/api/v1/projects/proj-aaaaaaaaaaaaaaaa/notebooks/import?title=x",
        )
        .header("content-type", "text/plain")
        .body("anything"),
    )
    .await?;
    assert_eq!(got.0, 415, "{}", got.1);
    assert_eq!(count(&data(&c.get("/api/v1/projects").await?, 200)), before);
    // The hub's own page, and curl, go on.
    let own = HubClient::send(
        c.request(Method::POST, "/api/v1/projects")
            .header("origin", format!("http://127.0.0.1:{port}"))
            .json(&json!({"name": "mine"})),
    )
    .await?;
    data(&own, 201);
    c.project("curl").await?;
    drop(server);

    // A deployment that names its hosts answers to those only.
    let server = env.start_with(&[("UNICAS_HUB_ALLOWED_HOSTS", "hub.example.com")])?;
    let c = server.client(None);
    let named = HubClient::send(
        c.request(Method::GET, "/api/v1/projects")
            .header("host", "hub.example.com"),
    )
    .await?;
    data(&named, 200);
    refused(&c.get("/api/v1/projects").await?, 421, "host_not_allowed");
    Ok(())
}

async fn files_never_run_as_the_hub(b: Backend) -> anyhow::Result<()> {
    let (_env, _server, a, pid, _) = tests::hub::alice_with_project(b).await?;
    let nid = a
        .notebook(
            &pid,
            "n",
            &[
                ("page.html", "<script>fetch('/api/v1/auth/tokens')</script>"),
                (
                    "pic.svg",
                    "<svg xmlns='http://www.w3.org/2000/svg' onload='alert(1)'/>",
                ),
                ("code.py", "print(1)\n"),
            ],
        )
        .await?;
    let file = |p: &str| format!("/api/v1/projects/{pid}/notebooks/{nid}/workspace/files/{p}");
    for (path, attachment) in [("page.html", true), ("pic.svg", true), ("code.py", false)] {
        let r = a.request(Method::GET, &file(path)).send().await?;
        assert_eq!(r.status(), 200);
        let h = r.headers();
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        assert!(
            h["content-security-policy"].to_str()?.contains("sandbox"),
            "{path} is not sandboxed"
        );
        assert_eq!(
            h.get("content-disposition")
                .is_some_and(|v| v.to_str().unwrap_or("").starts_with("attachment")),
            attachment,
            "{path}"
        );
    }

    // The head revalidates; a revision is immutable.
    let r = a.request(Method::GET, &file("code.py")).send().await?;
    assert!(r.headers()["cache-control"].to_str()?.contains("no-cache"));
    let etag = r.headers()["etag"].to_str()?.to_string();
    let r = a
        .request(Method::GET, &file("code.py"))
        .header("if-none-match", &etag)
        .send()
        .await?;
    assert_eq!(r.status(), 304);
    data(
        &a.save(&pid, &nid, Some(1), &[("code.py", "print(2)\n")], &[])
            .await?,
        201,
    );
    let r = a
        .request(Method::GET, &file("code.py"))
        .header("if-none-match", &etag)
        .send()
        .await?;
    assert_eq!(r.status(), 200, "a browser would keep showing the old file");
    assert_eq!(r.text().await?, "print(2)\n");
    let r = a
        .request(Method::GET, &format!("{}?revision=1", file("code.py")))
        .send()
        .await?;
    assert!(r.headers()["cache-control"].to_str()?.contains("immutable"));
    Ok(())
}

async fn the_cas_admin_plane_refuses_other_sites(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("a")?;
    let server = env.start()?;
    let http = reqwest::Client::new();
    let port = server
        .url
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_string();
    let r = http
        .get(format!("{}/admin/providers", server.url))
        .header("host", format!("evil.example:{port}"))
        .send()
        .await?;
    assert_eq!(r.status(), 421);
    assert_eq!(
        r.json::<serde_json::Value>().await?["error"],
        "host_not_allowed"
    );
    let r = http
        .post(format!("{}/admin/logout", server.url))
        .header("origin", "http://evil.example")
        .send()
        .await?;
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.json::<serde_json::Value>().await?["error"],
        "origin_not_allowed"
    );

    // The data plane (bearer capabilities) has no origin check, and its reads of active
    // content are never sniffed and always sandboxed.
    let client = app.client(&server);
    let sp = space("s");
    let (h, bytes) = node("text/html", &[], b"<script>alert(1)</script>");
    client.ensure_node(&sp, &h, &bytes, 60_000).await?;
    let r = http
        .get(format!("{}/v1/cas/nodes/{h}", server.url))
        .query(&[("appId", "a"), ("spaceId", "s")])
        .header("origin", "http://evil.example")
        .bearer_auth(app.token(&sp, &["cas:nodes:read"]))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    assert_eq!(r.headers()["content-security-policy"], "sandbox");
    Ok(())
}
