//! Personal access tokens (seed 000 §4.11): scoped tokens (credential version 2) that only ever
//! reduce their user's authority; `last_used_at`, refreshed at most once a UTC day; at most 20
//! live tokens per user, counted in the transaction that creates one.

use anyhow::{Context, ensure};
use serde_json::{Value, json};
use tests::hub::{HubClient, HubEnv, data, refused};
use tests::*;

async fn new_token(c: &HubClient, body: Value) -> anyhow::Result<(reqwest::StatusCode, Value)> {
    c.post("/api/v1/auth/tokens", &body).await
}

fn ids(page: &Value) -> Vec<String> {
    page["items"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| p["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

async fn scoped_tokens_only_reduce_authority(b: Backend) -> anyhow::Result<()> {
    let env = HubEnv::new(b).await?;
    let alice = env.user("alice")?;
    let bob = env.user("bob")?;
    let server = env.start()?;
    let a = server.client(Some(&alice));
    let p1 = a.project("One").await?;
    let p2 = a.project("Two").await?;
    data(
        &a.put(
            &format!("/api/v1/projects/{p1}/members"),
            &json!({"user_id": "bob", "role": "viewer"}),
        )
        .await?,
        200,
    );

    let made = data(
        &new_token(
            &a,
            json!({"name": "ci", "scope": {"projects": [p1], "role": "viewer"}}),
        )
        .await?,
        201,
    );
    assert_eq!(made["credential_version"], 2);
    assert_eq!(made["scope"]["projects"], json!([p1]));
    let scoped = server.client(Some(made["token"].as_str().context("token")?));
    let one = data(&scoped.get(&format!("/api/v1/projects/{p1}")).await?, 200);
    assert_eq!(one["role"], "viewer", "the owner's token acts as a viewer");
    refused(
        &scoped.get(&format!("/api/v1/projects/{p2}")).await?,
        404,
        "NOT_FOUND",
    );
    assert_eq!(
        ids(&data(&scoped.get("/api/v1/projects").await?, 200)),
        std::slice::from_ref(&p1)
    );
    refused(
        &scoped
            .post(
                &format!("/api/v1/projects/{p1}/notebooks"),
                &json!({"title": "n"}),
            )
            .await?,
        403,
        "FORBIDDEN",
    );
    refused(
        &scoped
            .post("/api/v1/projects", &json!({"name": "new"}))
            .await?,
        403,
        "FORBIDDEN",
    );
    refused(&scoped.get("/api/v1/auth/tokens").await?, 403, "FORBIDDEN");
    refused(
        &new_token(&scoped, json!({"name": "more"})).await?,
        403,
        "FORBIDDEN",
    );

    // Every project, as an editor: creates notebooks, but is no manager.
    let wide = data(
        &new_token(
            &a,
            json!({"name": "wide", "scope": {"projects": "*", "role": "editor"}}),
        )
        .await?,
        201,
    );
    let wide = server.client(Some(wide["token"].as_str().context("token")?));
    data(
        &wide
            .post(
                &format!("/api/v1/projects/{p2}/notebooks"),
                &json!({"title": "n"}),
            )
            .await?,
        201,
    );
    refused(
        &wide
            .patch(&format!("/api/v1/projects/{p2}"), &json!({"name": "x"}))
            .await?,
        403,
        "FORBIDDEN",
    );
    data(
        &wide
            .post("/api/v1/projects", &json!({"name": "by a wide token"}))
            .await?,
        201,
    );

    // A grant above the user's role grants nothing more: bob stays a viewer.
    let bobs = server.client(Some(&bob));
    let made = data(
        &new_token(
            &bobs,
            json!({"name": "up", "scope": {"projects": [p1], "role": "manager"}}),
        )
        .await?,
        201,
    );
    let up = server.client(Some(made["token"].as_str().context("token")?));
    assert_eq!(
        data(&up.get(&format!("/api/v1/projects/{p1}")).await?, 200)["role"],
        "viewer"
    );
    refused(
        &up.post(
            &format!("/api/v1/projects/{p1}/notebooks"),
            &json!({"title": "n"}),
        )
        .await?,
        403,
        "FORBIDDEN",
    );

    // Malformed scopes create nothing.
    let many: Vec<String> = (0..101).map(|i| format!("proj-{i:016}")).collect();
    for scope in [
        json!({"projects": [], "role": "viewer"}),
        json!({"projects": many, "role": "viewer"}),
        json!({"projects": [p1, p1], "role": "viewer"}),
        json!({"projects": "all", "role": "viewer"}),
        json!({"projects": "*", "role": "admin"}),
        json!({"projects": "*"}),
    ] {
        let (st, v) = new_token(&a, json!({"name": "bad", "scope": scope})).await?;
        ensure!(st == 422, "{scope}: {st} {v}");
    }
    let listed = data(&a.get("/api/v1/auth/tokens").await?, 200);
    ensure!(
        !listed
            .as_array()
            .context("tokens")?
            .iter()
            .any(|t| t["name"] == "bad"),
        "{listed}"
    );
    Ok(())
}

async fn tokens_record_use_and_are_capped(b: Backend) -> anyhow::Result<()> {
    let env = HubEnv::new(b).await?;
    let alice = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&alice));
    let made = data(
        &new_token(&a, json!({"name": "fresh", "expires_in_days": 30})).await?,
        201,
    );
    assert_eq!(made["credential_version"], 1);
    assert!(made.get("last_used_at").is_none(), "never used: {made}");
    assert!(made["expires_at"].as_str().is_some());
    let fresh_id = made["id"].as_str().context("id")?.to_string();
    let fresh = server.client(Some(made["token"].as_str().context("token")?));
    data(&fresh.get("/api/v1/auth/me").await?, 200);
    let used = |list: &Value| -> Option<String> {
        list.as_array()?
            .iter()
            .find(|t| t["id"] == fresh_id.as_str())
            .and_then(|t| t["last_used_at"].as_str().map(str::to_string))
    };
    let first = used(&data(&a.get("/api/v1/auth/tokens").await?, 200)).context("last_used_at")?;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    data(&fresh.get("/api/v1/auth/me").await?, 200);
    let again = used(&data(&a.get("/api/v1/auth/tokens").await?, 200)).context("last_used_at")?;
    assert_eq!(first, again, "touched at most once a UTC day");

    // At most 20 live tokens, however many creates race for the last places.
    let live = data(&a.get("/api/v1/auth/tokens").await?, 200)
        .as_array()
        .map(Vec::len)
        .unwrap_or_default();
    for i in live..15 {
        data(&new_token(&a, json!({"name": format!("t{i}")})).await?, 201);
    }
    let racers: Vec<_> = (0..10)
        .map(|i| {
            let a = a.clone();
            tokio::spawn(async move { new_token(&a, json!({"name": format!("race{i}")})).await })
        })
        .collect();
    let (mut made, mut refused_n) = (0, 0);
    for r in racers {
        let (st, v) = r.await??;
        match st.as_u16() {
            201 => made += 1,
            409 => refused_n += 1,
            _ => anyhow::bail!("{st} {v}"),
        }
    }
    assert_eq!((made, refused_n), (5, 5), "exactly the places left");
    let list = data(&a.get("/api/v1/auth/tokens").await?, 200);
    assert_eq!(list.as_array().map(Vec::len), Some(20));
    data(
        &a.delete(&format!("/api/v1/auth/tokens/{fresh_id}")).await?,
        200,
    );
    refused(&fresh.get("/api/v1/auth/me").await?, 401, "UNAUTHORIZED");
    data(
        &new_token(&a, json!({"name": "after a revoke"})).await?,
        201,
    );
    Ok(())
}

e2e!(
    scoped_tokens_only_reduce_authority,
    tokens_record_use_and_are_capped
);
