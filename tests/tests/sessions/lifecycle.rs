//! A session from start to teardown: running marimo, reached only through the proxy, reused,
//! saved at teardown with an HTML snapshot; app sessions; limits; no runtime; a session run by
//! another hub process.

use std::time::Duration;

use serde_json::json;
use tests::hub::{HubEnv, data, refused};
use tests::sessions::*;
use tests::*;

async fn edit_and_end(b: Backend) -> anyhow::Result<()> {
    let env = session_env(b).await?;
    let (token, server, a, pid, nid) = alice_notebook(&env).await?;
    let versions_path = format!("/api/v1/projects/{pid}/notebooks/{nid}/versions");

    let s = data(&create(&a, &pid, &nid, "edit").await?, 202);
    assert_eq!(s["status"], "starting");
    let sid = s["session_id"].as_str().unwrap_or_default().to_string();
    assert!(sid.starts_with("sess-"), "{sid}");
    assert_eq!(s["sandbox_url"], format!("/s/{sid}/"));
    assert_eq!(s["opened_revision"], 1);
    let s = wait_status(&a, &pid, &nid, &sid, "running", Duration::from_secs(90)).await?;
    for (field, prefix) in [("python_version", "3"), ("marimo_version", "")] {
        assert!(
            s["runtime"][field]
                .as_str()
                .is_some_and(|v| v.starts_with(prefix) && !v.is_empty()),
            "{s}"
        );
    }
    assert!(
        s["sandbox_id"]
            .as_str()
            .is_some_and(|v| v.starts_with("sb-")),
        "{s}"
    );

    // marimo itself refuses anyone without the sandbox's secret; the hub holds it, and the
    // record never names the sandbox's address.
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
        !s.to_string().contains(&format!(":{port}")),
        "the record names the sandbox's port: {s}"
    );

    // Reuse: one live edit session per user and notebook.
    let again = data(&create(&a, &pid, &nid, "edit").await?, 200);
    assert_eq!(again["session_id"], sid);

    // Edit through the proxy as marimo's editor does, then end the session.
    edit_sum(&server.url, &sid, &token, 7).await?;
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
    let versions = data(&a.get(&versions_path).await?, 200);
    let v = &versions["items"][0];
    assert_eq!(
        (
            v["revision"].as_i64(),
            v["kind"].as_str(),
            v["author"].as_str()
        ),
        (Some(2), Some("session"), Some("alice")),
        "{versions}"
    );
    assert_eq!(ended["last_version_id"], v["version_id"]);
    assert!(
        v["html_snapshot"]["size_bytes"]
            .as_i64()
            .is_some_and(|n| n > 0),
        "{v}"
    );
    assert!(v["html_snapshot"]["captured_at"].is_string(), "{v}");
    assert!(
        head_file(&a, &pid, &nid, "notebook.py")
            .await?
            .contains("40 + 7")
    );
    let vid = v["version_id"].as_str().unwrap_or_default();
    let html = a
        .request(reqwest::Method::GET, &format!("{versions_path}/{vid}/html"))
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
        &a.get(&format!("{versions_path}/{first}/html")).await?,
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

async fn apps_run_read_only(b: Backend) -> anyhow::Result<()> {
    let env = session_env(b).await?;
    let (_, _server, a, pid, nid) = alice_notebook(&env).await?;
    let sid = started(&a, &pid, &nid, "app").await?;
    let s = data(&a.get(&session_path(&pid, &nid, &sid)).await?, 200);
    assert_eq!(s["mode"], "app");
    let page = a
        .request(reqwest::Method::GET, &format!("/s/{sid}/"))
        .send()
        .await?;
    assert_eq!(page.status(), 200);
    // An app session is not an editor: it holds no claim, and saves nothing.
    let claim = data(
        &a.get(&format!(
            "/api/v1/projects/{pid}/notebooks/{nid}/editor-session"
        ))
        .await?,
        200,
    );
    assert_eq!(claim["session_id"], serde_json::Value::Null);
    data(&a.delete(&session_path(&pid, &nid, &sid)).await?, 200);
    let versions = versions(&a, &pid, &nid).await?;
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
    let (_, _server, a, pid, n1) = alice_notebook(&env).await?;
    let n2 = a.notebook(&pid, "N2", &[("notebook.py", NOTEBOOK)]).await?;
    let sid = started(&a, &pid, &n1, "edit").await?;
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
    data(&a.delete(&session_path(&pid, &n1, &sid)).await?, 200);

    // No marimo: the session fails with a clear, secret-free error; then 503 at once.
    let mut env = HubEnv::new(b).await?;
    env.set("UNICAS_HUB_MARIMO", "/nonexistent/marimo");
    let (_, _server, a, pid, nid) = alice_notebook(&env).await?;
    let sid = data(&create(&a, &pid, &nid, "edit").await?, 202)["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let failed = wait_status(&a, &pid, &nid, &sid, "failed", Duration::from_secs(60)).await?;
    assert_eq!(failed["error"]["code"], "runtime_unavailable", "{failed}");
    assert!(
        failed["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("UNICAS_HUB_MARIMO")),
        "{failed}"
    );
    refused(
        &create(&a, &pid, &nid, "edit").await?,
        503,
        "runtime_unavailable",
    );
    // The failed session released the editor.
    let claim = data(
        &a.get(&format!(
            "/api/v1/projects/{pid}/notebooks/{nid}/editor-session"
        ))
        .await?,
        200,
    );
    assert_eq!(claim["session_id"], serde_json::Value::Null);
    Ok(())
}

async fn a_session_on_another_hub_process_is_reached_through_its_owner(
    b: Backend,
) -> anyhow::Result<()> {
    // Two hub processes over one database and one CAS: a session started on one is opened,
    // edited and ended through the other.
    let env = session_env(b).await?;
    let (token, first, a1, pid, nid) = alice_notebook(&env).await?;
    let cas = first.cas_url.clone().unwrap_or_default();
    let second = env.start_with(&[("UNICAS_HUB_CAS_URL", cas.as_str())])?;
    let a2 = second.client(Some(&token));
    let sid = started(&a1, &pid, &nid, "edit").await?;
    edit_sum(&second.url, &sid, &token, 11).await?;
    let ended = data(&a2.delete(&session_path(&pid, &nid, &sid)).await?, 200);
    assert_eq!(ended["status"], "terminated");
    assert!(
        head_file(&a2, &pid, &nid, "notebook.py")
            .await?
            .contains("40 + 11")
    );
    Ok(())
}

hub_e2e!(edit_and_end);
hub_e2e_on!(sqlite_fs => SQLITE_FS: apps_run_read_only, limits_and_a_missing_runtime_are_clear);
hub_e2e_on!(postgres_fs => POSTGRES_FS: a_session_on_another_hub_process_is_reached_through_its_owner);

async fn changes_are_saved_while_the_session_runs(b: Backend) -> anyhow::Result<()> {
    let mut env = session_env(b).await?;
    env.set("UNICAS_HUB_SESSION_SAVE_INTERVAL_MS", 1000);
    env.set("UNICAS_HUB_SESSION_RETENTION_MS", 1500);
    let (token, server, a, pid, nid) = alice_notebook(&env).await?;
    let sid = started(&a, &pid, &nid, "edit").await?;
    edit_sum(&server.url, &sid, &token, 17).await?;
    // Saved without ending the session; the session's next save builds on it.
    let path = session_path(&pid, &nid, &sid);
    let s = eventually(Duration::from_secs(30), "a periodic save", || {
        let (a, path) = (a.clone(), path.clone());
        async move {
            let s = data(&a.get(&path).await?, 200);
            Ok((s["base_revision"] == 2).then_some(s))
        }
    })
    .await?;
    assert_eq!(s["status"], "running");
    assert!(
        s["last_saved_at"].is_string() && s["last_version_id"].is_string(),
        "{s}"
    );
    assert!(
        head_file(&a, &pid, &nid, "notebook.py")
            .await?
            .contains("40 + 17")
    );
    // Unchanged files make no revision; a second change makes the next one.
    edit_sum(&server.url, &sid, &token, 18).await?;
    let ended = data(&a.delete(&path).await?, 200);
    assert_eq!(ended["base_revision"], 3, "{ended}");
    let versions = versions(&a, &pid, &nid).await?;
    assert_eq!(
        versions["items"].as_array().map(Vec::len),
        Some(3),
        "{versions}"
    );
    // An ended record is reaped after its retention.
    eventually(Duration::from_secs(30), "the record to be reaped", || {
        let (a, path) = (a.clone(), path.clone());
        async move { Ok((a.get(&path).await?.0 == 404).then_some(())) }
    })
    .await?;
    Ok(())
}

async fn the_hub_prepares_its_runtime_once(b: Backend) -> anyhow::Result<()> {
    // Without UNICAS_HUB_MARIMO the hub makes a virtual environment with `python -m venv` and
    // installs the pinned marimo with its pip, once. Here `python` is a stand-in that makes a
    // environment whose pip records what it is asked and links the test's marimo (no network).
    let mut env = HubEnv::new(b).await?;
    let fake = env.env.dir.path().join("fake-python");
    let pip_log = env.env.dir.path().join("pip.log");
    let real = marimo()?;
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nset -e\n[ \"$1 $2\" = \"-m venv\" ] || exit 2\nmkdir -p \"$3/bin\"\n\
             printf '#!/bin/sh\\necho \"$*\" >> {log}\\nsleep 1\\nln -s {marimo} \"$(dirname \"$0\")/marimo\"\\n' > \"$3/bin/pip\"\n\
             chmod +x \"$3/bin/pip\"\n",
            log = pip_log.display(),
            marimo = real.display()
        ),
    )?;
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    env.set("UNICAS_HUB_PYTHON", fake.display());
    let (_, server, a, pid, n1) = alice_notebook(&env).await?;
    let n2 = a.notebook(&pid, "N2", &[("notebook.py", NOTEBOOK)]).await?;
    // Two sessions at once wait for one preparation.
    let (s1, s2) = tokio::join!(
        started(&a, &pid, &n1, "edit"),
        started(&a, &pid, &n2, "app")
    );
    let (s1, s2) = (s1?, s2?);
    let installs = std::fs::read_to_string(&pip_log)?;
    assert_eq!(
        installs.lines().count(),
        1,
        "pip ran more than once: {installs}"
    );
    assert!(installs.contains("marimo==0.25.2"), "{installs}");
    let venv = env.env.dir.path().join("data/runtime/marimo-0.25.2");
    assert!(venv.join(".ready").exists());
    for (n, s) in [(&n1, &s1), (&n2, &s2)] {
        data(&a.delete(&session_path(&pid, n, s)).await?, 200);
    }
    drop(server);
    // A later hub finds it ready.
    let server = env.start()?;
    let a = server.client(Some(&env.user("bob")?));
    let pid = a.project("Q").await?;
    let nid = a.notebook(&pid, "N", &[("notebook.py", NOTEBOOK)]).await?;
    let sid = started(&a, &pid, &nid, "edit").await?;
    assert_eq!(
        std::fs::read_to_string(&pip_log)?.lines().count(),
        1,
        "the runtime was prepared again"
    );
    data(&a.delete(&session_path(&pid, &nid, &sid)).await?, 200);
    Ok(())
}

hub_e2e_on!(sqlite_fs => SQLITE_FS: changes_are_saved_while_the_session_runs, the_hub_prepares_its_runtime_once);
