//! The hub's `/metrics`: requests by route and status with their latency, the outbox backlog,
//! session records by status and the sandboxes a process runs; movable to a listener of its
//! own, or off.

use tests::hub::*;
use tests::*;

async fn the_hub_counts_what_it_serves(b: Backend) -> anyhow::Result<()> {
    let (_env, server, a, pid, _token) = alice_with_project(b).await?;
    for _ in 0..3 {
        data(&a.get(&format!("/api/v1/projects/{pid}")).await?, 200);
    }
    let text = reqwest::get(format!("{}/metrics", server.url))
        .await?
        .text()
        .await?;
    let ok = r#"{method="GET",route="/api/v1/projects/{pid}",status="200"}"#;
    assert_eq!(
        metric(&text, &format!("unicas_hub_http_requests_total{ok}")),
        3.0,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            &format!("unicas_hub_http_request_duration_seconds_count{ok}")
        ),
        3.0
    );
    assert!(!text.contains(&pid), "route templates, never ids: {text}");
    // Nothing waits in the outbox once the project's root refs are confirmed.
    assert_eq!(metric(&text, "unicas_hub_outbox_pending"), 0.0, "{text}");
    assert_eq!(metric(&text, "unicas_hub_outbox_oldest_seconds"), 0.0);
    for status in ["starting", "running", "terminated", "failed", "expired"] {
        assert_eq!(
            metric(
                &text,
                &format!("unicas_hub_sessions{{status=\"{status}\"}}")
            ),
            0.0,
            "{text}"
        );
    }
    assert_eq!(metric(&text, "unicas_hub_sandboxes"), 0.0);
    Ok(())
}

async fn metrics_can_move_or_go(b: Backend) -> anyhow::Result<()> {
    let env = tests::hub::HubEnv::new(b).await?;
    let off = env.start_with(&[("UNICAS_HUB_METRICS_LISTEN", "off")])?;
    let r = reqwest::get(format!("{}/metrics", off.url)).await?;
    assert_eq!(r.status(), 404);
    drop(off);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let addr = format!("127.0.0.1:{port}");
    let own = env.start_with(&[("UNICAS_HUB_METRICS_LISTEN", &addr)])?;
    assert_eq!(
        reqwest::get(format!("{}/metrics", own.url)).await?.status(),
        404
    );
    let mut text = String::new();
    for _ in 0..50 {
        if let Ok(r) = reqwest::get(format!("http://{addr}/metrics")).await {
            text = r.text().await?;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        text.contains("unicas_hub_outbox_pending"),
        "no metrics on their own listener: {text:?}"
    );
    Ok(())
}

hub_e2e!(the_hub_counts_what_it_serves, metrics_can_move_or_go);
