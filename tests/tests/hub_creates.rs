//! Idempotent creates (seed 000 §13): a `POST /projects` or `POST …/notebooks` with an
//! `Idempotency-Key` creates once; a retry answers the first answer (marked
//! `Idempotency-Replayed: true`), whether the first answer was seen, lost with a dropped
//! connection, or never made because the hub was killed before its local commit; the same key
//! with another body is 422 `idempotency_key_reused`; keys belong to their user and route.

use std::time::Duration;

use anyhow::{Context, ensure};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tests::hub::{HubClient, HubEnv, data, refused};
use tests::*;
use tokio::io::AsyncWriteExt;

/// A create with `key`; answers the status, body and whether it was marked a replay.
async fn create(
    c: &HubClient,
    path: &str,
    key: &str,
    body: &Value,
) -> anyhow::Result<(StatusCode, Value, bool)> {
    let resp = c
        .request(reqwest::Method::POST, path)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await?;
    let status = resp.status();
    let replayed = resp
        .headers()
        .get("idempotency-replayed")
        .is_some_and(|v| v == "true");
    let v = serde_json::from_slice(&resp.bytes().await?).unwrap_or(Value::Null);
    Ok((status, v, replayed))
}

/// Ids of the caller's projects named `name`.
async fn projects_named(c: &HubClient, name: &str) -> anyhow::Result<Vec<String>> {
    let v = data(&c.get("/api/v1/projects?limit=500").await?, 200);
    Ok(v["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter(|p| p["name"] == name)
        .filter_map(|p| p["id"].as_str().map(str::to_string))
        .collect())
}

async fn notebooks_titled(c: &HubClient, pid: &str, title: &str) -> anyhow::Result<usize> {
    let v = data(
        &c.get(&format!("/api/v1/projects/{pid}/notebooks?limit=500"))
            .await?,
        200,
    );
    Ok(v["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter(|n| n["title"] == title)
        .count())
}

async fn a_key_creates_once(b: Backend) -> anyhow::Result<()> {
    let env = HubEnv::new(b).await?;
    let alice = env.user("alice")?;
    let bob = env.user("bob")?;
    let server = env.start()?;
    let a = server.client(Some(&alice));
    let body = json!({"name": "Ledger", "tags": ["x"]});
    let (s, first, replayed) = create(&a, "/api/v1/projects", "k-1", &body).await?;
    ensure!(s == 201 && !replayed, "{s} {first}");
    let (s, again, replayed) = create(&a, "/api/v1/projects", "k-1", &body).await?;
    ensure!(s == 201 && replayed, "a retry is a replay: {s} {again}");
    assert_eq!(again, first, "the same answer");
    assert_eq!(projects_named(&a, "Ledger").await?.len(), 1);
    // The same key with another body is refused and creates nothing.
    let (s, v, _) = create(&a, "/api/v1/projects", "k-1", &json!({"name": "Other"})).await?;
    ensure!(s == 422, "{s} {v}");
    assert_eq!(v["error"]["code"], "idempotency_key_reused");
    assert!(projects_named(&a, "Other").await?.is_empty());
    // Keys are the user's: bob's k-1 is his own create.
    let b_client = server.client(Some(&bob));
    let (s, v, replayed) = create(&b_client, "/api/v1/projects", "k-1", &body).await?;
    ensure!(s == 201 && !replayed, "{s} {v}");
    assert_ne!(v["data"]["id"], first["data"]["id"]);
    // A bad key is refused before anything happens.
    for bad in ["", &"k".repeat(256)] {
        let (s, v, _) = create(&a, "/api/v1/projects", bad, &json!({"name": "Bad"})).await?;
        ensure!(s == 422, "key {bad:?}: {s} {v}");
    }
    assert!(projects_named(&a, "Bad").await?.is_empty());
    // Without a key, two creates are two projects.
    for _ in 0..2 {
        data(
            &a.post("/api/v1/projects", &json!({"name": "Twice"}))
                .await?,
            201,
        );
    }
    assert_eq!(projects_named(&a, "Twice").await?.len(), 2);

    // Notebooks: the key is per route (per project).
    let pid = first["data"]["id"].as_str().context("id")?.to_string();
    let path = format!("/api/v1/projects/{pid}/notebooks");
    let nb = json!({"title": "Report", "files": {"a.py": {"content": "x = 1\n"}}});
    let (s, made, replayed) = create(&a, &path, "k-1", &nb).await?;
    ensure!(s == 201 && !replayed, "{s} {made}");
    assert_eq!(made["data"]["revision"]["revision"], 1, "{made}");
    let (s, again, replayed) = create(&a, &path, "k-1", &nb).await?;
    ensure!(s == 201 && replayed, "{s} {again}");
    assert_eq!(again, made);
    assert_eq!(notebooks_titled(&a, &pid, "Report").await?, 1);
    let (s, v, _) = create(&a, &path, "k-1", &json!({"title": "Report 2"})).await?;
    ensure!(
        s == 422 && v["error"]["code"] == "idempotency_key_reused",
        "{s} {v}"
    );
    // A push-synced notebook's token is shown once: a replay answers without it.
    let git = json!({"title": "Pushed", "source": {"type": "git", "provider": "github", "sync_mode": "push"}});
    let (s, made, _) = create(&a, &path, "k-git", &git).await?;
    ensure!(s == 201, "{s} {made}");
    assert!(made["data"]["sync_token"].as_str().is_some(), "{made}");
    let (s, again, replayed) = create(&a, &path, "k-git", &git).await?;
    ensure!(s == 201 && replayed, "{s} {again}");
    assert!(again["data"].get("sync_token").is_none(), "{again}");
    assert_eq!(again["data"]["notebook"], made["data"]["notebook"]);

    // Concurrent retries of one key make one project.
    let racers: Vec<_> = (0..8)
        .map(|_| {
            let a = a.clone();
            tokio::spawn(async move {
                create(&a, "/api/v1/projects", "k-race", &json!({"name": "Raced"})).await
            })
        })
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    for r in racers {
        let (s, v, _) = r.await??;
        ensure!(s == 201, "{s} {v}");
        ids.insert(v["data"]["id"].as_str().unwrap_or_default().to_string());
    }
    assert_eq!(ids.len(), 1, "every racer answers the one project");
    assert_eq!(projects_named(&a, "Raced").await?.len(), 1);
    Ok(())
}

/// Sends a create over a raw connection and drops the connection before the answer comes (the
/// hub is slowed down after its root-ref update); the client never sees that answer.
async fn send_and_drop(base: &str, token: &str, key: &str, body: &Value) -> anyhow::Result<()> {
    let addr = base.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let body = body.to_string();
    let req = format!(
        "POST /api/v1/projects HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nIdempotency-Key: {key}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await?;
    s.flush().await?;
    tokio::time::sleep(Duration::from_millis(400)).await;
    drop(s);
    Ok(())
}

async fn a_retry_after_a_lost_answer_makes_one_project(b: Backend) -> anyhow::Result<()> {
    let env = HubEnv::new(b).await?;
    let alice = env.user("alice")?;
    env.start()?.terminate()?;

    // 1. The connection drops while the hub is between its root-ref update and its commit; the
    // retry comes at once and must wait for that create, then answer it.
    let server = env.start_with(&[("UNICAS_FAILPOINTS", "hub-after-root-refs=delay:1500")])?;
    let a = server.client(Some(&alice));
    let body = json!({"name": "Dropped"});
    send_and_drop(&a.base, &alice, "lost-1", &body).await?;
    let (s, v, replayed) = create(&a, "/api/v1/projects", "lost-1", &body).await?;
    ensure!(s == 201 && replayed, "{s} {v}");
    let ids = projects_named(&a, "Dropped").await?;
    assert_eq!(
        ids,
        [v["data"]["id"].as_str().unwrap_or_default()],
        "one project"
    );
    server.kill();

    // 2. The hub is killed after the root-ref update, before its local commit: nobody answers.
    // On restart recovery commits the create with its record, and the retry replays it.
    let server = env.start_with(&[("UNICAS_FAILPOINTS", "hub-before-local-commit=pause")])?;
    let a = server.client(Some(&alice));
    let body = json!({"name": "Crashed", "description": "killed mid-create"});
    let pending = {
        let (a, body) = (a.clone(), body.clone());
        tokio::spawn(async move { create(&a, "/api/v1/projects", "lost-2", &body).await })
    };
    server
        .wait_for_log(
            "failpoint hub-before-local-commit reached",
            Duration::from_secs(30),
        )
        .await?;
    server.kill();
    ensure!(
        pending.await?.is_err(),
        "the killed create must not have been answered"
    );
    let server = env.start()?;
    let a = server.client(Some(&alice));
    let (s, v, replayed) = create(&a, "/api/v1/projects", "lost-2", &body).await?;
    ensure!(s == 201 && replayed, "{s} {v}");
    let ids = projects_named(&a, "Crashed").await?;
    assert_eq!(
        ids,
        [v["data"]["id"].as_str().unwrap_or_default()],
        "one project"
    );
    assert_eq!(v["data"]["description"], "killed mid-create");
    // The audit log holds one create of it.
    let pid = &ids[0];
    let ev = data(
        &a.get(&format!("/api/v1/projects/{pid}/events")).await?,
        200,
    );
    let creates = ev["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter(|e| e["event"] == "project.create")
        .count();
    assert_eq!(creates, 1, "{ev}");
    // Nothing else is left half done: a new key creates a new project.
    let (s, v, replayed) =
        create(&a, "/api/v1/projects", "lost-3", &json!({"name": "After"})).await?;
    ensure!(s == 201 && !replayed, "{s} {v}");
    refused(
        &a.get("/api/v1/projects/not-a-project").await?,
        404,
        "NOT_FOUND",
    );
    Ok(())
}

/// The maintenance pass forgets idempotency records and events past their retention: a key
/// then creates again, and the audit log holds only what is recent.
async fn old_records_are_forgotten(b: Backend) -> anyhow::Result<()> {
    let mut env = HubEnv::new(b).await?;
    let alice = env.user("alice")?;
    let server = env.start()?;
    let cas_url = server.cas_url.clone().context("embedded CAS")?;
    let a = server.client(Some(&alice));
    let (s, first, _) = create(&a, "/api/v1/projects", "old", &json!({"name": "Old"})).await?;
    ensure!(s == 201, "{s} {first}");
    let pid = first["data"]["id"].as_str().context("id")?.to_string();
    let events = |v: &Value| v["items"].as_array().map(Vec::len).unwrap_or_default();
    let before = data(
        &a.get(&format!("/api/v1/projects/{pid}/events")).await?,
        200,
    );
    ensure!(events(&before) >= 1, "{before}");
    // Nothing is old enough under the defaults (24 hours, 365 days).
    let report: Value =
        serde_json::from_str(env.cli(&["maintenance", "--cas-url", &cas_url])?.trim())?;
    assert_eq!(
        (&report["idempotency_deleted"], &report["events_deleted"]),
        (&json!(0), &json!(0))
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    env.set("UNICAS_HUB_IDEMPOTENCY_RETENTION", "1s")
        .set("UNICAS_HUB_EVENT_RETENTION", "1s");
    let report: Value =
        serde_json::from_str(env.cli(&["maintenance", "--cas-url", &cas_url])?.trim())?;
    ensure!(report["idempotency_deleted"] == 1, "{report}");
    ensure!(
        report["events_deleted"].as_u64().is_some_and(|n| n >= 1),
        "{report}"
    );
    let after = data(
        &a.get(&format!("/api/v1/projects/{pid}/events")).await?,
        200,
    );
    assert_eq!(events(&after), 0, "{after}");
    let (s, again, replayed) =
        create(&a, "/api/v1/projects", "old", &json!({"name": "Old"})).await?;
    ensure!(
        s == 201 && !replayed,
        "a forgotten key creates again: {s} {again}"
    );
    assert_ne!(again["data"]["id"], first["data"]["id"]);
    Ok(())
}

e2e!(
    a_key_creates_once,
    a_retry_after_a_lost_answer_makes_one_project,
    old_records_are_forgotten
);
