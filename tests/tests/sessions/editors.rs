//! The persistent editor: exclusive by default (a second editor is refused until they take
//! over, and the takeover saves the holder's changes first), or shared (editors attach to the
//! holder's sandbox); a save that conflicts keeps the session's edits as a branch.

use serde_json::json;
use tests::hub::{data, refused};
use tests::sessions::*;
use tests::*;

async fn exclusive_editor_and_takeover(b: Backend) -> anyhow::Result<()> {
    let env = session_env(b).await?;
    let bob = env.user("bob")?;
    let (alice, server, a, pid, nid) = alice_notebook(&env).await?;
    let bb = server.client(Some(&bob));
    add_member(&a, &pid, "bob", "editor").await?;
    let claim_path = format!("/api/v1/projects/{pid}/notebooks/{nid}/editor-session");

    let held = started(&a, &pid, &nid, "edit").await?;
    let claim = data(&bb.get(&claim_path).await?, 200);
    assert_eq!(claim["session_id"], held.as_str());
    assert_eq!(claim["user_id"], "alice");
    assert_eq!(claim["sharing"], "exclusive");
    edit_sum(&server.url, &held, &alice, 5).await?;

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
    add_member(&a, &pid, "carol", "viewer").await?;
    let takeover = format!("{claim_path}/takeover");
    refused(
        &server
            .client(Some(&carol))
            .post(&takeover, &json!({}))
            .await?,
        403,
        "FORBIDDEN",
    );

    // The takeover saves alice's change, stops her sandbox, and readies the editor for bob.
    let t = data(&bb.post(&takeover, &json!({})).await?, 200);
    assert_eq!(t["transfer"]["phase"], "ready", "{t}");
    assert_eq!(t["transfer"]["requested_by"], "bob");
    let old = data(&a.get(&session_path(&pid, &nid, &held)).await?, 200);
    assert_eq!(old["status"], "terminated");
    assert!(
        head_file(&a, &pid, &nid, "notebook.py")
            .await?
            .contains("40 + 5"),
        "alice's change was not saved first"
    );
    // Alice may not jump the queue; bob starts, on her saved revision, and holds it.
    refused(
        &create(&a, &pid, &nid, "edit").await?,
        409,
        "editor_claimed",
    );
    let mine = started(&bb, &pid, &nid, "edit").await?;
    let s = data(&bb.get(&session_path(&pid, &nid, &mine)).await?, 200);
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
    let bob = env.user("bob")?;
    let (_, server, a, pid, nid) = alice_notebook(&env).await?;
    let bb = server.client(Some(&bob));
    add_member(&a, &pid, "bob", "editor").await?;
    let held = started(&a, &pid, &nid, "edit").await?;
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
    edit_sum(&server.url, &held, &bob, 9).await?;
    data(&a.delete(&session_path(&pid, &nid, &held)).await?, 200);
    assert!(
        head_file(&a, &pid, &nid, "notebook.py")
            .await?
            .contains("40 + 9")
    );
    Ok(())
}

async fn a_conflicting_save_keeps_the_edits_as_a_branch(b: Backend) -> anyhow::Result<()> {
    let env = session_env(b).await?;
    let (alice, server, a, pid, nid) = alice_notebook(&env).await?;
    let sid = started(&a, &pid, &nid, "edit").await?;
    edit_sum(&server.url, &sid, &alice, 3).await?;
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
    assert!(
        head_file(&a, &pid, &branch, "notebook.py")
            .await?
            .contains("40 + 3"),
        "the session's edit is not in the branch"
    );
    assert!(
        head_file(&a, &pid, &nid, "notebook.py")
            .await?
            .contains("40 + 2"),
        "the conflicting save was overwritten"
    );
    Ok(())
}

hub_e2e!(exclusive_editor_and_takeover);
hub_e2e_on!(sqlite_fs => SQLITE_FS: shared_editors_attach, a_conflicting_save_keeps_the_edits_as_a_branch);
