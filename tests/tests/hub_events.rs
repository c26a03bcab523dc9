//! Audit reads: a project's events for one UTC day beside its pages, and every project's
//! events for super admins over at most 30 UTC days, newest first, paged by cursor.

use serde_json::{Value, json};
use tests::hub::HubEnv;
use tests::*;

fn ids(page: &Value) -> Vec<String> {
    page["data"]["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["id"].as_str().map(str::to_string))
        .collect()
}

async fn events_by_day_and_across_projects(b: Backend) -> anyhow::Result<()> {
    let env = HubEnv::new(b).await?;
    let server = env.start()?;
    let token = server.admin_token().expect("an admin token on first start");
    let c = server.client(Some(&token));
    let mut projects = Vec::new();
    for name in ["Alpha", "Beta"] {
        let (status, v) = c.post("/api/v1/projects", &json!({"name": name})).await?;
        assert_eq!(status, 201, "{v}");
        projects.push(v["data"]["id"].as_str().unwrap_or_default().to_string());
    }
    let own = format!("/api/v1/projects/{}/events", projects[0]);
    let (status, all) = c.get(&own).await?;
    assert_eq!(status, 200, "{all}");
    assert!(!ids(&all).is_empty(), "{all}");
    let today = all["data"]["items"][0]["ts"].as_str().unwrap_or_default()[..10].to_string();

    // One UTC day of one project.
    let (status, day) = c.get(&format!("{own}?date={today}")).await?;
    assert_eq!(status, 200, "{day}");
    assert_eq!(ids(&day), ids(&all));
    let (_, past) = c.get(&format!("{own}?date=2000-01-01")).await?;
    assert!(ids(&past).is_empty(), "{past}");
    for bad in ["2026-13-40", "yesterday", "2026-1-1"] {
        let (status, v) = c.get(&format!("{own}?date={bad}")).await?;
        assert_eq!(status, 422, "{bad}: {v}");
    }

    // Every project's, newest first, for a super admin.
    let (status, every) = c.get("/api/v1/events").await?;
    assert_eq!(status, 200, "{every}");
    let items = every["data"]["items"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for p in &projects {
        assert!(
            items.iter().any(|e| e["project_id"] == p.as_str()),
            "{p}: {every}"
        );
    }
    let event_ids = ids(&every);
    let mut newest_first = event_ids.clone();
    newest_first.sort_by(|a, b| b.cmp(a));
    assert_eq!(event_ids, newest_first);
    let (_, ranged) = c
        .get(&format!("/api/v1/events?from={today}&to={today}"))
        .await?;
    assert_eq!(ids(&ranged), event_ids);
    let (_, page) = c.get("/api/v1/events?limit=1").await?;
    let cursor = page["data"]["next_cursor"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(ids(&page), event_ids[..1]);
    let (_, next) = c
        .get(&format!("/api/v1/events?limit=1&cursor={cursor}"))
        .await?;
    assert_eq!(ids(&next), event_ids[1..2]);
    for (query, why) in [
        ("from=2000-01-01&to=2000-03-01", "more than 30 days"),
        ("from=2000-01-02&to=2000-01-01", "to before from"),
        ("from=2000-02-30", "no such day"),
    ] {
        let (status, v) = c.get(&format!("/api/v1/events?{query}")).await?;
        assert_eq!(status, 422, "{why}: {v}");
    }
    let (status, v) = c
        .get("/api/v1/events?from=2000-01-01&to=2000-01-30")
        .await?;
    assert_eq!(status, 200, "30 days is allowed: {v}");
    assert!(ids(&v).is_empty(), "{v}");

    // Not for anyone else, not even a project's manager.
    let bob = env.user("bob")?;
    let (status, v) = server.client(Some(&bob)).get("/api/v1/events").await?;
    assert_eq!(status, 403, "{v}");
    Ok(())
}

e2e!(events_by_day_and_across_projects);
