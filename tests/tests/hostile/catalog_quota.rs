//! Class 2: one project must never block another. A user who fills their own project with
//! notebooks of maximal metadata meets a stated limit (422 `quota_exceeded`, never 500), and
//! every other user's catalog changes go on, each costing what its own project costs.

use serde_json::json;
use tests::Backend;
use tests::hub::{HubEnv, data, hub_cas, refused};
use tests::hub_e2e;

hub_e2e!(a_full_project_blocks_nobody_else);

async fn a_full_project_blocks_nobody_else(b: Backend) -> anyhow::Result<()> {
    let mut env = HubEnv::new(b).await?;
    env.set("UNICAS_HUB_PROJECT_MAX_BYTES", 96 << 10);
    env.set("UNICAS_HUB_MAX_NOTEBOOKS_PER_PROJECT", 30);
    env.set("UNICAS_HUB_MAX_PROJECTS_PER_USER", 2);
    let mallory_token = env.user("mallory")?;
    let alice_token = env.user("alice")?;
    let server = env.start()?;
    let m = server.client(Some(&mallory_token));
    let a = server.client(Some(&alice_token));
    let alice_pid = a.project("Alice's").await?;
    a.notebook(&alice_pid, "first", &[("a.py", "1")]).await?;

    // Mallory fills her project with the longest descriptions and the most tags allowed.
    let mp = m.project("Mallory's").await?;
    let description = "x".repeat(4096);
    let tags: Vec<String> = (0..32)
        .map(|i| format!("{i:02}{}", "t".repeat(62)))
        .collect();
    let mut created = 0;
    let refusal = loop {
        let got = m
            .post(
                &format!("/api/v1/projects/{mp}/notebooks"),
                &json!({"title": format!("n{created}"), "description": description, "tags": tags}),
            )
            .await?;
        if got.0 != 201 {
            break got;
        }
        created += 1;
        assert!(created < 30, "no limit on the project's metadata");
    };
    let e = refused(&refusal, 422, "quota_exceeded");
    assert_eq!(e["quota"], "project_bytes");
    assert_eq!(e["limit"], 96 << 10);
    assert!(created >= 5, "only {created} notebooks fit");
    // Growing an existing notebook's metadata meets the same limit.
    let list = data(
        &m.get(&format!("/api/v1/projects/{mp}/notebooks")).await?,
        200,
    );
    let first = list["items"][0]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let grown = m
        .patch(
            &format!("/api/v1/projects/{mp}/notebooks/{first}"),
            &json!({"description": "y".repeat(4096), "tags": tags}),
        )
        .await?;
    assert!(grown.0 == 200 || grown.0 == 422, "{}", grown.1);
    // A second project, then the per-user limit.
    let mp2 = m.project("Mallory's second").await?;
    refused(
        &m.post("/api/v1/projects", &json!({"name": "third"}))
            .await?,
        422,
        "quota_exceeded",
    );
    // The per-project count limit, with small notebooks.
    for i in 0..30 {
        m.post(
            &format!("/api/v1/projects/{mp2}/notebooks"),
            &json!({"title": format!("s{i}")}),
        )
        .await?;
    }
    let e = refused(
        &m.post(
            &format!("/api/v1/projects/{mp2}/notebooks"),
            &json!({"title": "one more"}),
        )
        .await?,
        422,
        "quota_exceeded",
    );
    assert_eq!(e["quota"], "notebooks_per_project");

    // Alice's changes go on, and each costs what her project costs, not the deployment.
    let cas = hub_cas(&env, &server)?;
    let catalog = "hub.catalog".parse()?;
    let before = cas.usage(&catalog).await?.ready_content_bytes;
    let nb = a.notebook(&alice_pid, "second", &[("b.py", "2")]).await?;
    data(
        &a.patch(
            &format!("/api/v1/projects/{alice_pid}/notebooks/{nb}"),
            &json!({"title": "renamed"}),
        )
        .await?,
        200,
    );
    let grew = cas.usage(&catalog).await?.ready_content_bytes - before;
    assert!(
        grew < 16 << 10,
        "two changes of a small project stored {grew} bytes of catalog (Mallory's project alone is ~90 KiB)"
    );
    let cat = data(&a.get("/api/v1/catalog").await?, 200);
    assert_eq!(cat["projects"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        cat["projects"][0]["notebooks"].as_array().map(Vec::len),
        Some(2)
    );
    Ok(())
}
