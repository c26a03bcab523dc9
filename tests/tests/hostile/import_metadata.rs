//! Class 7: imported metadata is not trusted. What a version holds (files, bytes) is computed
//! from its verified tree, its author is the importer (the archive's claim is kept as data),
//! a tree that lies about a file's size is refused before anything is stored, and no sum can
//! overflow.

use cas_format::Value;
use tests::hub::{alice_with_project, data, hub_cas, refused};
use tests::{Backend, hub_e2e, leaf, svalue_node};

use crate::support::{archive, dir, file_entry, titles, version};

hub_e2e!(imported_claims_are_recomputed);

async fn imported_claims_are_recomputed(b: Backend) -> anyhow::Result<()> {
    let (env, server, a, pid, _) = alice_with_project(b).await?;
    let import = |title: &str, body: Vec<u8>| {
        let a = a.clone();
        let path = format!("/api/v1/projects/{pid}/notebooks/import?title={title}");
        async move {
            a.post_bytes(&path, "application/vnd.unicas.archive", body, &[])
                .await
        }
    };
    let huge = Value::from((1i64 << 53) - 1);
    let (l, lb) = leaf(b"hello");

    // A tree that claims 2^50 bytes for a 5-byte file: refused, nothing stored.
    let (lying, lying_node) = svalue_node(&dir(vec![("a.txt", file_entry(l, 1 << 50))]));
    let (v, vb) = svalue_node(&version(lying, 1, &[]));
    let cas = hub_cas(&env, &server)?;
    let space = pid.parse()?;
    let before = cas.usage(&space).await?.node_count;
    let e = refused(
        &import("lies", archive(&[lb.clone(), lying_node, vb], &[v])?).await?,
        422,
        "VALIDATION_ERROR",
    );
    assert!(
        e["message"].as_str().unwrap_or("").contains("claims"),
        "{e}"
    );
    assert_eq!(cas.usage(&space).await?.node_count, before);
    assert!(titles(&a, &pid).await?.is_empty());

    // An honest tree under a version that claims an author and counts of its own.
    let (tree, tree_node) = svalue_node(&dir(vec![("a.txt", file_entry(l, 5))]));
    let (v, vb) = svalue_node(&version(
        tree,
        1,
        &[
            ("author", Value::from("mallory")),
            ("file_count", huge.clone()),
            ("size_bytes", huge),
        ],
    ));
    let got = data(
        &import("honest", archive(&[lb, tree_node, vb], &[v])?).await?,
        201,
    );
    let nid = got["notebook"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let versions = data(
        &a.get(&format!("/api/v1/projects/{pid}/notebooks/{nid}/versions"))
            .await?,
        200,
    );
    let v = &versions["items"][0];
    assert_eq!(v["author"], "alice", "the importer is the author");
    assert_eq!(v["file_count"], 1);
    assert_eq!(v["size_bytes"], 5);
    let storage = data(
        &a.get(&format!("/api/v1/projects/{pid}/storage")).await?,
        200,
    );
    assert_eq!(storage["logicalBytes"], 5);
    let ratio = storage["dedupRatio"].as_f64().unwrap_or(f64::MAX);
    assert!(ratio < 10.0, "dedup ratio {ratio}");
    Ok(())
}
