//! Nothing a user typed and marimo wrote is lost: a silent session expires after saving, a
//! hub killed with sessions running is followed by one that saves their changes and stops
//! their processes, and a hub asked to stop saves and stops its sandboxes first.

use std::time::Duration;

use tests::hub::{HubClient, HubEnv, HubServer, data};
use tests::sessions::*;
use tests::*;

/// A running session of alice with `40 + n` saved through marimo: `(client, pid, nid, sid,
/// port)`.
async fn edited_session(
    env: &HubEnv,
    server: &HubServer,
    token: &str,
    a: HubClient,
    (pid, nid): (String, String),
    n: u32,
) -> anyhow::Result<(HubClient, String, String, String, u16)> {
    let (status, created) = create(&a, &pid, &nid, "edit").await?;
    anyhow::ensure!(status == 202, "creating a session: {status} {created}");
    let sid = created["data"]["session_id"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("no session id: {created}"))?
        .to_string();
    // Heartbeats from its creation until the edit is saved: a kernel slow to start must not
    // let a session with a short expiry lapse before the test has made its change.
    let beats = {
        let (a, path) = (
            a.clone(),
            format!("{}/heartbeat", session_path(&pid, &nid, &sid)),
        );
        tokio::spawn(async move {
            loop {
                let _ = a.post(&path, &serde_json::json!({})).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    if let Err(e) = wait_status(&a, &pid, &nid, &sid, "running", Duration::from_secs(90)).await {
        beats.abort();
        return Err(e);
    }
    let edited = edit_sum(&server.url, &sid, token, n).await;
    beats.abort();
    edited?;
    let port = sandbox_port(env, &sid)?;
    assert!(port_open(port));
    Ok((a, pid, nid, sid, port))
}

async fn a_silent_session_expires_and_keeps_its_change(b: Backend) -> anyhow::Result<()> {
    let mut env = session_env(b).await?;
    env.set("UNICAS_HUB_SESSION_EXPIRE_MS", 3000);
    let (token, server, a, pid, nid) = alice_notebook(&env).await?;
    let (a, pid, nid, sid, port) = edited_session(&env, &server, &token, a, (pid, nid), 21).await?;
    // No heartbeat and no open editor: it expires (after saving), and its process goes.
    let s = wait_status(&a, &pid, &nid, &sid, "expired", Duration::from_secs(30)).await?;
    assert!(s["ended_at"].is_string());
    assert!(
        !port_open(port),
        "the expired session's marimo still listens"
    );
    assert!(!process_running(&sid));
    assert!(
        head_file(&a, &pid, &nid, "notebook.py")
            .await?
            .contains("40 + 21"),
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
    let (token, server, a, pid, nid) = alice_notebook(&env).await?;
    let (_, pid, nid, sid, port) = edited_session(&env, &server, &token, a, (pid, nid), 31).await?;
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
        head_file(&a, &pid, &nid, "notebook.py")
            .await?
            .contains("40 + 31"),
        "the change made before the kill was lost"
    );
    let versions = versions(&a, &pid, &nid).await?;
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
    let (token, server, a, pid, nid) = alice_notebook(&env).await?;
    let (_, pid, nid, sid, port) = edited_session(&env, &server, &token, a, (pid, nid), 41).await?;
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
        head_file(&a, &pid, &nid, "notebook.py")
            .await?
            .contains("40 + 41"),
        "the change was not saved at shutdown"
    );
    Ok(())
}

hub_e2e!(a_killed_hub_loses_no_change_and_leaves_no_process);
hub_e2e_on!(sqlite_fs => SQLITE_FS: a_silent_session_expires_and_keeps_its_change, a_stopped_hub_saves_and_stops_its_sandboxes);
