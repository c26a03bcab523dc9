//! Class 1: links. A pushed tar that plants a symlink and then writes through it must be
//! refused with nothing created anywhere; a symlink stays data; and a link planted under the
//! data directory (by a bug elsewhere, or by someone with access to it) must make the store
//! refuse, never write through it.

use std::path::Path;

use serde_json::json;
use tests::Backend;
use tests::hub::{HubEnv, alice_with_project, data, refused, tar_header, tar_with_links};
use tests::hub_e2e;

use crate::support::{listing, push, push_notebook, revisions, titles};

hub_e2e!(
    a_push_never_follows_its_own_links,
    the_store_never_writes_through_a_planted_link
);

/// A tar of a symlink `esc -> target` and then a directory entry below it.
fn link_then_dir(target: &str) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&tar_header("esc", b'2', 0, target));
    out.extend_from_slice(&tar_header("esc/newdir/", b'5', 0, ""));
    out.extend_from_slice(&[0u8; 1024]);
    out
}

async fn a_push_never_follows_its_own_links(b: Backend) -> anyhow::Result<()> {
    let (env, server, a, pid, _) = alice_with_project(b).await?;
    let (nid, token) = push_notebook(&a, &pid, "app").await?;
    let outside = tempfile::tempdir()?;
    let target = outside.path().to_str().unwrap_or_default().to_string();
    let hostile = [
        tar_with_links(&[("esc", b"", Some(&target)), ("esc/x", b"escaped", None)]),
        link_then_dir(&target),
        tar_with_links(&[
            ("esc", b"", Some(&target)),
            ("esc/y", b"", Some("/etc/passwd")),
        ]),
        tar_with_links(&[("up", b"", Some("../../../..")), ("up/z", b"z", None)]),
        tar_with_links(&[
            ("d/ok.py", b"print(1)", None),
            ("d/l", b"", Some("..")),
            ("d/l/d/ok.py", b"again", None),
        ]),
    ];
    for (i, body) in hostile.into_iter().enumerate() {
        let got = push(&server.url, &token, body).await?;
        let e = refused(&got, 422, "VALIDATION_ERROR");
        assert!(
            e["message"].as_str().unwrap_or("").contains("symlink"),
            "case {i}: {e}"
        );
    }
    assert_eq!(
        listing(outside.path()),
        Vec::<String>::new(),
        "written outside"
    );
    assert!(
        revisions(&a, &pid, &nid).await?.is_empty(),
        "a refused push stored a version"
    );
    // Nothing was left in the spool either (its files have no names).
    let spool = Path::new(&env.env.vars["UNICAS_DATA_DIR"]).join("hub-spool");
    assert_eq!(listing(&spool), Vec::<String>::new());

    // A symlink is data: kept as a link entry, never resolved.
    let ok = data(
        &push(
            &server.url,
            &token,
            tar_with_links(&[
                ("app.py", b"print(1)\n", None),
                ("passwd", b"", Some("/etc/passwd")),
                ("out", b"", Some(&target)),
            ]),
        )
        .await?,
        200,
    );
    assert_eq!(ok["file_count"], 1);
    let ws = data(
        &a.get(&format!("/api/v1/projects/{pid}/notebooks/{nid}/workspace"))
            .await?,
        200,
    );
    let entries = ws["entries"].as_array().cloned().unwrap_or_default();
    assert!(
        entries.contains(&json!({"path": "passwd", "kind": "symlink", "target": "/etc/passwd"}))
    );
    assert!(entries.contains(&json!({"path": "out", "kind": "symlink", "target": target})));
    assert_eq!(listing(outside.path()), Vec::<String>::new());
    // A file read through a link entry is no file.
    let (st, _) = a
        .get_bytes(&format!(
            "/api/v1/projects/{pid}/notebooks/{nid}/workspace/files/passwd"
        ))
        .await?;
    assert_eq!(st, 404);

    // Other users go on as before.
    let bob = server.client(Some(&env.user("bob")?));
    let q = bob.project("Q").await?;
    bob.notebook(&q, "n", &[("a.py", "1")]).await?;
    Ok(())
}

async fn the_store_never_writes_through_a_planted_link(b: Backend) -> anyhow::Result<()> {
    let mut env = HubEnv::new(b).await?;
    // Fail fast instead of retrying a store that keeps refusing.
    env.set("UNICAS_HUB_WORKSPACE_WAIT_MS", 2000);
    // Every node an object: small ones would be held in the database and never come near the
    // links.
    env.set("UNICAS_HOLD_MAX_BYTES", 0);
    let token = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&token));
    let pid = a.project("P").await?;
    let blobs = Path::new(&env.env.vars["UNICAS_DATA_DIR"]).join("blobs");
    let outside = tempfile::tempdir()?;
    // Where the project's objects and uploads would go, planted as links to a directory the
    // test owns.
    std::fs::create_dir_all(blobs.join("app.hub"))?;
    std::fs::create_dir_all(blobs.join("uploads/app.hub"))?;
    let objects = outside.path().join("objects");
    let uploads = outside.path().join("uploads");
    std::fs::create_dir_all(&objects)?;
    std::fs::create_dir_all(&uploads)?;
    std::os::unix::fs::symlink(&objects, blobs.join(format!("app.hub/space.{pid}")))?;
    std::os::unix::fs::symlink(&uploads, blobs.join(format!("uploads/app.hub/space.{pid}")))?;

    let got = a
        .post(
            &format!("/api/v1/projects/{pid}/notebooks"),
            &json!({"title": "n", "files": {"a.py": {"content": "print(1)\n"}}}),
        )
        .await?;
    assert_eq!(
        got.0, 503,
        "the store must refuse, not write through: {}",
        got.1
    );
    assert_eq!(got.1["success"], false);
    assert_eq!(
        listing(outside.path()),
        ["objects", "uploads"],
        "written through a link"
    );

    assert!(
        titles(&a, &pid).await?.is_empty(),
        "a refused create left a notebook"
    );

    // Once the links are gone, the same request works.
    std::fs::remove_file(blobs.join(format!("app.hub/space.{pid}")))?;
    std::fs::remove_file(blobs.join(format!("uploads/app.hub/space.{pid}")))?;
    a.notebook(&pid, "n", &[("a.py", "print(1)\n")]).await?;
    assert_eq!(listing(outside.path()), ["objects", "uploads"]);
    Ok(())
}
