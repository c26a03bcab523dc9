//! A session from start to teardown: running marimo, reached only through the proxy, reused,
//! saved at teardown with an HTML snapshot; app sessions; limits; no runtime.

use std::time::Duration;

use serde_json::json;
use tests::hub::{HubClient, HubEnv, data, refused};
use tests::sessions::*;
use tests::*;

const START: Duration = Duration::from_secs(90);

async fn edit_and_end(b: Backend) -> anyhow::Result<()> {
    let env = session_env(b).await?;
    let token = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&token));
    let pid = a.project("P").await?;
    let nid = a.notebook(&pid, "N", &[("notebook.py", NOTEBOOK)]).await?;

    let created = create(&a, &pid, &nid, "edit").await?;
    let s = data(&created, 202);
    assert_eq!(s["status"], "starting");
    let sid = s["session_id"].as_str().unwrap_or_default().to_string();
    assert!(sid.starts_with("sess-"), "{sid}");
    assert_eq!(s["sandbox_url"], format!("/s/{sid}/"));
    assert_eq!(s["opened_revision"], 1);
    let s = wait_status(&a, &pid, &nid, &sid, "running", START).await?;
    assert!(
        s["runtime"]["python_version"]
            .as_str()
            .is_some_and(|v| v.starts_with('3')),
        "{s}"
    );
    assert!(
        s["runtime"]["marimo_version"]
            .as_str()
            .is_some_and(|v| !v.is_empty()),
        "{s}"
    );
    assert!(
        s["sandbox_id"]
            .as_str()
            .is_some_and(|v| v.starts_with("sb-")),
        "{s}"
    );

    // marimo itself refuses anyone without the sandbox's secret; the hub holds it.
    let port = sandbox_port(&env, &sid)?;
    let direct = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let page = direct
        .get(format!("http://127.0.0.1:{port}/s/{sid}/"))
        .send()
        .await?;
    assert_ne!(
        page.status(),
        200,
        "the sandbox serves its editor without its secret"
    );
    let api = direct
        .get(format!("http://127.0.0.1:{port}/s/{sid}/api/status"))
        .send()
        .await?;
    assert!(
        matches!(api.status().as_u16(), 401 | 403),
        "the sandbox's API answers without its secret: {}",
        api.status()
    );
    assert!(
        !sandbox_url_leaks(&s, port),
        "the record names the sandbox's port: {s}"
    );

    // Reuse: one live edit session per user and notebook.
    let again = data(&create(&a, &pid, &nid, "edit").await?, 200);
    assert_eq!(again["session_id"], sid);

    // Edit through the proxy as marimo's editor does, then end the session.
    let bearer = format!("Bearer {token}");
    let editor = Editor::open(&server.url, &sid, &[("authorization", &bearer)]).await?;
    assert!(
        editor.codes().iter().any(|c| c.contains("40 + 2")),
        "{:?}",
        editor.codes()
    );
    editor
        .save(&with_sum(&editor.codes(), 7), "notebook.py")
        .await?;
    drop(editor);
    let hb = data(
        &a.post(
            &format!("{}/heartbeat", session_path(&pid, &nid, &sid)),
            &json!({}),
        )
        .await?,
        200,
    );
    assert_eq!(hb["status"], "running");

    let ended = data(&a.delete(&session_path(&pid, &nid, &sid)).await?, 200);
    assert_eq!(ended["status"], "terminated");
    assert!(
        !port_open(port),
        "marimo still listens after the session ended"
    );
    assert!(
        !process_running(&sid),
        "a marimo process of the session still runs"
    );
    assert!(
        !session_dir(&env, &sid).exists(),
        "the sandbox's directory stays"
    );

    // The change is revision 2, cut by the session, with an HTML snapshot of that code.
    let versions = data(
        &a.get(&format!("/api/v1/projects/{pid}/notebooks/{nid}/versions"))
            .await?,
        200,
    );
    let v = &versions["items"][0];
    assert_eq!(v["revision"], 2, "{versions}");
    assert_eq!(v["kind"], "session");
    assert_eq!(v["author"], "alice");
    assert_eq!(ended["last_version_id"], v["version_id"]);
    assert!(
        v["html_snapshot"]["size_bytes"]
            .as_i64()
            .is_some_and(|n| n > 0),
        "{v}"
    );
    assert!(v["html_snapshot"]["captured_at"].is_string(), "{v}");
    let vid = v["version_id"].as_str().unwrap_or_default();
    let (st, file) = a
        .get_bytes(&format!(
            "/api/v1/projects/{pid}/notebooks/{nid}/versions/{vid}/files/notebook.py"
        ))
        .await?;
    assert_eq!(st, 200);
    assert!(String::from_utf8_lossy(&file).contains("40 + 7"));
    let html = a
        .request(
            reqwest::Method::GET,
            &format!("/api/v1/projects/{pid}/notebooks/{nid}/versions/{vid}/html"),
        )
        .send()
        .await?;
    assert_eq!(html.status(), 200);
    let csp = html.headers()["content-security-policy"]
        .to_str()?
        .to_string();
    assert!(
        csp.contains("sandbox") && !csp.contains("allow-same-origin"),
        "{csp}"
    );
    assert!(
        html.text().await?.contains("40 + 7"),
        "the snapshot is not of the saved code"
    );
    // A version without one answers 404.
    let first = versions["items"][1]["version_id"]
        .as_str()
        .unwrap_or_default();
    refused(
        &a.get(&format!(
            "/api/v1/projects/{pid}/notebooks/{nid}/versions/{first}/html"
        ))
        .await?,
        404,
        "NOT_FOUND",
    );

    // Ended: the proxy refuses, the list no longer shows it, the events say what happened.
    let gone = a
        .request(reqwest::Method::GET, &format!("/s/{sid}/"))
        .send()
        .await?;
    assert_eq!(gone.status(), 410);
    let live = data(
        &a.get(&format!("/api/v1/projects/{pid}/sessions")).await?,
        200,
    );
    assert_eq!(live["items"], json!([]));
    let events = data(
        &a.get(&format!("/api/v1/projects/{pid}/events")).await?,
        200,
    );
    let names: Vec<&str> = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["event"].as_str())
        .collect();
    assert!(
        names.contains(&"session.create") && names.contains(&"session.terminate"),
        "{names:?}"
    );
    Ok(())
}

fn sandbox_url_leaks(record: &serde_json::Value, port: u16) -> bool {
    record.to_string().contains(&format!(":{port}"))
}

async fn apps_run_read_only(b: Backend) -> anyhow::Result<()> {
    let env = session_env(b).await?;
    let token = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&token));
    let pid = a.project("P").await?;
    let nid = a.notebook(&pid, "N", &[("notebook.py", NOTEBOOK)]).await?;
    let sid = data(&create(&a, &pid, &nid, "app").await?, 202)["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let s = wait_status(&a, &pid, &nid, &sid, "running", START).await?;
    assert_eq!(s["mode"], "app");
    let page = a
        .request(reqwest::Method::GET, &format!("/s/{sid}/"))
        .send()
        .await?;
    assert_eq!(page.status(), 200);
    // An app session is not an editor: it holds no claim.
    let claim = data(
        &a.get(&format!(
            "/api/v1/projects/{pid}/notebooks/{nid}/editor-session"
        ))
        .await?,
        200,
    );
    assert_eq!(claim["session_id"], serde_json::Value::Null);
    data(&a.delete(&session_path(&pid, &nid, &sid)).await?, 200);
    let versions = data(
        &a.get(&format!("/api/v1/projects/{pid}/notebooks/{nid}/versions"))
            .await?,
        200,
    );
    assert_eq!(
        versions["items"].as_array().map(Vec::len),
        Some(1),
        "an app session saved: {versions}"
    );
    Ok(())
}

async fn limits_and_a_missing_runtime_are_clear(b: Backend) -> anyhow::Result<()> {
    let mut env = session_env(b).await?;
    env.set("UNICAS_HUB_SESSION_MAX_PER_USER", 1);
    let token = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&token));
    let pid = a.project("P").await?;
    let n1 = a.notebook(&pid, "N1", &[("notebook.py", NOTEBOOK)]).await?;
    let n2 = a.notebook(&pid, "N2", &[("notebook.py", NOTEBOOK)]).await?;
    let sid = data(&create(&a, &pid, &n1, "edit").await?, 202)["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let r = a
        .request(
            reqwest::Method::POST,
            &format!("/api/v1/projects/{pid}/notebooks/{n2}/sessions"),
        )
        .json(&json!({}))
        .send()
        .await?;
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let body: serde_json::Value = r.json().await?;
    assert_eq!(body["error"]["code"], "session_limit", "{body}");
    refused(
        &create(&a, &pid, &n2, "everything").await?,
        422,
        "VALIDATION_ERROR",
    );
    wait_status(&a, &pid, &n1, &sid, "running", START).await?;
    data(&a.delete(&session_path(&pid, &n1, &sid)).await?, 200);
    drop(server);

    // No marimo: the session fails with a clear, secret-free error; then 503 at once.
    let mut env = HubEnv::new(b).await?;
    env.set("UNICAS_HUB_MARIMO", "/nonexistent/marimo");
    let token = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&token));
    let pid = a.project("P").await?;
    let nid = a.notebook(&pid, "N", &[("notebook.py", NOTEBOOK)]).await?;
    let sid = data(&create(&a, &pid, &nid, "edit").await?, 202)["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let failed = wait_status(&a, &pid, &nid, &sid, "failed", START).await?;
    assert_eq!(failed["error"]["code"], "runtime_unavailable", "{failed}");
    assert!(
        failed["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("UNICAS_HUB_MARIMO")),
        "{failed}"
    );
    let err = refused(
        &create(&a, &pid, &nid, "edit").await?,
        503,
        "runtime_unavailable",
    );
    assert!(err["message"].as_str().is_some_and(|m| !m.is_empty()));
    // The failed session released the editor.
    let claim = data(
        &a.get(&format!(
            "/api/v1/projects/{pid}/notebooks/{nid}/editor-session"
        ))
        .await?,
        200,
    );
    assert_eq!(claim["session_id"], serde_json::Value::Null);
    let _ = HubClient::new(&server.url, None);
    Ok(())
}

async fn a_session_on_another_hub_process_is_reached_through_its_owner(
    b: Backend,
) -> anyhow::Result<()> {
    // Two hub processes over one database (Postgres) and one CAS: a session started on one is
    // opened, edited and ended through the other.
    let env = session_env(b).await?;
    let token = env.user("alice")?;
    let first = env.start()?;
    let cas = first.cas_url.clone().unwrap_or_default();
    let second = env.start_with(&[("UNICAS_HUB_CAS_URL", cas.as_str())])?;
    let (a1, a2) = (first.client(Some(&token)), second.client(Some(&token)));
    let pid = a1.project("P").await?;
    let nid = a1.notebook(&pid, "N", &[("notebook.py", NOTEBOOK)]).await?;
    let sid = data(&create(&a1, &pid, &nid, "edit").await?, 202)["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    wait_status(&a2, &pid, &nid, &sid, "running", START).await?;
    let bearer = format!("Bearer {token}");
    let editor = Editor::open(&second.url, &sid, &[("authorization", &bearer)]).await?;
    editor
        .save(&with_sum(&editor.codes(), 11), "notebook.py")
        .await?;
    drop(editor);
    let ended = data(&a2.delete(&session_path(&pid, &nid, &sid)).await?, 200);
    assert_eq!(ended["status"], "terminated");
    let (_, file) = a2
        .get_bytes(&format!(
            "/api/v1/projects/{pid}/notebooks/{nid}/workspace/files/notebook.py"
        ))
        .await?;
    assert!(String::from_utf8_lossy(&file).contains("40 + 11"));
    Ok(())
}

hub_e2e!(edit_and_end);

mod one_backend {
    use super::*;
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn apps_run_read_only() -> anyhow::Result<()> {
        super::apps_run_read_only(Backend::SQLITE_FS).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn limits_and_a_missing_runtime_are_clear() -> anyhow::Result<()> {
        super::limits_and_a_missing_runtime_are_clear(Backend::SQLITE_FS).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_session_on_another_hub_process_is_reached_through_its_owner() -> anyhow::Result<()> {
        super::a_session_on_another_hub_process_is_reached_through_its_owner(Backend::POSTGRES_FS)
            .await
    }
}
