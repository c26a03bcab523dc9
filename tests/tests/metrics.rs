//! `/metrics` after a mixed workload: every family an operator of a write-heavy deployment
//! watches is there, and its counts match what was sent.

use std::collections::BTreeMap;
use std::time::Duration;

use cas_format::Hash;
use tests::*;

async fn a_scrape_counts_what_was_sent(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let started = std::time::Instant::now();
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("s");
    // Five nodes stored (lease, upload, lease), one with a lease that runs out at once, one
    // larger than what the service holds in its database until packed.
    let mut stored = Vec::new();
    for i in 0..5u32 {
        let content = match i {
            4 => tests::content::text(4, 100_000),
            _ => format!("node {i}").into_bytes(),
        };
        let (h, bytes) = leaf(&content);
        let lease = if i == 0 { 1_000 } else { 600_000 };
        client.ensure_node(&sp, &h, &bytes, lease).await?;
        stored.push(h);
    }
    // Two nodes stored inline by one batch lease.
    let inline: Vec<_> = (0..2u32)
        .map(|i| leaf(format!("inline {i}").as_bytes()))
        .collect();
    let elements = inline
        .iter()
        .map(|(h, p)| cas_format::wire::BatchLeaseElement {
            hash: *h,
            lease_duration_ms: 600_000,
            upload_bytes: None,
            content: Some(base64::Engine::encode(
                &base64::engine::general_purpose::STANDARD,
                p,
            )),
            content_bytes: None,
            delta_base: None,
        })
        .collect();
    client.lease_batch(&sp, elements).await?;
    // One upload slot left open.
    let (open, _) = leaf(b"leased, never uploaded");
    client.lease_node(&sp, &open, 600_000, None).await?;
    // Three root-ref updates.
    for i in 0..3usize {
        let changes: BTreeMap<Hash, i64> = [(stored[1 + i], 1)].into();
        client
            .update_root_refs(&sp, &format!("m:{i}").parse()?, changes)
            .await?;
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let text = reqwest::get(format!("{}/metrics", server.url))
        .await?
        .text()
        .await?;
    let root_refs = r#"{method="POST",route="/v1/cas/root-refs",status="200"}"#;
    assert_eq!(
        metric(&text, &format!("unicas_http_requests_total{root_refs}")),
        3.0,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            &format!("unicas_http_request_duration_seconds_count{root_refs}")
        ),
        3.0
    );
    let batch = r#"{method="POST",route="/v1/cas/leases",status="200"}"#;
    assert_eq!(
        metric(&text, &format!("unicas_http_requests_total{batch}")),
        1.0
    );
    // Writes: every batch begun is committed (nothing failed), and the commits hold at least
    // the three root-ref updates and the seven publications.
    let commits = metric(&text, "unicas_commit_batch_operations_count");
    let operations = metric(&text, "unicas_commit_batch_operations_sum");
    assert!(
        commits >= 1.0 && operations >= 10.0 && operations >= commits,
        "{text}"
    );
    assert_eq!(
        metric(&text, "unicas_commit_duration_seconds_count"),
        commits
    );
    assert_eq!(metric(&text, "unicas_commit_failures_total"), 0.0);
    let turns = metric(&text, "unicas_gate_wait_seconds_count");
    assert!(turns >= operations);
    // Every operation of a commit gave up its turn before the commit, having held it a while,
    // but not for the whole run (a background one may hold its turn as the scrape is taken).
    let gave_up = metric(&text, "unicas_gate_hold_seconds_count");
    assert!(gave_up >= operations && gave_up <= turns, "{text}");
    let held = metric(&text, "unicas_gate_hold_seconds_sum");
    assert!(
        held > 0.0 && held < started.elapsed().as_secs_f64(),
        "{text}"
    );
    let begun = metric(&text, "unicas_database_begin_wait_seconds_count");
    assert!(begun >= commits && begun <= metric(&text, "unicas_gate_wait_seconds_count"));
    // The object store: one object written, for the large node (the six small ones are held
    // in their rows until packed), and timed.
    let puts = metric(
        &text,
        r#"unicas_object_store_requests_total{operation="put",outcome="ok"}"#,
    );
    assert_eq!(puts, 1.0, "{text}");
    assert_eq!(
        metric(
            &text,
            r#"unicas_object_store_duration_seconds_count{operation="put"}"#
        ),
        1.0
    );
    // What is outstanding: six running leases, one open upload slot, one node for GC.
    assert_eq!(metric(&text, "unicas_leases_outstanding"), 6.0, "{text}");
    assert_eq!(metric(&text, "unicas_upload_slots_outstanding"), 1.0);
    assert_eq!(metric(&text, "unicas_gc_backlog_nodes"), 1.0);
    assert!(metric(&text, "unicas_gc_lag_seconds") >= 0.0);
    // Every family the published dashboard plots is served.
    let dashboard = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/grafana-dashboard.json"
    ))?;
    let mut plotted: Vec<&str> = dashboard
        .match_indices("unicas_")
        .map(|(i, _)| {
            let rest = &dashboard[i..];
            let end = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit()))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect();
    plotted.sort();
    plotted.dedup();
    assert!(plotted.len() >= 12, "{plotted:?}");
    for name in plotted {
        assert!(
            text.lines().any(|l| l.starts_with(name)),
            "the dashboard plots {name}, which /metrics does not serve"
        );
    }
    // After GC the backlog empties (counted again once the recount is due) and the deletion
    // is counted.
    let pass = client.gc(&sp, None).await?;
    assert_eq!(pass.deleted, 1);
    let text = reqwest::get(format!("{}/metrics", server.url))
        .await?
        .text()
        .await?;
    assert_eq!(metric(&text, "unicas_gc_deleted_nodes_total"), 1.0);
    Ok(())
}

e2e!(a_scrape_counts_what_was_sent);
