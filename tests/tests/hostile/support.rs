//! What the hostile tests share: archives built node by node, the hub's tree and version
//! nodes, directory listings and push helpers.

use std::path::Path;

use bytes::Bytes;
use cas_format::archive::{ArchiveLimits, ArchiveWriter};
use cas_format::{Hash, Value};
use reqwest::StatusCode;
use serde_json::{Value as Json, json};
use tests::hub::{HubClient, data};

/// Every path below `dir` (relative), links included, in order.
pub fn listing(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            out.push(
                path.strip_prefix(base)
                    .unwrap_or(&path)
                    .display()
                    .to_string(),
            );
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(base, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// A file entry of a hub tree.
pub fn file_entry(node: Hash, size: u64) -> Value {
    Value::map([
        ("kind", Value::from("file")),
        ("node", Value::Blob(node)),
        ("size", Value::from(size as i64)),
        ("chunked", Value::Bool(false)),
        ("executable", Value::Bool(false)),
    ])
}

/// A directory entry of a hub tree.
pub fn dir_entry(node: Hash) -> Value {
    Value::map([("kind", Value::from("dir")), ("node", Value::Blob(node))])
}

/// A directory node of a hub tree.
pub fn dir(entries: Vec<(&str, Value)>) -> Value {
    Value::map([
        ("kind", Value::from("dir")),
        (
            "entries",
            Value::Map(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
            ),
        ),
    ])
}

/// A version node as the hub exports it, over the tree `tree`, claiming what `claims` says.
pub fn version(tree: Hash, revision: i64, claims: &[(&str, Value)]) -> Value {
    let mut fields = vec![
        ("kind", Value::from("notebook-version")),
        ("schema_version", Value::from(1i64)),
        ("notebook_id", Value::from("nb-aaaaaaaaaaaaaaaa")),
        (
            "version_id",
            Value::from(format!("ver_01HZZZZZZZZZZZZZZZZZZZZZ{revision:02}").as_str()),
        ),
        ("revision", Value::from(revision)),
        ("saved_at", Value::from("2025-01-01T00:00:00Z")),
        ("author", Value::from("someone")),
        ("message", Value::from("imported")),
        ("source_kind", Value::from("save")),
        ("workspace", Value::Blob(tree)),
        ("file_count", Value::from(1i64)),
        ("size_bytes", Value::from(1i64)),
    ];
    for (k, v) in claims {
        fields.retain(|(f, _)| f != k);
        fields.push((k, v.clone()));
    }
    Value::map(fields)
}

/// An archive of `nodes` (children first); its roots are `roots`.
pub fn archive(nodes: &[Bytes], roots: &[Hash]) -> anyhow::Result<Vec<u8>> {
    let mut w = ArchiveWriter::new(Vec::new(), roots, ArchiveLimits::default())?;
    for n in nodes {
        w.write_node(n)?;
    }
    Ok(w.finish()?.0)
}

/// A push-synced notebook of `pid`: its id and sync token.
pub async fn push_notebook(
    a: &HubClient,
    pid: &str,
    title: &str,
) -> anyhow::Result<(String, String)> {
    let created = data(
        &a.post(
            &format!("/api/v1/projects/{pid}/notebooks"),
            &json!({"title": title, "source": {"type": "git", "sync_mode": "push"}}),
        )
        .await?,
        201,
    );
    Ok((
        created["notebook"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        created["sync_token"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    ))
}

/// Pushes `body` with `token` to the hub at `base`.
pub async fn push(base: &str, token: &str, body: Vec<u8>) -> anyhow::Result<(StatusCode, Json)> {
    HubClient::new(base, Some(token))
        .post_bytes("/api/sync/git/v1", "application/x-tar", body, &[])
        .await
}

/// The revisions of a notebook, newest first.
pub async fn revisions(a: &HubClient, pid: &str, nid: &str) -> anyhow::Result<Vec<i64>> {
    let v = data(
        &a.get(&format!("/api/v1/projects/{pid}/notebooks/{nid}/versions"))
            .await?,
        200,
    );
    Ok(v["items"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v["revision"].as_i64()).collect())
        .unwrap_or_default())
}

/// Live notebooks of a project, by title.
pub async fn titles(a: &HubClient, pid: &str) -> anyhow::Result<Vec<String>> {
    let v = data(
        &a.get(&format!("/api/v1/projects/{pid}/notebooks")).await?,
        200,
    );
    Ok(v["items"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n["title"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}
