//! Projects beyond their metadata (seed 000 §4.3, §7.4, §11, §12): deleting a project puts it in
//! the trash, from where it is restored or purged (by a manager, or by the maintenance pass
//! once its time is over), and a purge leaves its Space holding nothing once GC runs; a
//! project's default access for non-members; members invited by email before they have an
//! account; catalog snapshots kept for their retention, listed and recovered by an operator.

use std::time::Duration;

use anyhow::{Context, ensure};
use cas_format::{Hash, SpaceId};
use serde_json::{Value, json};
use tests::hub::{HubClient, HubEnv, HubServer, data, hub_cas, refused};
use tests::*;

fn s(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// A super admin's token.
fn root_token(env: &HubEnv) -> anyhow::Result<String> {
    env.cli(&["user", "create", "root", "--super-admin"])?;
    Ok(env
        .cli(&["token", "create", "--user", "root"])?
        .trim()
        .to_string())
}

async fn event_names(c: &HubClient, pid: &str) -> anyhow::Result<Vec<String>> {
    let v = data(&c.get("/api/v1/events?limit=500").await?, 200);
    Ok(v["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter(|e| e["project_id"] == pid || e["project_id"].is_null())
        .map(|e| s(&e["event"]))
        .collect())
}

/// GC passes over `space` until one deletes nothing; answers its usage then.
async fn collect(
    env: &HubEnv,
    server: &HubServer,
    space: &str,
) -> anyhow::Result<cas_format::wire::Usage> {
    let cas = hub_cas(env, server)?;
    let space: SpaceId = space.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    for _ in 0..50 {
        if cas.gc(&space, None).await?.deleted == 0 {
            break;
        }
    }
    Ok(cas.usage(&space).await?)
}

async fn projects_go_to_the_trash_and_come_back(b: Backend) -> anyhow::Result<()> {
    let mut env = HubEnv::new(b).await?;
    // Leases end 2 s after they are taken, so a purge can be followed by GC.
    env.set("UNICAS_LEASE_MAX_MS", 2000);
    let alice = env.user("alice")?;
    let bob = env.user("bob")?;
    let root = root_token(&env)?;
    let server = env.start()?;
    let a = server.client(Some(&alice));
    let pid = a.project("Doomed").await?;
    let keep = a.project("Kept").await?;
    let nid = a.notebook(&pid, "nb", &[("a.py", "x = 1\n")]).await?;
    data(
        &a.save(&pid, &nid, Some(1), &[("a.py", "x = 2\n")], &[])
            .await?,
        201,
    );
    let gone = a.notebook(&pid, "trashed", &[("b.py", "y = 1\n")]).await?;
    data(
        &a.delete(&format!("/api/v1/projects/{pid}/notebooks/{gone}"))
            .await?,
        200,
    );
    data(
        &a.put(
            &format!("/api/v1/projects/{pid}/members"),
            &json!({"user_id": "bob", "role": "viewer"}),
        )
        .await?,
        200,
    );
    let b_client = server.client(Some(&bob));
    // A viewer cannot delete it.
    refused(
        &b_client.delete(&format!("/api/v1/projects/{pid}")).await?,
        403,
        "FORBIDDEN",
    );

    data(&a.delete(&format!("/api/v1/projects/{pid}")).await?, 200);
    for c in [&a, &b_client] {
        refused(
            &c.get(&format!("/api/v1/projects/{pid}")).await?,
            404,
            "NOT_FOUND",
        );
        refused(
            &c.get(&format!("/api/v1/projects/{pid}/notebooks/{nid}"))
                .await?,
            404,
            "NOT_FOUND",
        );
    }
    let listed = data(&a.get("/api/v1/projects").await?, 200);
    let ids: Vec<String> = listed["items"]
        .as_array()
        .context("items")?
        .iter()
        .map(|p| s(&p["id"]))
        .collect();
    assert_eq!(
        ids,
        std::slice::from_ref(&keep),
        "a trashed project is listed nowhere but the trash"
    );
    refused(
        &a.post(
            &format!("/api/v1/projects/{pid}/notebooks"),
            &json!({"title": "late"}),
        )
        .await?,
        404,
        "NOT_FOUND",
    );
    let trash = data(&a.get("/api/v1/projects/trash").await?, 200);
    assert_eq!(trash.as_array().map(Vec::len), Some(1), "{trash}");
    assert_eq!(trash[0]["id"], pid.as_str());
    assert_eq!(trash[0]["notebook_count"], 2);
    assert_eq!(trash[0]["deleted_by"], "alice");
    assert!(trash[0]["purge_after"].as_str().is_some(), "{trash}");
    // Only managers see it there, and only they restore it.
    assert_eq!(
        data(&b_client.get("/api/v1/projects/trash").await?, 200),
        json!([])
    );
    refused(
        &b_client
            .post(&format!("/api/v1/projects/{pid}/restore"), &json!({}))
            .await?,
        404,
        "NOT_FOUND",
    );

    // Restored with everything it held.
    let back = data(
        &a.post(&format!("/api/v1/projects/{pid}/restore"), &json!({}))
            .await?,
        200,
    );
    assert_eq!(back["notebook_count"], 1, "{back}");
    let v = data(
        &a.get(&format!("/api/v1/projects/{pid}/notebooks/{nid}/versions"))
            .await?,
        200,
    );
    assert_eq!(v["items"].as_array().map(Vec::len), Some(2), "{v}");
    let t = data(&a.get(&format!("/api/v1/projects/{pid}/trash")).await?, 200);
    assert_eq!(
        t.as_array().map(Vec::len),
        Some(1),
        "its own trash too: {t}"
    );
    refused(
        &a.post(&format!("/api/v1/projects/{pid}/restore"), &json!({}))
            .await?,
        404,
        "NOT_FOUND",
    );

    // Purged: every root of its notebooks is released; GC then leaves its Space empty.
    let before = collect(&env, &server, &pid).await?;
    ensure!(before.node_count > 0, "{before:?}");
    data(&a.delete(&format!("/api/v1/projects/{pid}")).await?, 200);
    data(
        &a.post(&format!("/api/v1/projects/{pid}/purge"), &json!({}))
            .await?,
        200,
    );
    assert_eq!(
        data(&a.get("/api/v1/projects/trash").await?, 200),
        json!([])
    );
    refused(
        &a.post(&format!("/api/v1/projects/{pid}/restore"), &json!({}))
            .await?,
        404,
        "NOT_FOUND",
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let after = collect(&env, &server, &pid).await?;
    assert_eq!(
        after.node_count, 0,
        "nothing of a purged project is left: {after:?}"
    );
    let r = server.client(Some(&root));
    let names = event_names(&r, &pid).await?;
    for e in ["project.delete", "project.restore", "project.purge"] {
        ensure!(names.iter().any(|n| n == e), "{e} in {names:?}");
    }
    server.terminate()?;

    // The maintenance pass purges what stayed in the trash past its retention.
    env.set("UNICAS_HUB_PROJECT_TRASH_RETENTION", "1s")
        .set("UNICAS_HUB_MAINTENANCE_INTERVAL", "1s");
    let server = env.start()?;
    let a = server.client(Some(&alice));
    let nb = a.notebook(&keep, "kept nb", &[("k.py", "k = 1\n")]).await?;
    let _ = nb;
    data(&a.delete(&format!("/api/v1/projects/{keep}")).await?, 200);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let trash = data(&a.get("/api/v1/projects/trash").await?, 200);
        if trash == json!([]) {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "never purged: {trash}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(collect(&env, &server, &keep).await?.node_count, 0);
    Ok(())
}

async fn default_access_and_invitations(b: Backend) -> anyhow::Result<()> {
    let mut env = HubEnv::new(b).await?;
    env.set("UNICAS_HUB_DEFAULT_ROLE", "viewer");
    let alice = env.user("alice")?;
    env.cli(&["user", "create", "carol", "--email", "carol@example.com"])?;
    let carol = env
        .cli(&["token", "create", "--user", "carol"])?
        .trim()
        .to_string();
    env.cli(&["user", "create", "erin", "--email", "Erin@Example.com"])?;
    let root = root_token(&env)?;
    let server = env.start()?;
    let a = server.client(Some(&alice));
    let c = server.client(Some(&carol));
    let pid = a.project("Access").await?;
    let p = format!("/api/v1/projects/{pid}");

    // Inherit: the deployment's default (viewer here).
    assert_eq!(data(&a.get(&p).await?, 200)["default_role"], "inherit");
    assert_eq!(data(&c.get(&p).await?, 200)["role"], "viewer");
    refused(
        &c.post(&format!("{p}/notebooks"), &json!({"title": "n"}))
            .await?,
        403,
        "FORBIDDEN",
    );
    // `none` overrides it; `editor` grants more; `inherit` goes back.
    let v = data(&a.patch(&p, &json!({"default_role": "none"})).await?, 200);
    assert_eq!(v["default_role"], "none");
    refused(&c.get(&p).await?, 404, "NOT_FOUND");
    data(&a.patch(&p, &json!({"default_role": "editor"})).await?, 200);
    assert_eq!(data(&c.get(&p).await?, 200)["role"], "editor");
    data(
        &c.post(&format!("{p}/notebooks"), &json!({"title": "by carol"}))
            .await?,
        201,
    );
    // Only managers change it; a default is never a manager's role.
    refused(
        &c.patch(&p, &json!({"default_role": "editor"})).await?,
        403,
        "FORBIDDEN",
    );
    let (st, _) = a.patch(&p, &json!({"default_role": "manager"})).await?;
    assert_eq!(st, 422);
    data(
        &a.patch(&p, &json!({"default_role": "inherit"})).await?,
        200,
    );
    assert_eq!(data(&c.get(&p).await?, 200)["role"], "viewer");
    data(&a.patch(&p, &json!({"default_role": "none"})).await?, 200);

    // An email with no account waits; a user created with it becomes a member.
    let inv = format!("{p}/invitations");
    let v = data(
        &a.post(
            &inv,
            &json!({"email": "Dave@Example.com", "role": "editor"}),
        )
        .await?,
        201,
    );
    assert_eq!(v["status"], "invited");
    assert_eq!(v["invitation"]["email"], "dave@example.com");
    let listed = data(&a.get(&inv).await?, 200);
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    refused(&c.get(&inv).await?, 404, "NOT_FOUND");
    let (st, v) = a
        .post(&inv, &json!({"email": "not an email", "role": "editor"}))
        .await?;
    assert_eq!(st, 422, "{v}");
    env.cli(&["user", "create", "dave", "--email", "dave@example.com"])?;
    let dave = env
        .cli(&["token", "create", "--user", "dave"])?
        .trim()
        .to_string();
    let d = server.client(Some(&dave));
    assert_eq!(data(&d.get(&p).await?, 200)["role"], "editor");
    assert_eq!(data(&a.get(&inv).await?, 200), json!([]), "claimed");
    // An email a user has makes them a member at once (emails compare without case).
    let v = data(
        &a.post(
            &inv,
            &json!({"email": "erin@example.com", "role": "viewer"}),
        )
        .await?,
        200,
    );
    assert_eq!(v["status"], "member");
    let members = v["project"]["members"]
        .as_array()
        .context("members")?
        .clone();
    assert!(
        members
            .iter()
            .any(|m| m["user_id"] == "erin" && m["role"] == "viewer"),
        "{v}"
    );
    // A withdrawn invitation is not claimed.
    data(
        &a.post(
            &inv,
            &json!({"email": "frank@example.com", "role": "viewer"}),
        )
        .await?,
        201,
    );
    data(&a.delete(&format!("{inv}/frank@example.com")).await?, 200);
    refused(
        &a.delete(&format!("{inv}/frank@example.com")).await?,
        404,
        "NOT_FOUND",
    );
    env.cli(&["user", "create", "frank", "--email", "frank@example.com"])?;
    let v = data(&a.get(&p).await?, 200);
    assert!(
        !v["members"]
            .as_array()
            .context("members")?
            .iter()
            .any(|m| m["user_id"] == "frank")
    );
    // An invitation to a project in the trash waits with it and costs no change per request;
    // restored, it is claimed on the next one.
    let q = a.project("Paused").await?;
    data(
        &a.post(
            &format!("/api/v1/projects/{q}/invitations"),
            &json!({"email": "gina@example.com", "role": "viewer"}),
        )
        .await?,
        201,
    );
    data(&a.delete(&format!("/api/v1/projects/{q}")).await?, 200);
    env.cli(&["user", "create", "gina", "--email", "gina@example.com"])?;
    let gina = env
        .cli(&["token", "create", "--user", "gina"])?
        .trim()
        .to_string();
    let g = server.client(Some(&gina));
    let before = snapshots(&env, false)?.len();
    for _ in 0..3 {
        data(&g.get("/api/v1/projects").await?, 200);
    }
    assert_eq!(
        snapshots(&env, false)?.len(),
        before,
        "no catalog change per request"
    );
    data(
        &a.post(&format!("/api/v1/projects/{q}/restore"), &json!({}))
            .await?,
        200,
    );
    assert_eq!(
        data(&g.get(&format!("/api/v1/projects/{q}")).await?, 200)["role"],
        "viewer"
    );
    let r = server.client(Some(&root));
    let names = event_names(&r, &pid).await?;
    ensure!(names.iter().any(|n| n == "project.invite"), "{names:?}");
    Ok(())
}

/// The catalog's kept snapshots in `unicas-hub catalog list`, newest first.
fn snapshots(env: &HubEnv, all: bool) -> anyhow::Result<Vec<Value>> {
    let args: &[&str] = if all {
        &["catalog", "list", "--all"]
    } else {
        &["catalog", "list"]
    };
    env.cli(args)?
        .lines()
        .map(|l| Ok(serde_json::from_str(l)?))
        .collect()
}

async fn the_catalog_history_is_kept_and_recoverable(b: Backend) -> anyhow::Result<()> {
    let mut env = HubEnv::new(b).await?;
    let alice = env.user("alice")?;
    let root = root_token(&env)?;
    let server = env.start()?;
    let cas_url = server.cas_url.clone().context("embedded CAS")?;
    let a = server.client(Some(&alice));
    let pid = a.project("Good name").await?;
    let first = a.notebook(&pid, "first", &[("a.py", "a = 1\n")]).await?;
    let good = snapshots(&env, false)?;
    let good_id = s(&good[0]["snapshot_id"]);
    assert_eq!(good[0]["current"], true);
    assert_eq!(good[0]["operation"], "notebook.create");
    // The bad changes: a notebook, then a rename.
    let late = a.notebook(&pid, "late", &[("b.py", "b = 1\n")]).await?;
    data(
        &a.patch(
            &format!("/api/v1/projects/{pid}"),
            &json!({"name": "Bad name"}),
        )
        .await?,
        200,
    );
    let kept = snapshots(&env, false)?;
    let bad_id = s(&kept[0]["snapshot_id"]);
    ensure!(kept.len() >= 5, "every change is kept: {kept:?}");
    assert!(kept.iter().filter(|k| k["current"] == true).count() == 1);

    let out = env.cli(&["catalog", "recover", &good_id, "--cas-url", &cas_url])?;
    let report: Value = serde_json::from_str(out.trim())?;
    assert_eq!(report["unlisted"], json!([late]), "{report}");
    let p = data(&a.get(&format!("/api/v1/projects/{pid}")).await?, 200);
    assert_eq!(p["name"], "Good name");
    data(
        &a.get(&format!("/api/v1/projects/{pid}/notebooks/{first}"))
            .await?,
        200,
    );
    refused(
        &a.get(&format!("/api/v1/projects/{pid}/notebooks/{late}"))
            .await?,
        404,
        "NOT_FOUND",
    );
    let now = snapshots(&env, false)?;
    assert_eq!(now[0]["operation"], "catalog.recover");
    assert_eq!(now[0]["previous_snapshot_id"], bad_id.as_str());
    let r = server.client(Some(&root));
    ensure!(
        event_names(&r, &pid)
            .await?
            .iter()
            .any(|n| n == "catalog.recover")
    );
    // Recovering the bad one brings the late notebook back: nothing was lost.
    env.cli(&["catalog", "recover", &bad_id, "--cas-url", &cas_url])?;
    data(
        &a.get(&format!("/api/v1/projects/{pid}/notebooks/{late}"))
            .await?,
        200,
    );
    let err = env.cli(&["catalog", "recover", "snap-nope", "--cas-url", &cas_url]);
    ensure!(err.is_err(), "an unknown snapshot is refused");

    // Retention: the maintenance pass releases all but the current and previous snapshots,
    // in one negative delta; their roots lose their root ref.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    env.set("UNICAS_HUB_CATALOG_RETENTION", "1s");
    let report: Value =
        serde_json::from_str(env.cli(&["maintenance", "--cas-url", &cas_url])?.trim())?;
    // Seven snapshots (the first, two creates, a notebook, a rename, two recoveries): all but
    // the last two are released.
    ensure!(report["snapshots_released"] == 5, "{report}");
    let kept = snapshots(&env, false)?;
    assert_eq!(kept.len(), 2, "current and previous: {kept:?}");
    let all = snapshots(&env, true)?;
    let cas = hub_cas(&env, &server)?;
    let space: SpaceId = "hub.catalog".parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    for snap in &all {
        let hash: Hash = s(&snap["hash"])
            .parse()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let released = !snap["released_at_ms"].is_null();
        let refs = cas
            .read_metadata(&space, &hash)
            .await
            .map(|m| m.state.root_ref_count)
            .unwrap_or(0);
        assert_eq!(refs, i64::from(!released), "{snap}");
    }
    let released = all
        .iter()
        .find(|s| !s["released_at_ms"].is_null())
        .context("one released")?;
    let err = env.cli(&[
        "catalog",
        "recover",
        &s(&released["snapshot_id"]),
        "--cas-url",
        &cas_url,
    ]);
    ensure!(err.is_err(), "a released snapshot cannot be recovered");
    // The hub still reads its catalog.
    assert_eq!(
        data(&a.get(&format!("/api/v1/projects/{pid}")).await?, 200)["name"],
        "Bad name"
    );
    Ok(())
}

e2e!(
    projects_go_to_the_trash_and_come_back,
    default_access_and_invitations,
    the_catalog_history_is_kept_and_recoverable
);
