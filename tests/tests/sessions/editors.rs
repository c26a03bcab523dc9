//! The persistent editor: exclusive by default (a second editor is refused until they take
//! over, and the takeover saves the holder's changes first), or shared (editors attach to the
//! holder's sandbox).

use std::time::Duration;

use serde_json::json;
use tests::hub::{data, refused};
use tests::sessions::*;
use tests::*;

const START: Duration = Duration::from_secs(90);

async fn exclusive_editor_and_takeover(b: Backend) -> anyhow::Result<()> {
    let env = session_env(b).await?;
    let alice = env.user("alice")?;
    let bob = env.user("bob")?;
    let server = env.start()?;
    let (a, bb) = (server.client(Some(&alice)), server.client(Some(&bob)));
    let pid = a.project("P").await?;
    data(
        &a.put(
            &format!("/api/v1/projects/{pid}/members"),
            &json!({"user_id": "bob", "role": "editor"}),
        )
        .await?,
        200,
    );
    let nid = a.notebook(&pid, "N", &[("notebook.py", NOTEBOOK)]).await?;
    let claim_path = format!("/api/v1/projects/{pid}/notebooks/{nid}/editor-session");

    let held = data(&create(&a, &pid, &nid, "edit").await?, 202)["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    wait_status(&a, &pid, &nid, &held, "running", START).await?;
    let claim = data(&bb.get(&claim_path).await?, 200);
    assert_eq!(
        (
            claim["session_id"].as_str(),
            claim["user_id"].as_str(),
            claim["sharing"].as_str()
        ),
        (Some(held.as_str()), Some("alice"), Some("exclusive"))
    );
    let bearer = format!("Bearer {alice}");
    let editor = Editor::open(&server.url, &held, &[("authorization", &bearer)]).await?;
    editor
        .save(&with_sum(&editor.codes(), 5), "notebook.py")
        .await?;

    // Bob is refused: who holds it, since when.
    let e = refused(
        &create(&bb, &pid, &nid, "edit").await?,
        409,
        "editor_claimed",
    );
    assert_eq!(e["holder"], "alice");
    assert_eq!(e["session_id"], held.as_str());
    assert!(e["claimed_at"].is_string());
    // A viewer may not take over.
    let carol = env.user("carol")?;
    data(
        &a.put(
            &format!("/api/v1/projects/{pid}/members"),
            &json!({"user_id": "carol", "role": "viewer"}),
        )
        .await?,
        200,
    );
    refused(
        &server
            .client(Some(&carol))
            .post(&format!("{claim_path}/takeover"), &json!({}))
            .await?,
        403,
        "FORBIDDEN",
    );

    // The takeover saves alice's change, stops her sandbox, and readies the editor for bob.
    let t = data(
        &bb.post(&format!("{claim_path}/takeover"), &json!({}))
            .await?,
        200,
    );
    assert_eq!(t["transfer"]["phase"], "ready", "{t}");
    assert_eq!(t["transfer"]["requested_by"], "bob");
    drop(editor);
    let old = data(&a.get(&session_path(&pid, &nid, &held)).await?, 200);
    assert_eq!(old["status"], "terminated");
    let (_, file) = a
        .get_bytes(&format!(
            "/api/v1/projects/{pid}/notebooks/{nid}/workspace/files/notebook.py"
        ))
        .await?;
    assert!(
        String::from_utf8_lossy(&file).contains("40 + 5"),
        "alice's change was not saved first"
    );
    // Alice may not jump the queue; bob starts and holds it.
    refused(
        &create(&a, &pid, &nid, "edit").await?,
        409,
        "editor_claimed",
    );
    let mine = data(&create(&bb, &pid, &nid, "edit").await?, 202)["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let s = wait_status(&bb, &pid, &nid, &mine, "running", START).await?;
    assert_eq!(
        s["opened_revision"], 2,
        "bob's session opened before alice's save"
    );
    let claim = data(&a.get(&claim_path).await?, 200);
    assert_eq!(claim["user_id"], "bob");
    assert_eq!(claim["transfer"], serde_json::Value::Null);
    data(&bb.delete(&session_path(&pid, &nid, &mine)).await?, 200);
    let claim = data(&a.get(&claim_path).await?, 200);
    assert_eq!(
        claim["session_id"],
        serde_json::Value::Null,
        "an ended session still holds the editor"
    );
    Ok(())
}

async fn shared_editors_attach(b: Backend) -> anyhow::Result<()> {
    let mut env = session_env(b).await?;
    env.set("UNICAS_HUB_EDITOR_MODE", "shared");
    let alice = env.user("alice")?;
    let bob = env.user("bob")?;
    let server = env.start()?;
    let (a, bb) = (server.client(Some(&alice)), server.client(Some(&bob)));
    let pid = a.project("P").await?;
    data(
        &a.put(
            &format!("/api/v1/projects/{pid}/members"),
            &json!({"user_id": "bob", "role": "editor"}),
        )
        .await?,
        200,
    );
    let nid = a.notebook(&pid, "N", &[("notebook.py", NOTEBOOK)]).await?;
    let held = data(&create(&a, &pid, &nid, "edit").await?, 202)["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    wait_status(&a, &pid, &nid, &held, "running", START).await?;
    let joined = data(&create(&bb, &pid, &nid, "edit").await?, 200);
    assert_eq!(
        joined["session_id"],
        held.as_str(),
        "bob did not attach to the holder"
    );
    assert!(
        joined["open_url"].is_string(),
        "a shared editor gets a link"
    );
    let bearer = format!("Bearer {bob}");
    let editor = Editor::open(&server.url, &held, &[("authorization", &bearer)]).await?;
    editor
        .save(&with_sum(&editor.codes(), 9), "notebook.py")
        .await?;
    drop(editor);
    data(&a.delete(&session_path(&pid, &nid, &held)).await?, 200);
    let (_, file) = a
        .get_bytes(&format!(
            "/api/v1/projects/{pid}/notebooks/{nid}/workspace/files/notebook.py"
        ))
        .await?;
    assert!(String::from_utf8_lossy(&file).contains("40 + 9"));
    Ok(())
}

async fn a_conflicting_save_keeps_the_edits_as_a_branch(b: Backend) -> anyhow::Result<()> {
    let env = session_env(b).await?;
    let alice = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&alice));
    let pid = a.project("P").await?;
    let nid = a.notebook(&pid, "N", &[("notebook.py", NOTEBOOK)]).await?;
    let sid = data(&create(&a, &pid, &nid, "edit").await?, 202)["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    wait_status(&a, &pid, &nid, &sid, "running", START).await?;
    let bearer = format!("Bearer {alice}");
    let editor = Editor::open(&server.url, &sid, &[("authorization", &bearer)]).await?;
    editor
        .save(&with_sum(&editor.codes(), 3), "notebook.py")
        .await?;
    drop(editor);
    // Someone saves the notebook through the API meanwhile.
    data(
        &a.save(&pid, &nid, Some(1), &[("README.md", "mine\n")], &[])
            .await?,
        201,
    );
    let ended = data(&a.delete(&session_path(&pid, &nid, &sid)).await?, 200);
    assert_eq!(ended["branched"], true, "{ended}");
    let branch = ended["saves_to"].as_str().unwrap_or_default().to_string();
    assert_ne!(branch, nid);
    let (_, file) = a
        .get_bytes(&format!(
            "/api/v1/projects/{pid}/notebooks/{branch}/workspace/files/notebook.py"
        ))
        .await?;
    assert!(
        String::from_utf8_lossy(&file).contains("40 + 3"),
        "the session's edit is not in the branch"
    );
    let (_, file) = a
        .get_bytes(&format!(
            "/api/v1/projects/{pid}/notebooks/{nid}/workspace/files/notebook.py"
        ))
        .await?;
    assert!(
        String::from_utf8_lossy(&file).contains("40 + 2"),
        "the conflicting save was overwritten"
    );
    Ok(())
}

hub_e2e!(exclusive_editor_and_takeover);

mod one_backend {
    use super::*;
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn shared_editors_attach() -> anyhow::Result<()> {
        super::shared_editors_attach(Backend::SQLITE_FS).await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_conflicting_save_keeps_the_edits_as_a_branch() -> anyhow::Result<()> {
        super::a_conflicting_save_keeps_the_edits_as_a_branch(Backend::SQLITE_FS).await
    }
}
