//! Class 3: depth and size bombs. A tree thousands of levels deep, or one whose paths double at
//! every level, is refused on every way a tree enters the hub (import, save, push) with a
//! clear 422, before anything is stored, and the hub's memory stays bounded; listings stream.

use serde_json::json;
use tests::hub::{HubClient, alice_with_project, data, hub_cas, refused, tar_header};
use tests::hub_e2e;
use tests::{Backend, leaf, svalue_node};

use crate::support::{archive, dir, dir_entry, file_entry, push, push_notebook, titles, version};

hub_e2e!(
    bombs_are_refused_on_every_way_in,
    listings_stream_whole_trees
);

/// An archive of one version whose tree is `depth` directories deep.
fn deep_archive(depth: usize) -> anyhow::Result<Vec<u8>> {
    let (l, lb) = leaf(b"x");
    let mut nodes = vec![lb];
    let (mut h, mut n) = svalue_node(&dir(vec![("f", file_entry(l, 1))]));
    for _ in 0..depth {
        nodes.push(n);
        (h, n) = svalue_node(&dir(vec![("d", dir_entry(h))]));
    }
    nodes.push(n);
    let (v, vb) = svalue_node(&version(h, 1, &[]));
    nodes.push(vb);
    archive(&nodes, &[v])
}

/// An archive of one version whose tree has 2^levels paths in `levels + 1` directories.
fn doubling_archive(levels: usize) -> anyhow::Result<Vec<u8>> {
    let (l, lb) = leaf(b"x");
    let mut nodes = vec![lb];
    let (mut h, mut n) = svalue_node(&dir(vec![("f", file_entry(l, 1))]));
    for _ in 0..levels {
        nodes.push(n);
        (h, n) = svalue_node(&dir(vec![("a", dir_entry(h)), ("b", dir_entry(h))]));
    }
    nodes.push(n);
    let (v, vb) = svalue_node(&version(h, 1, &[]));
    nodes.push(vb);
    archive(&nodes, &[v])
}

async fn import(
    a: &HubClient,
    pid: &str,
    title: &str,
    body: Vec<u8>,
) -> anyhow::Result<(reqwest::StatusCode, serde_json::Value)> {
    a.post_bytes(
        &format!("/api/v1/projects/{pid}/notebooks/import?title={title}"),
        "application/vnd.unicas.archive",
        body,
        &[],
    )
    .await
}

async fn bombs_are_refused_on_every_way_in(b: Backend) -> anyhow::Result<()> {
    let (env, server, a, pid, _) = alice_with_project(b).await?;
    let cas = hub_cas(&env, &server)?;
    let space = pid.parse()?;
    let before = cas.usage(&space).await?;
    let rss_before = server.peak_rss_mib()?;

    // Import: 3,000 levels (about 450 KB of archive), and 2^40 paths from 41 directories.
    let deep = deep_archive(3000)?;
    assert!(deep.len() < 1 << 20, "{} bytes", deep.len());
    let e = refused(
        &import(&a, &pid, "deep", deep).await?,
        422,
        "VALIDATION_ERROR",
    );
    assert!(
        e["message"].as_str().unwrap_or("").contains("deeper"),
        "{e}"
    );
    let e = refused(
        &import(&a, &pid, "paths", doubling_archive(40)?).await?,
        422,
        "VALIDATION_ERROR",
    );
    assert!(
        e["message"].as_str().unwrap_or("").contains("entries"),
        "{e}"
    );
    // Nothing was stored, nothing created.
    let after = cas.usage(&space).await?;
    assert_eq!(
        (after.node_count, after.ready_content_bytes),
        (before.node_count, before.ready_content_bytes),
        "a refused import stored nodes"
    );
    assert!(titles(&a, &pid).await?.is_empty());
    let rss_after = server.peak_rss_mib()?;
    assert!(
        rss_after - rss_before < 64.0,
        "the hub's peak memory grew from {rss_before:.0} to {rss_after:.0} MiB"
    );

    // Just within the limits, it is accepted.
    data(
        &import(&a, &pid, "deep-enough", deep_archive(62)?).await?,
        201,
    );

    // Save: a path of 65 components, and one of 1,025 bytes.
    let nid = a.notebook(&pid, "n", &[("a.py", "1")]).await?;
    let deep_path = vec!["d"; 65].join("/");
    let long_path = format!("{}/x", "a".repeat(1023));
    for path in [&deep_path, &long_path] {
        refused(
            &a.post(
                &format!("/api/v1/projects/{pid}/notebooks/{nid}/workspace"),
                &json!({"expected_revision": 1, "files": {path.as_str(): {"content": "x"}}}),
            )
            .await?,
            422,
            "VALIDATION_ERROR",
        );
    }
    // Push: the same path in a tar (a GNU long name carries it).
    let (_, token) = push_notebook(&a, &pid, "pushed").await?;
    refused(
        &push(&server.url, &token, long_name_tar(&deep_path)).await?,
        422,
        "VALIDATION_ERROR",
    );
    Ok(())
}

/// A tar of one empty file named `name` through a GNU long-name record.
fn long_name_tar(name: &str) -> Vec<u8> {
    let mut out = tar_header("././@LongLink", b'L', name.len() + 1, "").to_vec();
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out.extend_from_slice(&tar_header("placeholder", b'0', 0, ""));
    out.extend_from_slice(&[0u8; 1024]);
    out
}

async fn listings_stream_whole_trees(b: Backend) -> anyhow::Result<()> {
    let (_env, _server, a, pid, _) = alice_with_project(b).await?;
    // 600 files in 30 directories: the listing, streamed, is one JSON document, in order.
    let mut files = serde_json::Map::new();
    for d in 0..30 {
        for f in 0..20 {
            files.insert(
                format!("d{d:02}/f{f:03}.txt"),
                json!({"content": format!("{d}/{f}")}),
            );
        }
    }
    let created = data(
        &a.post(
            &format!("/api/v1/projects/{pid}/notebooks"),
            &json!({"title": "many", "files": files}),
        )
        .await?,
        201,
    );
    let nid = created["notebook"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let ws = data(
        &a.get(&format!("/api/v1/projects/{pid}/notebooks/{nid}/workspace"))
            .await?,
        200,
    );
    let entries = ws["entries"].as_array().cloned().unwrap_or_default();
    assert_eq!(entries.len(), 630);
    assert_eq!(ws["version"]["file_count"], 600);
    let paths: Vec<&str> = entries.iter().filter_map(|e| e["path"].as_str()).collect();
    assert_eq!(paths[0], "d00");
    assert_eq!(paths[1], "d00/f000.txt");
    assert_eq!(paths[629], "d29/f019.txt");
    Ok(())
}
