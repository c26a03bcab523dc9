//! Nothing a user typed and marimo wrote is lost: a silent session expires after saving, a
//! hub killed with sessions running is followed by one that saves their changes and stops
//! their processes, and a hub asked to stop saves and stops its sandboxes first.

use std::time::Duration;

use tests::hub::data;
use tests::sessions::*;
use tests::*;

const START: Duration = Duration::from_secs(90);

/// Starts a session of alice on a new notebook and saves `40 + n` through marimo:
/// `(token, pid, nid, sid, port)`.
async fn edited_session(
    env: &tests::hub::HubEnv,
    server: &tests::hub::HubServer,
    token: &str,
    n: u32,
) -> anyhow::Result<(String, String, String, u16)> {
    let a = server.client(Some(token));
    let pid = a.project(&format!("P{n}")).await?;
    let nid = a.notebook(&pid, "N", &[("notebook.py", NOTEBOOK)]).await?;
    let sid = data(&create(&a, &pid, &nid, "edit").await?, 202)["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    wait_status(&a, &pid, &nid, &sid, "running", START).await?;
    let bearer = format!("Bearer {token}");
    let editor = Editor::open(&server.url, &sid, &[("authorization", &bearer)]).await?;
    editor
        .save(&with_sum(&editor.codes(), n), "notebook.py")
        .await?;
    drop(editor);
    let port = sandbox_port(env, &sid)?;
    assert!(port_open(port));
    Ok((pid, nid, sid, port))
}

async fn head_has(c: &tests::hub::HubClient, pid: &str, nid: &str, n: u32) -> anyhow::Result<bool> {
    let (_, file) = c
        .get_bytes(&format!(
            "/api/v1/projects/{pid}/notebooks/{nid}/workspace/files/notebook.py"
        ))
        .await?;
    Ok(String::from_utf8_lossy(&file).contains(&format!("40 + {n}")))
}

async fn a_silent_session_expires_and_keeps_its_change(b: Backend) -> anyhow::Result<()> {
    let mut env = session_env(b).await?;
    env.set("UNICAS_HUB_SESSION_EXPIRE_MS", 3000);
    let token = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&token));
    let (pid, nid, sid, port) = edited_session(&env, &server, &token, 21).await?;
    // No heartbeat and no open editor: it expires, and its process goes.
    let s = wait_status(&a, &pid, &nid, &sid, "expired", Duration::from_secs(30)).await?;
    assert!(s["ended_at"].is_string());
    eventually(
        Duration::from_secs(15),
        "the sandbox's port to close",
        || async move { Ok((!port_open(port)).then_some(())) },
    )
    .await?;
    assert!(!process_running(&sid));
    assert!(
        head_has(&a, &pid, &nid, 21).await?,
        "the expired session's change was lost"
    );
    let events = data(
        &a.get(&format!("/api/v1/projects/{pid}/events")).await?,
        200,
    );
    assert!(
        events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["event"] == "session.expired"),
        "{events}"
    );
    Ok(())
}

async fn a_killed_hub_loses_no_change_and_leaves_no_process(b: Backend) -> anyhow::Result<()> {
    let env = session_env(b).await?;
    let token = env.user("alice")?;
    let server = env.start()?;
    let (pid, nid, sid, port) = edited_session(&env, &server, &token, 31).await?;
    server.kill();
    // marimo outlives the hub that started it …
    assert!(
        port_open(port),
        "the sandbox died with the hub; this test would prove nothing"
    );
    // … until the next hub on this host adopts it: saves its change, stops it, expires it.
    let server = env.start()?;
    let a = server.client(Some(&token));
    let s = data(&a.get(&session_path(&pid, &nid, &sid)).await?, 200);
    assert_eq!(s["status"], "expired", "{s}");
    assert!(!port_open(port), "an orphaned marimo still listens");
    assert!(
        !process_running(&sid),
        "an orphaned marimo process still runs"
    );
    assert!(!session_dir(&env, &sid).exists());
    assert!(
        head_has(&a, &pid, &nid, 31).await?,
        "the change made before the kill was lost"
    );
    let versions = data(
        &a.get(&format!("/api/v1/projects/{pid}/notebooks/{nid}/versions"))
            .await?,
        200,
    );
    assert_eq!(versions["items"][0]["kind"], "session");
    // The editor is free again.
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

async fn a_stopped_hub_saves_and_stops_its_sandboxes(b: Backend) -> anyhow::Result<()> {
    let env = session_env(b).await?;
    let token = env.user("alice")?;
    let server = env.start()?;
    let (pid, nid, sid, port) = edited_session(&env, &server, &token, 41).await?;
    assert!(
        server.terminate()?,
        "the hub did not exit cleanly on SIGTERM"
    );
    assert!(!port_open(port), "a sandbox outlived the hub's shutdown");
    assert!(!process_running(&sid));
    let server = env.start()?;
    let a = server.client(Some(&token));
    let s = data(&a.get(&session_path(&pid, &nid, &sid)).await?, 200);
    assert_eq!(s["status"], "terminated", "{s}");
    assert!(
        head_has(&a, &pid, &nid, 41).await?,
        "the change was not saved at shutdown"
    );
    Ok(())
}

hub_e2e!(a_killed_hub_loses_no_change_and_leaves_no_process);

mod one_backend {
    use super::*;
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_silent_session_expires_and_keeps_its_change() -> anyhow::Result<()> {
        super::a_silent_session_expires_and_keeps_its_change(Backend::SQLITE_FS).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_stopped_hub_saves_and_stops_its_sandboxes() -> anyhow::Result<()> {
        super::a_stopped_hub_saves_and_stops_its_sandboxes(Backend::SQLITE_FS).await
    }
}
