//! App pools (seed 003) on real `marimo run` sandboxes: exactly as many visits are admitted as
//! the limits hold and the rest are refused with 429 and `Retry-After`; a departed visit gets
//! its slot back within the grace and loses it after; a lapsed lease frees its slot; a new
//! revision gets new sandboxes while old visits keep theirs; a restart reserves one
//! replacement; a sandbox killed from outside is noticed and replaced; only visitors reach a
//! sandbox through the proxy.

use std::time::Duration;

use anyhow::{Context, bail, ensure};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tests::hub::{HubClient, data};
use tests::sessions::*;
use tests::*;

/// Admits `visit`; answers the status, the body and `Retry-After`.
async fn admit(
    c: &HubClient,
    pid: &str,
    nid: &str,
    visit: &str,
) -> anyhow::Result<(StatusCode, Value, Option<String>)> {
    let resp = c
        .request(
            reqwest::Method::POST,
            &format!("/api/v1/projects/{pid}/notebooks/{nid}/sessions"),
        )
        .json(&json!({"mode": "app", "app_visit_id": visit}))
        .send()
        .await?;
    let status = resp.status();
    let retry = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let v = serde_json::from_slice(&resp.bytes().await?).unwrap_or(Value::Null);
    Ok((status, v, retry))
}

/// The sandbox a visit was admitted to.
async fn admitted(c: &HubClient, pid: &str, nid: &str, visit: &str) -> anyhow::Result<String> {
    let (s, v, _) = admit(c, pid, nid, visit).await?;
    if !s.is_success() {
        bail!("admitting {visit}: {s} {v}");
    }
    Ok(v["data"]["app_assignment"]["sandbox_id"]
        .as_str()
        .context("sandbox_id")?
        .to_string())
}

async fn pool(c: &HubClient, pid: &str, nid: &str) -> anyhow::Result<Value> {
    Ok(data(
        &c.get(&format!("/api/v1/projects/{pid}/notebooks/{nid}/app-pool"))
            .await?,
        200,
    ))
}

fn visit_path(pid: &str, nid: &str, visit: &str, what: &str) -> String {
    format!("/api/v1/projects/{pid}/notebooks/{nid}/app-pool/visits/{visit}/{what}")
}

async fn a_full_pool_admits_exactly_its_slots(b: Backend) -> anyhow::Result<()> {
    let mut env = session_env(b).await?;
    env.set("UNICAS_HUB_APP_MAX_VISITS_PER_SESSION", 2)
        .set("UNICAS_HUB_APP_MAX_SESSIONS_PER_VERSION", 3);
    let bob = env.user("bob")?;
    let (_, server, a, pid, nid) = alice_notebook(&env).await?;
    add_member(&a, &pid, "bob", "viewer").await?;
    let tries: Vec<_> = (0..50)
        .map(|i| {
            let (a, pid, nid) = (a.clone(), pid.clone(), nid.clone());
            tokio::spawn(async move { admit(&a, &pid, &nid, &format!("tab-{i}")).await })
        })
        .collect();
    let (mut admitted_n, mut full) = (0, 0);
    let mut first_in = None;
    let mut sandboxes = std::collections::BTreeMap::<String, usize>::new();
    for t in tries {
        let (s, v, retry) = t.await??;
        if s.is_success() {
            admitted_n += 1;
            first_in.get_or_insert_with(|| v["data"]["app_assignment"]["visit_id"].clone());
            let sb = v["data"]["app_assignment"]["sandbox_id"]
                .as_str()
                .unwrap_or_default();
            *sandboxes.entry(sb.to_string()).or_default() += 1;
            assert_eq!(v["data"]["max_users_per_session"], 2, "{v}");
            assert_eq!(v["data"]["max_users"], 6, "{v}");
        } else {
            ensure!(s == StatusCode::TOO_MANY_REQUESTS, "{s} {v}");
            assert_eq!(v["error"]["code"], "app_pool_full", "{v}");
            ensure!(
                retry.is_some_and(|r| r.parse::<u32>().is_ok_and(|n| n >= 1)),
                "no Retry-After"
            );
            full += 1;
        }
    }
    assert_eq!((admitted_n, full), (6, 44));
    assert_eq!(sandboxes.len(), 3, "{sandboxes:?}");
    assert!(sandboxes.values().all(|n| *n == 2), "{sandboxes:?}");
    let p = pool(&a, &pid, &nid).await?;
    let members = p["members"].as_array().context("members")?;
    assert_eq!(members.len(), 3, "{p}");
    for m in members {
        assert_eq!(m["visits"], 2, "{p}");
        let sb = m["sandbox_id"].as_str().unwrap_or_default();
        wait_status(&a, &pid, &nid, sb, "running", Duration::from_secs(120)).await?;
    }
    assert!(
        pool(&a, &pid, &nid).await?["members"]
            .as_array()
            .context("members")?
            .iter()
            .all(|m| m["state"] == "ready")
    );
    // A retried visit keeps its slot; another is still refused.
    let first_in = first_in.context("an admitted visit")?;
    let (s, v, _) = admit(&a, &pid, &nid, first_in.as_str().unwrap_or_default()).await?;
    ensure!(s == StatusCode::OK || s.is_success(), "{s} {v}");
    assert_eq!(v["data"]["app_assignment"]["routed"], "reused");
    let (s, _, _) = admit(&a, &pid, &nid, "tab-new").await?;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    // The proxy admits visitors only: bob sees the app once he holds a slot.
    let sb = v["data"]["app_assignment"]["sandbox_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let page = format!("{}/s/{sb}/", server.url);
    let http = reqwest::Client::new();
    assert_eq!(
        http.get(&page).bearer_auth(&bob).send().await?.status(),
        404
    );
    let alice_page = a
        .request(reqwest::Method::GET, &format!("/s/{sb}/"))
        .send()
        .await?;
    assert_eq!(alice_page.status(), 200);
    let metrics = a.get_bytes("/metrics").await?;
    let text = String::from_utf8_lossy(&metrics.1);
    assert!(
        text.contains("unicas_hub_app_pool_admission_total{outcome=\"full\"} 45"),
        "{text}"
    );
    assert!(text.contains("unicas_hub_app_pool_visits 6"), "{text}");
    Ok(())
}

async fn visits_leave_lapse_and_come_back(b: Backend) -> anyhow::Result<()> {
    let mut env = session_env(b).await?;
    env.set("UNICAS_HUB_APP_MAX_VISITS_PER_SESSION", 1)
        .set("UNICAS_HUB_APP_MAX_SESSIONS_PER_VERSION", 1)
        .set("UNICAS_HUB_APP_VISIT_LEASE_MS", 4000)
        .set("UNICAS_HUB_APP_GRACE_MS", 1500);
    let bob = env.user("bob")?;
    let (_, server, a, pid, nid) = alice_notebook(&env).await?;
    add_member(&a, &pid, "bob", "viewer").await?;
    let s1 = admitted(&a, &pid, &nid, "tab-a").await?;
    // A visit id is printable ASCII without spaces; another account's visit is not one's own.
    let (s, v, _) = admit(&a, &pid, &nid, "has space").await?;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let b = server.client(Some(&bob));
    for what in ["heartbeat", "departure"] {
        let (s, v) = b
            .post(&visit_path(&pid, &nid, "tab-a", what), &json!({}))
            .await?;
        assert_eq!(s, StatusCode::NOT_FOUND, "{what}: {v}");
    }
    let (s, _, _) = admit(&a, &pid, &nid, "tab-b").await?;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    // Within the grace, the same visit gets its slot back.
    data(
        &a.post(&visit_path(&pid, &nid, "tab-a", "departure"), &json!({}))
            .await?,
        200,
    );
    assert_eq!(admitted(&a, &pid, &nid, "tab-a").await?, s1);
    let (s, _, _) = admit(&a, &pid, &nid, "tab-b").await?;
    assert_eq!(
        s,
        StatusCode::TOO_MANY_REQUESTS,
        "a reconnected visit keeps its slot"
    );
    // After it, the slot is someone else's; the departed visit must be admitted again.
    data(
        &a.post(&visit_path(&pid, &nid, "tab-a", "departure"), &json!({}))
            .await?,
        200,
    );
    tokio::time::sleep(Duration::from_millis(1700)).await;
    assert_eq!(
        admitted(&a, &pid, &nid, "tab-b").await?,
        s1,
        "the sandbox is filled, not a new one"
    );
    let (s, v) = a
        .post(&visit_path(&pid, &nid, "tab-a", "heartbeat"), &json!({}))
        .await?;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    // Heartbeats keep a slot past its lease; without them it lapses.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        data(
            &a.post(&visit_path(&pid, &nid, "tab-b", "heartbeat"), &json!({}))
                .await?,
            200,
        );
    }
    let (s, _, _) = admit(&a, &pid, &nid, "tab-c").await?;
    assert_eq!(
        s,
        StatusCode::TOO_MANY_REQUESTS,
        "a renewed lease still holds its slot"
    );
    tokio::time::sleep(Duration::from_millis(4200)).await;
    assert_eq!(
        admitted(&a, &pid, &nid, "tab-c").await?,
        s1,
        "a lapsed lease frees its slot"
    );
    Ok(())
}

async fn new_revisions_restarts_and_killed_sandboxes(b: Backend) -> anyhow::Result<()> {
    let mut env = session_env(b).await?;
    env.set("UNICAS_HUB_APP_MAX_VISITS_PER_SESSION", 1)
        .set("UNICAS_HUB_APP_MAX_SESSIONS_PER_VERSION", 1);
    let (_, _server, a, pid, nid) = alice_notebook(&env).await?;
    let old = admitted(&a, &pid, &nid, "tab-a").await?;
    wait_status(&a, &pid, &nid, &old, "running", Duration::from_secs(120)).await?;
    // A new revision: new visits get a sandbox on it; the old one drains with its visit.
    data(
        &a.save(&pid, &nid, Some(1), &[("extra.txt", "2")], &[])
            .await?,
        201,
    );
    let new = admitted(&a, &pid, &nid, "tab-b").await?;
    assert_ne!(new, old);
    assert_eq!(
        admitted(&a, &pid, &nid, "tab-a").await?,
        old,
        "an existing visit keeps its version"
    );
    let p = pool(&a, &pid, &nid).await?;
    let state = |p: &Value, sb: &str| {
        p["members"]
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m["sandbox_id"] == sb))
            .map(|m| m["state"].as_str().unwrap_or_default().to_string())
    };
    assert_eq!(state(&p, &old).as_deref(), Some("draining"), "{p}");
    assert_eq!(p["revision"], 2);
    wait_status(&a, &pid, &nid, &new, "running", Duration::from_secs(120)).await?;

    // A restart reserves one replacement, however often it is asked for.
    let restart = format!("/api/v1/projects/{pid}/notebooks/{nid}/app-pool/members/{new}/restart");
    let r1 = data(&a.post(&restart, &json!({})).await?, 200);
    let r2 = data(&a.post(&restart, &json!({})).await?, 200);
    ensure!(
        r1 == r2,
        "a repeated restart answers the same replacement: {r1} {r2}"
    );
    let replacement = r1.as_str().context("replacement")?.to_string();
    let (s, _) = a
        .post(&visit_path(&pid, &nid, "tab-b", "heartbeat"), &json!({}))
        .await?;
    assert_eq!(
        s,
        StatusCode::NOT_FOUND,
        "visits on a restarted sandbox are admitted again"
    );
    wait_status(&a, &pid, &nid, &new, "terminated", Duration::from_secs(60)).await?;
    wait_status(
        &a,
        &pid,
        &nid,
        &replacement,
        "running",
        Duration::from_secs(120),
    )
    .await?;
    assert_eq!(admitted(&a, &pid, &nid, "tab-b").await?, replacement);

    // Killed from outside: noticed, dropped from the pool, replaced on the next admission.
    let record: Value = serde_json::from_slice(&std::fs::read(
        session_dir(&env, &replacement).join("sandbox.json"),
    )?)?;
    let pgid = record["pid"].as_i64().context("pid")?;
    let killed = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .status()?;
    ensure!(killed.success(), "kill failed");
    wait_status(
        &a,
        &pid,
        &nid,
        &replacement,
        "failed",
        Duration::from_secs(30),
    )
    .await?;
    let next = admitted(&a, &pid, &nid, "tab-b").await?;
    assert_ne!(next, replacement);
    wait_status(&a, &pid, &nid, &next, "running", Duration::from_secs(120)).await?;
    Ok(())
}

/// Two hub processes over one database admit exactly the slots between them.
async fn two_hubs_admit_exactly_the_slots(b: Backend) -> anyhow::Result<()> {
    let mut env = session_env(b).await?;
    env.set("UNICAS_HUB_APP_MAX_VISITS_PER_SESSION", 2)
        .set("UNICAS_HUB_APP_MAX_SESSIONS_PER_VERSION", 3);
    let _cas = env.separate_cas()?;
    let token = env.user("alice")?;
    let (h1, h2) = (env.start()?, env.start()?);
    let (c1, c2) = (h1.client(Some(&token)), h2.client(Some(&token)));
    let pid = c1.project("P").await?;
    let nid = c1.notebook(&pid, "N", &[("notebook.py", NOTEBOOK)]).await?;
    let tries: Vec<_> = (0..50)
        .map(|i| {
            let c = if i % 2 == 0 { c1.clone() } else { c2.clone() };
            let (pid, nid) = (pid.clone(), nid.clone());
            tokio::spawn(async move { admit(&c, &pid, &nid, &format!("tab-{i}")).await })
        })
        .collect();
    let mut codes = std::collections::BTreeMap::<u16, usize>::new();
    for t in tries {
        let (s, v, retry) = t.await??;
        ensure!(s.is_success() || (s == 429 && retry.is_some()), "{s} {v}");
        *codes
            .entry(if s.is_success() { 200 } else { 429 })
            .or_default() += 1;
    }
    assert_eq!(codes, [(200, 6), (429, 44)].into(), "{codes:?}");
    let p = pool(&c2, &pid, &nid).await?;
    let members = p["members"].as_array().context("members")?;
    assert_eq!(members.len(), 3, "{p}");
    assert!(members.iter().all(|m| m["visits"] == 2), "{p}");
    for m in members {
        let sb = m["sandbox_id"].as_str().unwrap_or_default();
        wait_status(&c1, &pid, &nid, sb, "running", Duration::from_secs(120)).await?;
    }
    Ok(())
}

/// A sandbox whose last slot was released retires once the app idle timeout has passed.
async fn an_unused_sandbox_retires(b: Backend) -> anyhow::Result<()> {
    let mut env = session_env(b).await?;
    env.set("UNICAS_HUB_SESSION_APP_IDLE_TIMEOUT_SECONDS", 1)
        .set("UNICAS_HUB_APP_GRACE_MS", 300);
    let (alice, server, a, pid, nid) = alice_notebook(&env).await?;
    let sb = admitted(&a, &pid, &nid, "tab-a").await?;
    wait_status(&a, &pid, &nid, &sb, "running", Duration::from_secs(120)).await?;
    // Held, it stays past the idle timeout.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(800)).await;
        data(
            &a.post(&visit_path(&pid, &nid, "tab-a", "heartbeat"), &json!({}))
                .await?,
            200,
        );
    }
    assert_eq!(pool(&a, &pid, &nid).await?["members"][0]["state"], "ready");
    // A page still connected to the kernel keeps it after its slot is released.
    let bearer = format!("Bearer {alice}");
    let page = Editor::open(&server.url, &sb, &[("authorization", &bearer)]).await?;
    data(
        &a.post(&visit_path(&pid, &nid, "tab-a", "departure"), &json!({}))
            .await?,
        200,
    );
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let s = data(&a.get(&session_path(&pid, &nid, &sb)).await?, 200);
    assert_eq!(
        s["status"], "running",
        "retired under an open connection: {s}"
    );
    drop(page);
    wait_status(&a, &pid, &nid, &sb, "expired", Duration::from_secs(30)).await?;
    assert_eq!(
        pool(&a, &pid, &nid).await?["members"],
        json!([]),
        "an unused pool scales to zero"
    );
    // The next visit starts a new one.
    assert_ne!(admitted(&a, &pid, &nid, "tab-b").await?, sb);
    Ok(())
}

hub_e2e!(
    two_hubs_admit_exactly_the_slots,
    an_unused_sandbox_retires,
    a_full_pool_admits_exactly_its_slots,
    visits_leave_lapse_and_come_back,
    new_revisions_restarts_and_killed_sandboxes
);
