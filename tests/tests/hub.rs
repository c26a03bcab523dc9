//! The notebook hub end to end, over HTTP against a real `unicas-hub serve` (embedding the CAS):
//! projects, notebooks and the catalog; saves by the rules of seed 002 (expected revisions,
//! conflicts, revision numbers never reused, refused edits kept as branches); versions and
//! restore; forks; the trash; export and import; push sync; roles and masking; storage and
//! dedup; retention and garbage collection; the single-user mode; the OpenAPI document.
//!
//! Every scenario runs on SQLite and on Postgres (both with the filesystem store).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use anyhow::{Context, ensure};
use base64::Engine;
use cas_client::AppCasClient;
use cas_format::{Hash, SpaceId};
use rand::RngCore;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tests::Backend;
use tests::hub::{
    HubClient, HubEnv, alice_with_project, data, hub_cas, refused, tar_of, tar_with_links,
};
use tests::hub_e2e;

hub_e2e!(
    catalog_and_crud,
    saving_follows_seed_002,
    versions_and_restore,
    revision_numbers_are_never_reused,
    branch_refused_edit,
    branch_titles_respect_the_title_limit,
    fork_copies_one_revision,
    trash_restore_and_purge,
    export_and_import,
    push_sync,
    push_entry_notebook_is_checked_inside_the_push,
    roles_and_masking,
    storage_shows_dedup,
    retention_and_gc,
    single_user_mode,
    openapi_lists_every_route,
);

// ---------- helpers ----------

/// Files of a workspace: path → bytes.
type Files = BTreeMap<String, Vec<u8>>;

fn s(v: &Value) -> String {
    v.as_str()
        .unwrap_or_else(|| panic!("not a string: {v}"))
        .to_string()
}

fn nb_path(pid: &str, nid: &str) -> String {
    format!("/api/v1/projects/{pid}/notebooks/{nid}")
}

/// A workspace path as one URL path segment.
fn enc(path: &str) -> String {
    path.replace('%', "%25")
        .replace('/', "%2F")
        .replace(' ', "%20")
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::rng().fill_bytes(&mut v);
    v
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn text_files(list: &[(&str, &str)]) -> Files {
    list.iter()
        .map(|(p, c)| (p.to_string(), c.as_bytes().to_vec()))
        .collect()
}

/// Reads every file of a listing (`listing` answers `{version, entries}`; files are read at
/// `file_base/{path}`), checking each file's length against the listed size.
async fn read_tree(
    c: &HubClient,
    listing: &str,
    file_base: &str,
    query: &str,
) -> anyhow::Result<Files> {
    let (st, v) = c.get(&format!("{listing}{query}")).await?;
    ensure!(st == StatusCode::OK, "listing {listing}{query}: {st} {v}");
    let mut out = Files::new();
    for e in v["data"]["entries"].as_array().context("no entries")? {
        if e["kind"] != "file" {
            continue;
        }
        let path = e["path"].as_str().context("entry path")?;
        let (st, bytes) = c
            .get_bytes(&format!("{file_base}/{}{query}", enc(path)))
            .await?;
        ensure!(
            st == StatusCode::OK,
            "reading {path}{query}: {st} {}",
            String::from_utf8_lossy(&bytes)
        );
        ensure!(
            Some(bytes.len() as u64) == e["size"].as_u64(),
            "{path}: listed as {} bytes, read {}",
            e["size"],
            bytes.len()
        );
        out.insert(path.to_string(), bytes.to_vec());
    }
    Ok(out)
}

/// Every file of the workspace at `rev` (the head if `None`), through the workspace routes.
async fn files_at(c: &HubClient, pid: &str, nid: &str, rev: Option<i64>) -> anyhow::Result<Files> {
    let nb = nb_path(pid, nid);
    let q = rev.map(|r| format!("?revision={r}")).unwrap_or_default();
    read_tree(
        c,
        &format!("{nb}/workspace"),
        &format!("{nb}/workspace/files"),
        &q,
    )
    .await
}

/// Every file of version `vid`, through the version routes.
async fn version_files(c: &HubClient, pid: &str, nid: &str, vid: &str) -> anyhow::Result<Files> {
    let base = format!("{}/versions/{vid}", nb_path(pid, nid));
    read_tree(c, &base, &format!("{base}/files"), "").await
}

/// Every version of a notebook, newest first (following the cursor).
async fn versions(c: &HubClient, pid: &str, nid: &str) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let q = match &cursor {
            Some(c) => format!("?limit=1000&cursor={c}"),
            None => "?limit=1000".to_string(),
        };
        let (st, v) = c.get(&format!("{}/versions{q}", nb_path(pid, nid))).await?;
        ensure!(st == StatusCode::OK, "versions: {st} {v}");
        out.extend(v["data"]["items"].as_array().context("items")?.clone());
        match v["data"]["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return Ok(out),
        }
    }
}

fn revisions(vs: &[Value]) -> Vec<i64> {
    vs.iter()
        .map(|v| v["revision"].as_i64().expect("revision"))
        .collect()
}

async fn head(c: &HubClient, pid: &str, nid: &str) -> anyhow::Result<Option<i64>> {
    let (st, v) = c.get(&nb_path(pid, nid)).await?;
    ensure!(st == StatusCode::OK, "notebook: {st} {v}");
    Ok(v["data"]["head_revision"].as_i64())
}

/// The live notebooks of a project as the catalog shows them: id → title.
async fn catalog_notebooks(c: &HubClient, pid: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let (st, v) = c.get("/api/v1/catalog").await?;
    ensure!(st == StatusCode::OK, "catalog: {st} {v}");
    let p = v["data"]["projects"]
        .as_array()
        .context("projects")?
        .iter()
        .find(|p| p["id"] == pid)
        .with_context(|| format!("project {pid} is not in the catalog: {v}"))?;
    Ok(p["notebooks"]
        .as_array()
        .context("notebooks")?
        .iter()
        .map(|n| (s(&n["id"]), s(&n["title"])))
        .collect())
}

/// The live notebooks of a project through `GET …/notebooks`: id → title.
async fn listed_notebooks(c: &HubClient, pid: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let (st, v) = c
        .get(&format!("/api/v1/projects/{pid}/notebooks?limit=1000"))
        .await?;
    ensure!(st == StatusCode::OK, "notebooks: {st} {v}");
    Ok(v["data"]["items"]
        .as_array()
        .context("items")?
        .iter()
        .map(|n| (s(&n["id"]), s(&n["title"])))
        .collect())
}

async fn storage(c: &HubClient, pid: &str) -> anyhow::Result<Value> {
    let (st, v) = c.get(&format!("/api/v1/projects/{pid}/storage")).await?;
    ensure!(st == StatusCode::OK, "storage: {st} {v}");
    Ok(v["data"].clone())
}

async fn upload(c: &HubClient, pid: &str, bytes: &[u8]) -> anyhow::Result<Value> {
    let (st, v) = c
        .post_bytes(
            &format!("/api/v1/projects/{pid}/uploads"),
            "application/octet-stream",
            bytes.to_vec(),
            &[],
        )
        .await?;
    ensure!(st == StatusCode::CREATED, "upload: {st} {v}");
    Ok(v["data"].clone())
}

/// A tar archive of a directory holding `files`, made by the `tar` command.
fn tar_dir(files: &[(&str, &[u8])]) -> anyhow::Result<Vec<u8>> {
    let dir = tempfile::tempdir()?;
    for (p, c) in files {
        let path = dir.path().join(p);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, c)?;
    }
    let out = std::process::Command::new("tar")
        .arg("-cf")
        .arg("-")
        .arg("-C")
        .arg(dir.path())
        .arg(".")
        .output()?;
    ensure!(
        out.status.success(),
        "tar failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

/// Every node reachable from `roots` in `space`, with its own-content size.
async fn reachable(
    cas: &AppCasClient,
    space: &SpaceId,
    roots: &[Hash],
) -> anyhow::Result<HashMap<Hash, u64>> {
    let mut seen = HashMap::new();
    let mut stack = roots.to_vec();
    while let Some(h) = stack.pop() {
        if seen.contains_key(&h) {
            continue;
        }
        let m = cas.read_metadata(space, &h).await?;
        seen.insert(h, m.metadata.size);
        stack.extend(m.metadata.refs);
    }
    Ok(seen)
}

// ---------- 1. projects, notebooks, catalog ----------

async fn catalog_and_crud(b: Backend) -> anyhow::Result<()> {
    let env = HubEnv::new(b).await?;
    let token = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&token));

    // Projects.
    let p = data(
        &a.post(
            "/api/v1/projects",
            &json!({"name": "Alpha", "description": "first", "tags": ["x"]}),
        )
        .await?,
        201,
    );
    let pid = s(&p["id"]);
    assert!(pid.starts_with("proj-"), "{p}");
    assert_eq!(p["owner"], "alice");
    assert_eq!(p["role"], "admin");
    assert_eq!(p["notebook_count"], 0);
    let other = a.project("Other").await?;
    let got = data(&a.get(&format!("/api/v1/projects/{pid}")).await?, 200);
    assert_eq!(got["name"], "Alpha");
    assert_eq!(got["tags"], json!(["x"]));
    let all = data(&a.get("/api/v1/projects").await?, 200);
    let ids: Vec<String> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| s(&p["id"]))
        .collect();
    assert_eq!(ids, vec![pid.clone(), other.clone()], "oldest first");
    let page1 = data(&a.get("/api/v1/projects?limit=1").await?, 200);
    assert_eq!(page1["items"].as_array().unwrap().len(), 1);
    assert_eq!(page1["items"][0]["id"], json!(pid));
    let cursor = s(&page1["next_cursor"]);
    let page2 = data(
        &a.get(&format!("/api/v1/projects?limit=1&cursor={cursor}"))
            .await?,
        200,
    );
    assert_eq!(page2["items"][0]["id"], json!(other));
    assert!(page2["next_cursor"].is_null(), "{page2}");
    let upd = data(
        &a.patch(
            &format!("/api/v1/projects/{pid}"),
            &json!({"name": "Alpha 2", "description": "renamed"}),
        )
        .await?,
        200,
    );
    assert_eq!(upd["name"], "Alpha 2");
    assert_eq!(upd["description"], "renamed");
    refused(
        &a.get("/api/v1/projects/proj-aaaaaaaaaaaaaaaa").await?,
        404,
        "NOT_FOUND",
    );
    refused(
        &a.get("/api/v1/projects/not-an-id").await?,
        404,
        "NOT_FOUND",
    );

    // Notebooks.
    let nbs = format!("/api/v1/projects/{pid}/notebooks");
    let one = a
        .notebook(&pid, "One", &[("main.py", "print(1)\n")])
        .await?;
    let created = data(
        &a.post(
            &nbs,
            &json!({"title": "Two", "description": "d", "tags": ["t"], "status": "draft"}),
        )
        .await?,
        201,
    );
    let two = s(&created["notebook"]["id"]);
    assert!(created["notebook"]["head_revision"].is_null(), "{created}");
    assert!(created.get("sync_token").is_none(), "{created}");
    assert!(created.get("revision").is_none(), "{created}");
    let nb = data(&a.get(&nb_path(&pid, &one)).await?, 200);
    assert_eq!(nb["title"], "One");
    assert_eq!(nb["head_revision"], 1);
    assert_eq!(nb["author"], "alice");
    assert_eq!(nb["status"], "active");
    assert_eq!(nb["source"]["type"], "local");
    let nb2 = data(&a.get(&nb_path(&pid, &two)).await?, 200);
    assert_eq!(nb2["status"], "draft");
    assert_eq!(nb2["tags"], json!(["t"]));
    let listed = data(&a.get(&nbs).await?, 200);
    let titles: Vec<String> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| s(&n["title"]))
        .collect();
    assert_eq!(titles, ["One", "Two"]);
    let first = data(&a.get(&format!("{nbs}?limit=1")).await?, 200);
    assert_eq!(first["items"][0]["id"], json!(one));
    let rest = data(
        &a.get(&format!(
            "{nbs}?limit=1&cursor={}",
            s(&first["next_cursor"])
        ))
        .await?,
        200,
    );
    assert_eq!(rest["items"][0]["id"], json!(two));
    assert!(rest["next_cursor"].is_null());

    // A notebook is addressed within its project: under another project it does not exist.
    refused(&a.get(&nb_path(&other, &one)).await?, 404, "NOT_FOUND");
    refused(
        &a.save(&other, &one, Some(1), &[("main.py", "x")], &[])
            .await?,
        404,
        "NOT_FOUND",
    );
    refused(
        &a.get(&format!(
            "{}/workspace/files/main.py",
            nb_path(&other, &one)
        ))
        .await?,
        404,
        "NOT_FOUND",
    );

    // The catalog: every visible project with its live notebooks, in one answer.
    let cat = data(&a.get("/api/v1/catalog").await?, 200);
    assert!(cat["snapshot_id"].is_string() && cat["created_at"].is_string());
    let projects = cat["projects"].as_array().unwrap();
    assert_eq!(projects.len(), 2, "{cat}");
    let alpha = projects.iter().find(|p| p["id"] == json!(pid)).unwrap();
    assert_eq!(alpha["name"], "Alpha 2");
    assert_eq!(alpha["notebook_count"], 2);
    let cat_titles: Vec<String> = alpha["notebooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| s(&n["title"]))
        .collect();
    assert_eq!(cat_titles, ["One", "Two"]);
    let o = projects.iter().find(|p| p["id"] == json!(other)).unwrap();
    assert_eq!(o["notebooks"], json!([]));

    // A title another live notebook has is refused, on create and on rename.
    let e = refused(
        &a.post(&nbs, &json!({"title": "One"})).await?,
        409,
        "name_taken",
    );
    assert_eq!(e["title"], "One");
    let e = refused(
        &a.patch(&nb_path(&pid, &two), &json!({"title": "One"}))
            .await?,
        409,
        "name_taken",
    );
    assert_eq!(e["title"], "One");
    refused(
        &a.patch(&nb_path(&pid, &two), &json!({"title": "  One  "}))
            .await?,
        409,
        "name_taken",
    );
    assert_eq!(
        data(&a.get(&nb_path(&pid, &two)).await?, 200)["title"],
        "Two"
    );
    // Its own title is not "another notebook's".
    data(
        &a.patch(&nb_path(&pid, &two), &json!({"title": "Two"}))
            .await?,
        200,
    );
    // Concurrent creations under one title: exactly one wins.
    let racers: Vec<_> = (0..5)
        .map(|_| {
            let a = a.clone();
            let nbs = nbs.clone();
            tokio::spawn(async move { a.post(&nbs, &json!({"title": "Raced"})).await })
        })
        .collect();
    let mut won = 0;
    for r in racers {
        let got = r.await??;
        if got.0 == StatusCode::CREATED {
            won += 1;
        } else {
            refused(&got, 409, "name_taken");
        }
    }
    assert_eq!(won, 1, "one creation under a title wins");
    let raced_ids: Vec<String> = catalog_notebooks(&a, &pid)
        .await?
        .into_iter()
        .filter(|(_, t)| t == "Raced")
        .map(|(id, _)| id)
        .collect();
    assert_eq!(raced_ids.len(), 1);

    // Invalid input: 422 VALIDATION_ERROR, and nothing changes (not even the catalog snapshot).
    let before = data(&a.get("/api/v1/catalog").await?, 200);
    let bad: Vec<(&str, String, Value)> = vec![
        ("POST", "/api/v1/projects".into(), json!({"name": ""})),
        (
            "POST",
            "/api/v1/projects".into(),
            json!({"name": "x", "bogus": 1}),
        ),
        ("POST", "/api/v1/projects".into(), json!({"name": 7})),
        ("POST", nbs.clone(), json!({"title": ""})),
        ("POST", nbs.clone(), json!({"title": "   "})),
        ("POST", nbs.clone(), json!({"title": "line\nbreak"})),
        ("POST", nbs.clone(), json!({"title": "x".repeat(201)})),
        (
            "POST",
            nbs.clone(),
            json!({"title": "Bad", "status": "deleted"}),
        ),
        (
            "POST",
            nbs.clone(),
            json!({"title": "Bad", "source": {"type": "svn"}}),
        ),
        (
            "POST",
            nbs.clone(),
            json!({"title": "Bad", "source": {"type": "git", "sync_mode": "pull"}}),
        ),
        (
            "POST",
            nbs.clone(),
            json!({"title": "Bad", "files": {"../evil.py": {"content": "x"}}}),
        ),
        (
            "POST",
            nbs.clone(),
            json!({"title": "Bad", "files": {"a.py": {"content": "x", "content_base64": "eA=="}}}),
        ),
        (
            "POST",
            nbs.clone(),
            json!({"title": "Bad", "files": {"a.py": {}}}),
        ),
        (
            "POST",
            nbs.clone(),
            json!({"title": "Bad", "files": {"a.py": {"content_base64": "!!!"}}}),
        ),
        ("POST", nbs.clone(), json!({"title": "Bad", "extra": true})),
        (
            "PATCH",
            nb_path(&pid, &two),
            json!({"title": "Four", "status": "bogus"}),
        ),
        ("PATCH", nb_path(&pid, &two), json!({"title": ""})),
        ("PATCH", nb_path(&pid, &two), json!({"tags": "not-a-list"})),
        ("PATCH", nb_path(&pid, &two), json!({"status": "deleted"})),
        (
            "PATCH",
            format!("/api/v1/projects/{pid}"),
            json!({"name": ""}),
        ),
    ];
    for (method, path, body) in &bad {
        let got = match *method {
            "POST" => a.post(path, body).await?,
            _ => a.patch(path, body).await?,
        };
        assert_eq!(got.0, 422, "{method} {path} {body}: {}", got.1);
        refused(&got, 422, "VALIDATION_ERROR");
    }
    let garbled = a
        .post_bytes(&nbs, "application/json", "{not json", &[])
        .await?;
    refused(&garbled, 422, "VALIDATION_ERROR");
    refused(
        &a.get(&format!("{}/versions?limit=abc", nb_path(&pid, &one)))
            .await?,
        422,
        "VALIDATION_ERROR",
    );
    let after = data(&a.get("/api/v1/catalog").await?, 200);
    assert_eq!(
        before["snapshot_id"], after["snapshot_id"],
        "a refused request wrote a catalog snapshot"
    );
    assert_eq!(before["projects"], after["projects"]);
    assert_eq!(
        data(&a.get(&nb_path(&pid, &two)).await?, 200)["title"],
        "Two"
    );

    // A valid update.
    let upd = data(
        &a.patch(
            &nb_path(&pid, &two),
            &json!({"title": "Three", "description": "new", "status": "archived", "tags": ["a", "a", "b"]}),
        )
        .await?,
        200,
    );
    assert_eq!(upd["title"], "Three");
    assert_eq!(upd["status"], "archived");
    assert_eq!(upd["tags"], json!(["a", "b"]));

    // The catalog and the list show live notebooks only.
    let t = data(&a.delete(&nb_path(&pid, &one)).await?, 200);
    assert_eq!(t["recoverable"], true);
    let cat = catalog_notebooks(&a, &pid).await?;
    assert!(!cat.contains_key(&one), "{cat:?}");
    assert_eq!(cat.get(&two).map(String::as_str), Some("Three"));
    assert_eq!(listed_notebooks(&a, &pid).await?, cat);
    let p = data(&a.get(&format!("/api/v1/projects/{pid}")).await?, 200);
    assert_eq!(p["notebook_count"], 2, "Three and Raced: {p}");

    // A deleted project goes to the trash (see hub_projects): gone from every read.
    data(&a.delete(&format!("/api/v1/projects/{other}")).await?, 200);
    refused(
        &a.get(&format!("/api/v1/projects/{other}")).await?,
        404,
        "NOT_FOUND",
    );
    let cat = data(&a.get("/api/v1/catalog").await?, 200);
    assert_eq!(cat["projects"].as_array().unwrap().len(), 1, "{cat}");
    Ok(())
}

// ---------- 2. saving ----------

async fn saving_follows_seed_002(b: Backend) -> anyhow::Result<()> {
    let mut env = HubEnv::new(b).await?;
    env.set("UNICAS_HUB_UPLOAD_MAX_BYTES", 13 << 20);
    let token = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&token));
    let pid = a.project("P").await?;
    let created = data(
        &a.post(
            &format!("/api/v1/projects/{pid}/notebooks"),
            &json!({"title": "ws"}),
        )
        .await?,
        201,
    );
    let nid = s(&created["notebook"]["id"]);
    let nb = nb_path(&pid, &nid);
    let ws = format!("{nb}/workspace");
    refused(&a.get(&ws).await?, 404, "NOT_FOUND");

    // A save made from a revision, when there is none.
    let e = refused(
        &a.save(&pid, &nid, Some(1), &[("a.txt", "x")], &[]).await?,
        409,
        "workspace_conflict",
    );
    assert!(e["actual_revision"].is_null(), "{e}");
    assert_eq!(e["expected_revision"], 1);
    assert!(e["reason"].is_string());

    // The first save states no revision.
    let r1 = data(
        &a.save(
            &pid,
            &nid,
            None,
            &[
                ("a.txt", "alpha"),
                ("dir/b.txt", "beta"),
                ("c.txt", "gamma"),
            ],
            &[],
        )
        .await?,
        201,
    );
    assert_eq!(r1["revision"], 1);
    assert_eq!(r1["file_count"], 3);
    assert_eq!(r1["size_bytes"], 14);

    // Omitted (or null) over an existing workspace is a conflict: the caller did not know it.
    let e = refused(
        &a.post(&ws, &json!({"files": {"a.txt": {"content": "lost"}}}))
            .await?,
        409,
        "workspace_conflict",
    );
    assert_eq!(e["actual_revision"], 1);
    assert!(e["expected_revision"].is_null(), "{e}");
    assert!(e["reason"].as_str().is_some_and(|r| !r.is_empty()));
    let e = refused(
        &a.save(&pid, &nid, None, &[("a.txt", "lost")], &[]).await?,
        409,
        "workspace_conflict",
    );
    assert_eq!(e["actual_revision"], 1);

    // Changed and deleted files only.
    let r2 = data(
        &a.save(&pid, &nid, Some(1), &[("a.txt", "alpha2")], &["c.txt"])
            .await?,
        201,
    );
    assert_eq!(r2["revision"], 2);
    assert_eq!(r2["file_count"], 2);
    assert_eq!(r2["size_bytes"], 10);

    // A stale save.
    let e = refused(
        &a.save(&pid, &nid, Some(1), &[("a.txt", "stale")], &[])
            .await?,
        409,
        "workspace_conflict",
    );
    assert_eq!(e["actual_revision"], 2);
    assert_eq!(e["expected_revision"], 1);
    assert!(e["reason"].as_str().is_some_and(|r| r.contains('2')), "{e}");

    // Every revision reads as it was written; unchanged files carried over.
    let rev1 = text_files(&[
        ("a.txt", "alpha"),
        ("c.txt", "gamma"),
        ("dir/b.txt", "beta"),
    ]);
    let rev2 = text_files(&[("a.txt", "alpha2"), ("dir/b.txt", "beta")]);
    assert_eq!(files_at(&a, &pid, &nid, Some(1)).await?, rev1);
    assert_eq!(files_at(&a, &pid, &nid, Some(2)).await?, rev2);
    assert_eq!(files_at(&a, &pid, &nid, None).await?, rev2);
    let w = data(&a.get(&ws).await?, 200);
    assert_eq!(w["version"]["revision"], 2);
    assert_eq!(w["version"]["is_head"], true);
    assert_eq!(w["version"]["parent_revision"], 1);
    let kinds: BTreeMap<String, String> = w["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (s(&e["path"]), s(&e["kind"])))
        .collect();
    assert_eq!(kinds.get("dir").map(String::as_str), Some("dir"), "{w}");
    let (st, body) = a.get_bytes(&format!("{ws}/files/c.txt?revision=1")).await?;
    assert_eq!((st.as_u16(), &body[..]), (200, &b"gamma"[..]));
    refused(
        &a.get(&format!("{ws}/files/c.txt?revision=2")).await?,
        404,
        "NOT_FOUND",
    );
    refused(
        &a.get(&format!("{ws}?revision=99")).await?,
        404,
        "NOT_FOUND",
    );

    // Invalid saves change nothing.
    type Edit<'a> = (Vec<(&'a str, &'a str)>, Vec<&'a str>);
    let invalid: Vec<Edit> = vec![
        (vec![], vec!["nope.txt"]),
        (vec![("../x", "1")], vec![]),
        (vec![("a/../../x", "1")], vec![]),
        (vec![("a.txt", "1")], vec!["a.txt"]),
        (vec![("a.txt/inner", "1")], vec![]),
    ];
    for (files, deleted) in &invalid {
        let got = a.save(&pid, &nid, Some(2), files, deleted).await?;
        assert_eq!(got.0, 422, "{files:?} {deleted:?}: {}", got.1);
        refused(&got, 422, "VALIDATION_ERROR");
    }
    refused(
        &a.post(
            &ws,
            &json!({"expected_revision": 2, "files": {"x.txt": {"content": "1"}}, "message": "m".repeat(5000)}),
        )
        .await?,
        422,
        "VALIDATION_ERROR",
    );
    assert_eq!(head(&a, &pid, &nid).await?, Some(2));
    assert_eq!(versions(&a, &pid, &nid).await?.len(), 2);

    // A large file staged ahead of the save.
    let big = random_bytes(12 << 20);
    let staged = upload(&a, &pid, &big).await?;
    assert_eq!(staged["size"], big.len());
    assert_eq!(staged["chunked"], true);
    // Above UNICAS_HUB_UPLOAD_MAX_BYTES: 413 (on a connection of its own, as the rest of the
    // body is never read).
    refused(
        &server
            .client(Some(&token))
            .post_bytes(
                &format!("/api/v1/projects/{pid}/uploads"),
                "application/octet-stream",
                random_bytes(14 << 20),
                &[],
            )
            .await?,
        413,
        "PAYLOAD_TOO_LARGE",
    );
    let r3 = data(
        &a.post(
            &ws,
            &json!({"expected_revision": 2, "message": "big", "files": {"data/big.bin": {"staged": staged}}}),
        )
        .await?,
        201,
    );
    assert_eq!(r3["revision"], 3);
    assert_eq!(r3["size_bytes"], 10 + big.len());
    assert!(
        r3["uploaded_bytes"].as_u64().unwrap() < 4096,
        "the staged file was uploaded again: {r3}"
    );
    let at3 = files_at(&a, &pid, &nid, Some(3)).await?;
    assert!(
        at3["data/big.bin"] == big,
        "the staged file reads back different"
    );

    // A small change beside it uploads a leaf, the root directory and the version node.
    let r4 = data(
        &a.save(&pid, &nid, Some(3), &[("a.txt", "alpha4")], &[])
            .await?,
        201,
    );
    assert_eq!(r4["revision"], 4);
    assert_eq!(r4["uploaded_nodes"], 3, "{r4}");
    assert!(
        r4["uploaded_bytes"].as_u64().unwrap() < 1024,
        "a one-file change uploaded {}",
        r4["uploaded_bytes"]
    );
    let at4 = files_at(&a, &pid, &nid, Some(4)).await?;
    assert_eq!(at4.len(), 3);
    assert_eq!(at4["a.txt"], b"alpha4");
    assert!(at4["data/big.bin"] == big);

    // A staged description that lies, or names a node that is not there, is refused.
    let mut lying = staged.clone();
    lying["size"] = json!(5);
    let unknown =
        json!({"node": Hash::digest(b"nothing").to_string(), "size": 7, "chunked": false});
    for st in [lying, unknown] {
        refused(
            &a.post(
                &ws,
                &json!({"expected_revision": 4, "files": {"x.bin": {"staged": st}}}),
            )
            .await?,
            422,
            "VALIDATION_ERROR",
        );
    }
    assert_eq!(head(&a, &pid, &nid).await?, Some(4));

    // An empty file, and a path with spaces and non-ASCII characters.
    let odd = "notes dir/Ünïcödé file.md";
    let r = data(
        &a.save(&pid, &nid, Some(4), &[("empty.txt", ""), (odd, "ü")], &[])
            .await?,
        201,
    );
    assert_eq!(r["revision"], 5);
    let at5 = files_at(&a, &pid, &nid, Some(5)).await?;
    assert_eq!(at5["empty.txt"], b"");
    assert_eq!(at5[odd], "ü".as_bytes());
    data(
        &a.save(&pid, &nid, Some(5), &[], &["empty.txt", "notes dir"])
            .await?,
        201,
    );
    assert!(files_at(&a, &pid, &nid, Some(6)).await? == at4);

    // Binary content inline, and an executable bit.
    let bin = random_bytes(3000);
    let r5 = data(
        &a.post(
            &ws,
            &json!({"expected_revision": 6, "files": {"bin/tool": {"content_base64": b64(&bin), "executable": true}}}),
        )
        .await?,
        201,
    );
    assert_eq!(r5["revision"], 7);
    let w = data(&a.get(&ws).await?, 200);
    let tool = w["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"] == "bin/tool")
        .cloned()
        .context("bin/tool listed")?;
    assert_eq!(tool["executable"], true);
    assert_eq!(files_at(&a, &pid, &nid, Some(7)).await?["bin/tool"], bin);
    Ok(())
}

// ---------- 3. versions ----------

async fn versions_and_restore(b: Backend) -> anyhow::Result<()> {
    let (_env, _server, a, pid, _) = alice_with_project(b).await?;
    let nid = a.notebook(&pid, "hist", &[("n.txt", "v1")]).await?;
    for i in 2..=5 {
        let c = format!("v{i}");
        data(
            &a.save(&pid, &nid, Some(i - 1), &[("n.txt", &c)], &[])
                .await?,
            201,
        );
    }
    let nb = nb_path(&pid, &nid);
    let vs = versions(&a, &pid, &nid).await?;
    assert_eq!(revisions(&vs), [5, 4, 3, 2, 1], "newest first");
    for v in &vs {
        let rev = v["revision"].as_i64().unwrap();
        assert_eq!(v["is_head"], rev == 5, "{v}");
        assert_eq!(v["state"], "kept");
        assert_eq!(v["author"], "alice");
        assert_eq!(v["kind"], "save");
        assert_eq!(v["notebook_id"], json!(nid));
        assert!(v["version_id"].as_str().unwrap().starts_with("ver_"));
        if rev == 1 {
            assert!(v["parent_revision"].is_null());
        } else {
            assert_eq!(v["parent_revision"], rev - 1);
        }
    }

    // Pages.
    let p1 = data(&a.get(&format!("{nb}/versions?limit=2")).await?, 200);
    assert_eq!(revisions(p1["items"].as_array().unwrap()), [5, 4]);
    let c1 = s(&p1["next_cursor"]);
    let p2 = data(
        &a.get(&format!("{nb}/versions?limit=2&cursor={c1}")).await?,
        200,
    );
    assert_eq!(revisions(p2["items"].as_array().unwrap()), [3, 2]);
    let c2 = s(&p2["next_cursor"]);
    let p3 = data(
        &a.get(&format!("{nb}/versions?limit=2&cursor={c2}")).await?,
        200,
    );
    assert_eq!(revisions(p3["items"].as_array().unwrap()), [1]);
    assert!(p3["next_cursor"].is_null(), "{p3}");
    refused(
        &a.get(&format!("{nb}/versions?cursor=zzz")).await?,
        422,
        "VALIDATION_ERROR",
    );

    // One version and its files.
    let v2 = vs.iter().find(|v| v["revision"] == 2).unwrap().clone();
    let vid2 = s(&v2["version_id"]);
    let got = data(&a.get(&format!("{nb}/versions/{vid2}")).await?, 200);
    assert_eq!(got["version"]["revision"], 2);
    assert_eq!(got["version"]["is_head"], false);
    assert_eq!(got["version"]["hash"], v2["hash"]);
    assert_eq!(got["entries"][0]["path"], "n.txt");
    assert_eq!(got["entries"][0]["size"], 2);
    assert_eq!(
        version_files(&a, &pid, &nid, &vid2).await?,
        text_files(&[("n.txt", "v2")])
    );
    refused(
        &a.get(&format!("{nb}/versions/ver_01ARZ3NDEKTSV4RRFFQ69G5FAV"))
            .await?,
        404,
        "NOT_FOUND",
    );
    refused(
        &a.get(&format!("{nb}/versions/{vid2}/files/missing.txt"))
            .await?,
        404,
        "NOT_FOUND",
    );
    // A version id of another notebook is not this notebook's.
    let other = a.notebook(&pid, "other", &[("o.txt", "o")]).await?;
    let ovid = s(&versions(&a, &pid, &other).await?[0]["version_id"]);
    refused(
        &a.get(&format!("{nb}/versions/{ovid}")).await?,
        404,
        "NOT_FOUND",
    );

    // Restore writes a new revision with the old content; history is untouched.
    let r6 = data(
        &a.post(&format!("{nb}/versions/{vid2}/restore"), &json!({}))
            .await?,
        201,
    );
    assert_eq!(r6["revision"], 6);
    assert_eq!(r6["tree"], v2["tree"], "the restored tree is the old one");
    assert_eq!(head(&a, &pid, &nid).await?, Some(6));
    assert_eq!(
        files_at(&a, &pid, &nid, None).await?,
        text_files(&[("n.txt", "v2")])
    );
    assert_eq!(
        files_at(&a, &pid, &nid, Some(5)).await?,
        text_files(&[("n.txt", "v5")])
    );
    assert_eq!(
        files_at(&a, &pid, &nid, Some(2)).await?,
        text_files(&[("n.txt", "v2")])
    );
    let vs = versions(&a, &pid, &nid).await?;
    assert_eq!(revisions(&vs), [6, 5, 4, 3, 2, 1]);
    assert_eq!(vs[0]["kind"], "restore");
    assert_eq!(vs[0]["parent_revision"], 5);
    assert!(s(&vs[0]["message"]).contains("revision 2"), "{}", vs[0]);
    assert_ne!(vs[0]["version_id"], json!(vid2));

    // A restore that states a stale head is refused; a current one is not.
    let vid4 = s(&vs.iter().find(|v| v["revision"] == 4).unwrap()["version_id"]);
    let e = refused(
        &a.post(
            &format!("{nb}/versions/{vid4}/restore"),
            &json!({"expected_revision": 5}),
        )
        .await?,
        409,
        "workspace_conflict",
    );
    assert_eq!(e["actual_revision"], 6);
    assert_eq!(head(&a, &pid, &nid).await?, Some(6));
    let r7 = data(
        &a.post(
            &format!("{nb}/versions/{vid4}/restore"),
            &json!({"expected_revision": 6}),
        )
        .await?,
        201,
    );
    assert_eq!(r7["revision"], 7);
    assert_eq!(
        files_at(&a, &pid, &nid, None).await?,
        text_files(&[("n.txt", "v4")])
    );
    refused(
        &a.post_bytes(
            &format!("{nb}/versions/{vid4}/restore"),
            "application/json",
            "{oops",
            &[],
        )
        .await?,
        422,
        "VALIDATION_ERROR",
    );
    refused(
        &a.post(
            &format!("{nb}/versions/ver_01ARZ3NDEKTSV4RRFFQ69G5FAV/restore"),
            &json!({}),
        )
        .await?,
        404,
        "NOT_FOUND",
    );
    assert_eq!(head(&a, &pid, &nid).await?, Some(7));
    Ok(())
}

// ---------- 4. revision numbers ----------

async fn revision_numbers_are_never_reused(b: Backend) -> anyhow::Result<()> {
    let (_env, _server, a, pid, _) = alice_with_project(b).await?;
    let nid = a.notebook(&pid, "n", &[("f.txt", "1")]).await?;
    let nb = nb_path(&pid, &nid);
    data(
        &a.save(&pid, &nid, Some(1), &[("f.txt", "2")], &[]).await?,
        201,
    );
    // Refusals allocate nothing.
    refused(
        &a.save(&pid, &nid, Some(1), &[("f.txt", "x")], &[]).await?,
        409,
        "workspace_conflict",
    );
    refused(
        &a.save(&pid, &nid, None, &[("f.txt", "x")], &[]).await?,
        409,
        "workspace_conflict",
    );
    refused(
        &a.save(&pid, &nid, Some(2), &[], &["missing"]).await?,
        422,
        "VALIDATION_ERROR",
    );
    let vid1 = s(&versions(&a, &pid, &nid).await?[1]["version_id"]);
    let r3 = data(
        &a.post(&format!("{nb}/versions/{vid1}/restore"), &json!({}))
            .await?,
        201,
    );
    assert_eq!(r3["revision"], 3);
    // The trash keeps the counter.
    let t = data(&a.delete(&nb).await?, 200);
    data(
        &a.post(
            &format!("/api/v1/projects/{pid}/trash/{}/restore", s(&t["token"])),
            &json!({}),
        )
        .await?,
        200,
    );
    let r4 = data(
        &a.save(&pid, &nid, Some(3), &[("f.txt", "4")], &[]).await?,
        201,
    );
    assert_eq!(r4["revision"], 4);
    // Forks and branches number their own notebooks.
    let fork = data(
        &a.post(&format!("{nb}/fork"), &json!({"new_title": "f"}))
            .await?,
        201,
    );
    assert_eq!(fork["revision"]["revision"], 1);
    let branch = data(
        &a.post(
            &format!("{nb}/branch-refused-edit"),
            &json!({"base_revision": 2, "files": {"f.txt": {"content": "b"}}}),
        )
        .await?,
        201,
    );
    assert_eq!(branch["revision"]["revision"], 1);

    // Racing saves from the same revision: one wins, the others are told the new head.
    let racers: Vec<_> = (0..6)
        .map(|i| {
            let a = a.clone();
            let (pid, nid) = (pid.clone(), nid.clone());
            tokio::spawn(async move {
                let c = format!("race {i}");
                a.save(&pid, &nid, Some(4), &[("f.txt", &c)], &[]).await
            })
        })
        .collect();
    let mut winners = Vec::new();
    for r in racers {
        let got = r.await??;
        if got.0 == StatusCode::CREATED {
            winners.push(data(&got, 201));
        } else {
            let e = refused(&got, 409, "workspace_conflict");
            assert_eq!(e["actual_revision"], 5, "{e}");
            assert_eq!(e["expected_revision"], 4);
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one racing save wins: {winners:?}"
    );
    assert_eq!(winners[0]["revision"], 5);
    let r6 = data(
        &a.save(&pid, &nid, Some(5), &[("f.txt", "6")], &[]).await?,
        201,
    );
    assert_eq!(r6["revision"], 6);

    let vs = versions(&a, &pid, &nid).await?;
    assert_eq!(revisions(&vs), [6, 5, 4, 3, 2, 1]);
    let ids: BTreeSet<String> = vs.iter().map(|v| s(&v["version_id"])).collect();
    assert_eq!(ids.len(), 6, "version ids are unique");
    for v in &vs {
        let rev = v["revision"].as_i64().unwrap();
        if rev > 1 {
            assert_eq!(v["parent_revision"], rev - 1, "{v}");
        }
    }
    // Every revision still reads what it was given.
    let expect = ["1", "2", "1", "4", "", "6"];
    for (i, want) in expect.iter().enumerate() {
        let rev = i as i64 + 1;
        let got = files_at(&a, &pid, &nid, Some(rev)).await?;
        if rev == 5 {
            let winner_text = String::from_utf8(got["f.txt"].clone())?;
            assert!(winner_text.starts_with("race "), "{winner_text}");
        } else {
            assert_eq!(got, text_files(&[("f.txt", want)]), "revision {rev}");
        }
    }
    Ok(())
}

// ---------- 5. refused edits ----------

async fn branch_refused_edit(b: Backend) -> anyhow::Result<()> {
    let (_env, _server, a, pid, _) = alice_with_project(b).await?;
    let nid = a
        .notebook(&pid, "column", &[("a.txt", "base"), ("keep.txt", "keep")])
        .await?;
    let nb = nb_path(&pid, &nid);
    data(
        &a.save(&pid, &nid, Some(1), &[("a.txt", "A")], &[]).await?,
        201,
    );
    refused(
        &a.save(&pid, &nid, Some(1), &[("a.txt", "B")], &[]).await?,
        409,
        "workspace_conflict",
    );

    // The refused edit becomes revision 1 of its own notebook: base + edit.
    let br = data(
        &a.post(
            &format!("{nb}/branch-refused-edit"),
            &json!({"base_revision": 1, "files": {"a.txt": {"content": "B"}}, "message": "mine"}),
        )
        .await?,
        201,
    );
    let b1 = s(&br["notebook"]["id"]);
    assert_ne!(b1, nid);
    assert_eq!(br["notebook"]["title"], "column (from revision 1)");
    assert_eq!(br["notebook"]["head_revision"], 1);
    assert_eq!(br["revision"]["revision"], 1);
    let b1_files = text_files(&[("a.txt", "B"), ("keep.txt", "keep")]);
    assert_eq!(files_at(&a, &pid, &b1, None).await?, b1_files);
    let bv = versions(&a, &pid, &b1).await?;
    assert_eq!(revisions(&bv), [1]);
    assert_eq!(bv[0]["kind"], "branch");
    assert_eq!(bv[0]["message"], "mine");
    // Both edits exist.
    let src = text_files(&[("a.txt", "A"), ("keep.txt", "keep")]);
    assert_eq!(files_at(&a, &pid, &nid, None).await?, src);
    assert_eq!(revisions(&versions(&a, &pid, &nid).await?), [2, 1]);

    // A second branch from the same base never buries the first.
    let br2 = data(
        &a.post(
            &format!("{nb}/branch-refused-edit"),
            &json!({"base_revision": 1, "files": {"a.txt": {"content": "C"}}, "deleted": ["keep.txt"]}),
        )
        .await?,
        201,
    );
    let b2 = s(&br2["notebook"]["id"]);
    assert_ne!(b2, b1);
    assert_ne!(br2["notebook"]["title"], br["notebook"]["title"]);
    assert!(
        s(&br2["notebook"]["title"]).starts_with("column (from revision 1)"),
        "{br2}"
    );
    assert_eq!(
        files_at(&a, &pid, &b2, None).await?,
        text_files(&[("a.txt", "C")])
    );
    assert_eq!(files_at(&a, &pid, &b1, None).await?, b1_files);
    assert_eq!(revisions(&versions(&a, &pid, &b1).await?), [1]);
    assert_eq!(files_at(&a, &pid, &nid, None).await?, src);

    // An edit that diverged from nothing is refused, and creates nothing.
    let before = catalog_notebooks(&a, &pid).await?;
    assert_eq!(before.len(), 3);
    refused(
        &a.post(
            &format!("{nb}/branch-refused-edit"),
            &json!({"base_revision": 99, "files": {"a.txt": {"content": "D"}}}),
        )
        .await?,
        422,
        "VALIDATION_ERROR",
    );
    // A title that is taken is refused rather than overwritten.
    refused(
        &a.post(
            &format!("{nb}/branch-refused-edit"),
            &json!({"base_revision": 1, "title": "column", "files": {"a.txt": {"content": "D"}}}),
        )
        .await?,
        409,
        "name_taken",
    );
    // Bad edits are refused too.
    refused(
        &a.post(
            &format!("{nb}/branch-refused-edit"),
            &json!({"base_revision": 1, "deleted": ["nope.txt"]}),
        )
        .await?,
        422,
        "VALIDATION_ERROR",
    );
    assert_eq!(catalog_notebooks(&a, &pid).await?, before);

    // From the current head, too.
    let br3 = data(
        &a.post(
            &format!("{nb}/branch-refused-edit"),
            &json!({"base_revision": 2, "files": {"new.txt": {"content": "n"}}}),
        )
        .await?,
        201,
    );
    assert_eq!(br3["notebook"]["title"], "column (from revision 2)");
    assert_eq!(
        files_at(&a, &pid, &s(&br3["notebook"]["id"]), None).await?,
        text_files(&[("a.txt", "A"), ("keep.txt", "keep"), ("new.txt", "n")])
    );
    Ok(())
}

/// A title is at most 200 bytes (`MAX_TITLE`), and every way of naming a notebook keeps it so:
/// the default "<title> (from revision N)" of a refused-edit branch must be cut to fit in
/// bytes, not in characters.
async fn branch_titles_respect_the_title_limit(b: Backend) -> anyhow::Result<()> {
    let (_env, _server, a, pid, _) = alice_with_project(b).await?;
    let nbs = format!("/api/v1/projects/{pid}/notebooks");
    // The limit as the API enforces it: 200 bytes pass, 201 do not.
    refused(
        &a.post(&nbs, &json!({"title": "é".repeat(100) + "x"}))
            .await?,
        422,
        "VALIDATION_ERROR",
    );
    let title = "é".repeat(100); // 100 characters, 200 bytes
    let nid = a.notebook(&pid, &title, &[("a.txt", "base")]).await?;
    data(
        &a.save(&pid, &nid, Some(1), &[("a.txt", "theirs")], &[])
            .await?,
        201,
    );
    let br = data(
        &a.post(
            &format!("{}/branch-refused-edit", nb_path(&pid, &nid)),
            &json!({"base_revision": 1, "files": {"a.txt": {"content": "mine"}}}),
        )
        .await?,
        201,
    );
    let got = s(&br["notebook"]["title"]);
    assert!(
        got.len() <= 200,
        "a branch was titled with {} bytes ({} characters), over the 200-byte limit every \
         other route enforces: {got:?}",
        got.len(),
        got.chars().count()
    );
    // Whatever it is called, the title is one the API accepts when it is set again.
    data(
        &a.patch(
            &nb_path(&pid, &s(&br["notebook"]["id"])),
            &json!({"title": got}),
        )
        .await?,
        200,
    );
    Ok(())
}

// ---------- 6. fork ----------

async fn fork_copies_one_revision(b: Backend) -> anyhow::Result<()> {
    let (_env, _server, a, pid, _) = alice_with_project(b).await?;
    let nid = a
        .notebook(&pid, "src", &[("a.py", "1"), ("d/b.py", "x")])
        .await?;
    let nb = nb_path(&pid, &nid);
    data(
        &a.save(&pid, &nid, Some(1), &[("a.py", "2")], &[]).await?,
        201,
    );
    let rev1 = text_files(&[("a.py", "1"), ("d/b.py", "x")]);
    let rev2 = text_files(&[("a.py", "2"), ("d/b.py", "x")]);

    let f = data(
        &a.post(&format!("{nb}/fork"), &json!({"new_title": "copy"}))
            .await?,
        201,
    );
    let copy = s(&f["notebook"]["id"]);
    assert_eq!(f["notebook"]["title"], "copy");
    assert_eq!(f["notebook"]["head_revision"], 1);
    assert_eq!(f["revision"]["revision"], 1);
    assert_eq!(files_at(&a, &pid, &copy, None).await?, rev2);
    let cv = versions(&a, &pid, &copy).await?;
    assert_eq!(revisions(&cv), [1]);
    assert_eq!(cv[0]["kind"], "fork");
    assert!(cv[0]["parent_revision"].is_null());

    let f1 = data(
        &a.post(
            &format!("{nb}/fork"),
            &json!({"new_title": "copy of 1", "revision": 1}),
        )
        .await?,
        201,
    );
    let copy1 = s(&f1["notebook"]["id"]);
    assert_eq!(files_at(&a, &pid, &copy1, None).await?, rev1);

    // The source is unchanged, and stays so when the fork changes.
    data(
        &a.save(&pid, &copy, Some(1), &[("a.py", "forked")], &["d/b.py"])
            .await?,
        201,
    );
    assert_eq!(head(&a, &pid, &nid).await?, Some(2));
    assert_eq!(revisions(&versions(&a, &pid, &nid).await?), [2, 1]);
    assert_eq!(files_at(&a, &pid, &nid, Some(1)).await?, rev1);
    assert_eq!(files_at(&a, &pid, &nid, Some(2)).await?, rev2);
    assert_eq!(
        files_at(&a, &pid, &copy, None).await?,
        text_files(&[("a.py", "forked")])
    );

    // Taken titles, missing revisions, bad titles.
    for title in ["copy", "src"] {
        let e = refused(
            &a.post(&format!("{nb}/fork"), &json!({"new_title": title}))
                .await?,
            409,
            "name_taken",
        );
        assert_eq!(e["title"], title);
    }
    refused(
        &a.post(
            &format!("{nb}/fork"),
            &json!({"new_title": "nine", "revision": 9}),
        )
        .await?,
        404,
        "NOT_FOUND",
    );
    refused(
        &a.post(&format!("{nb}/fork"), &json!({"new_title": ""}))
            .await?,
        422,
        "VALIDATION_ERROR",
    );
    assert_eq!(catalog_notebooks(&a, &pid).await?.len(), 3);
    Ok(())
}

// ---------- 7. trash ----------

async fn trash_restore_and_purge(b: Backend) -> anyhow::Result<()> {
    let mut env = HubEnv::new(b).await?;
    // Leases end 2 s after they are taken, so a purge can be followed by GC.
    env.set("UNICAS_LEASE_MAX_MS", 2000);
    let token = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&token));
    let pid = a.project("P").await?;
    let nid = a.notebook(&pid, "doomed", &[("f.txt", "1")]).await?;
    let nb = nb_path(&pid, &nid);
    for i in 2..=3 {
        let c = i.to_string();
        data(
            &a.save(&pid, &nid, Some(i - 1), &[("f.txt", &c)], &[])
                .await?,
            201,
        );
    }
    let history: Vec<Files> = vec![
        text_files(&[("f.txt", "1")]),
        text_files(&[("f.txt", "2")]),
        text_files(&[("f.txt", "3")]),
    ];
    let trash = format!("/api/v1/projects/{pid}/trash");
    assert_eq!(data(&a.get(&trash).await?, 200), json!([]));

    let t = data(&a.delete(&nb).await?, 200);
    assert_eq!(t["recoverable"], true);
    let token1 = s(&t["token"]);
    // Gone from everything that reads live notebooks.
    assert!(!catalog_notebooks(&a, &pid).await?.contains_key(&nid));
    assert!(!listed_notebooks(&a, &pid).await?.contains_key(&nid));
    refused(&a.get(&nb).await?, 404, "NOT_FOUND");
    refused(&a.get(&format!("{nb}/workspace")).await?, 404, "NOT_FOUND");
    refused(&a.get(&format!("{nb}/versions")).await?, 404, "NOT_FOUND");
    refused(
        &a.get(&format!("{nb}/workspace/files/f.txt")).await?,
        404,
        "NOT_FOUND",
    );
    refused(
        &a.save(&pid, &nid, Some(3), &[("f.txt", "x")], &[]).await?,
        404,
        "NOT_FOUND",
    );
    refused(&a.delete(&nb).await?, 404, "NOT_FOUND");
    // Newest first; a second entry is purged right away.
    let spare = a.notebook(&pid, "spare", &[("s.txt", "spare")]).await?;
    let spare_token = s(&data(&a.delete(&nb_path(&pid, &spare)).await?, 200)["token"]);
    let listed = data(&a.get(&trash).await?, 200);
    let order: Vec<String> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| s(&e["token"]))
        .collect();
    assert_eq!(order, [spare_token.clone(), token1.clone()], "newest first");
    data(&a.delete(&format!("{trash}/{spare_token}")).await?, 200);
    let listed = data(&a.get(&trash).await?, 200);
    let entries = listed.as_array().unwrap();
    assert_eq!(entries.len(), 1, "{listed}");
    assert_eq!(entries[0]["token"], json!(token1));
    assert_eq!(entries[0]["notebook_id"], json!(nid));
    assert_eq!(entries[0]["title"], "doomed");
    assert_eq!(entries[0]["deleted_by"], "alice");

    // Restored with every revision.
    let r = data(
        &a.post(&format!("{trash}/{token1}/restore"), &json!({}))
            .await?,
        200,
    );
    assert_eq!(r["id"], json!(nid));
    assert_eq!(r["title"], "doomed");
    assert_eq!(r["head_revision"], 3);
    assert_eq!(data(&a.get(&trash).await?, 200), json!([]));
    assert_eq!(
        catalog_notebooks(&a, &pid)
            .await?
            .get(&nid)
            .map(String::as_str),
        Some("doomed")
    );
    assert_eq!(revisions(&versions(&a, &pid, &nid).await?), [3, 2, 1]);
    for (i, want) in history.iter().enumerate() {
        assert_eq!(&files_at(&a, &pid, &nid, Some(i as i64 + 1)).await?, want);
    }
    refused(
        &a.post(&format!("{trash}/{token1}/restore"), &json!({}))
            .await?,
        404,
        "NOT_FOUND",
    );

    // Restoring onto a title that is live again is refused; both stay intact.
    let token2 = s(&data(&a.delete(&nb).await?, 200)["token"]);
    assert_ne!(token2, token1);
    let usurper = a.notebook(&pid, "doomed", &[("u.txt", "usurper")]).await?;
    let e = refused(
        &a.post(&format!("{trash}/{token2}/restore"), &json!({}))
            .await?,
        409,
        "name_taken",
    );
    assert_eq!(e["title"], "doomed");
    assert_eq!(
        files_at(&a, &pid, &usurper, None).await?,
        text_files(&[("u.txt", "usurper")])
    );
    refused(&a.get(&nb).await?, 404, "NOT_FOUND");
    let listed = data(&a.get(&trash).await?, 200);
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["token"], json!(token2));
    // Once the title is free again, it comes back whole.
    data(
        &a.patch(&nb_path(&pid, &usurper), &json!({"title": "usurper"}))
            .await?,
        200,
    );
    data(
        &a.post(&format!("{trash}/{token2}/restore"), &json!({}))
            .await?,
        200,
    );
    for (i, want) in history.iter().enumerate() {
        assert_eq!(&files_at(&a, &pid, &nid, Some(i as i64 + 1)).await?, want);
    }

    // Purge removes it for good.
    let doomed_roots: Vec<Hash> = versions(&a, &pid, &nid)
        .await?
        .iter()
        .map(|v| s(&v["hash"]).parse().map_err(|e| anyhow::anyhow!("{e}")))
        .collect::<anyhow::Result<_>>()?;
    assert_eq!(doomed_roots.len(), 3);
    let token3 = s(&data(&a.delete(&nb).await?, 200)["token"]);
    data(&a.delete(&format!("{trash}/{token3}")).await?, 200);
    assert_eq!(data(&a.get(&trash).await?, 200), json!([]));
    refused(
        &a.post(&format!("{trash}/{token3}/restore"), &json!({}))
            .await?,
        404,
        "NOT_FOUND",
    );
    refused(
        &a.delete(&format!("{trash}/{token3}")).await?,
        404,
        "NOT_FOUND",
    );
    refused(&a.get(&nb).await?, 404, "NOT_FOUND");
    let live = catalog_notebooks(&a, &pid).await?;
    assert_eq!(live.len(), 1);
    assert_eq!(live.get(&usurper).map(String::as_str), Some("usurper"));
    // The purged notebook's title can be used again; its history is not resurrected.
    let again = a.notebook(&pid, "doomed", &[("g.txt", "new")]).await?;
    assert_eq!(revisions(&versions(&a, &pid, &again).await?), [1]);

    // Purging released every root of its history: once leases lapse, GC takes all of it and
    // nothing else.
    let cas = hub_cas(&env, &server)?;
    let space: SpaceId = pid.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut live_roots = Vec::new();
    for n in [&usurper, &again] {
        for v in versions(&a, &pid, n).await? {
            live_roots.push(s(&v["hash"]).parse().map_err(|e| anyhow::anyhow!("{e}"))?);
        }
    }
    let live_nodes = reachable(&cas, &space, &live_roots).await?;
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let gc = data(
        &a.post(&format!("/api/v1/projects/{pid}/gc"), &json!({}))
            .await?,
        200,
    );
    assert!(gc["deleted"].as_u64().unwrap() >= 9, "{gc}");
    for h in &doomed_roots {
        let got = cas.read_metadata(&space, h).await;
        assert_eq!(
            got.as_ref().err().and_then(|e| e.status()),
            Some(404),
            "version node {h} of the purged notebook survived GC: {got:?}"
        );
    }
    let usage = cas.usage(&space).await?;
    assert_eq!(usage.node_count as usize, live_nodes.len(), "{usage:?}");
    assert_eq!(
        usage.ready_content_bytes,
        live_nodes.values().sum::<u64>() as i64,
        "{usage:?}"
    );
    assert_eq!(
        files_at(&a, &pid, &usurper, None).await?,
        text_files(&[("u.txt", "usurper")])
    );
    assert_eq!(
        files_at(&a, &pid, &again, None).await?,
        text_files(&[("g.txt", "new")])
    );
    Ok(())
}

// ---------- 8. export and import ----------

async fn export_and_import(b: Backend) -> anyhow::Result<()> {
    let (_env, server, a, pid, token) = alice_with_project(b).await?;
    let big = random_bytes(3 << 20);
    let staged = upload(&a, &pid, &big).await?;
    let created = data(
        &a.post(
            &format!("/api/v1/projects/{pid}/notebooks"),
            &json!({"title": "exported", "files": {
                "main.py": {"content": "print('hi')\n"},
                "data/big.bin": {"staged": staged},
                "lib/util.py": {"content": "X = 1\n"},
            }}),
        )
        .await?,
        201,
    );
    let nid = s(&created["notebook"]["id"]);
    data(
        &a.save(&pid, &nid, Some(1), &[("main.py", "print('v2')\n")], &[])
            .await?,
        201,
    );
    data(
        &a.save(
            &pid,
            &nid,
            Some(2),
            &[("notes.md", "# notes\n")],
            &["lib/util.py"],
        )
        .await?,
        201,
    );
    let nb = nb_path(&pid, &nid);
    let mut history = Vec::new();
    for rev in 1..=3 {
        history.push(files_at(&a, &pid, &nid, Some(rev)).await?);
    }
    assert!(history[0]["data/big.bin"] == big);

    let resp = reqwest::Client::new()
        .get(format!("{}{nb}/export", server.url))
        .bearer_auth(&token)
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"],
        "application/vnd.unicas.archive"
    );
    let archive = resp.bytes().await?.to_vec();
    assert!(archive.len() > big.len(), "{} bytes", archive.len());

    let import = |title: &str| format!("/api/v1/projects/{pid}/notebooks/import?title={title}");
    let got = data(
        &a.post_bytes(
            &import("Imported"),
            "application/vnd.unicas.archive",
            archive.clone(),
            &[],
        )
        .await?,
        201,
    );
    let imp = s(&got["notebook"]["id"]);
    assert_ne!(imp, nid);
    assert_eq!(got["notebook"]["title"], "Imported");
    assert_eq!(got["notebook"]["head_revision"], 3);
    let iv = versions(&a, &pid, &imp).await?;
    assert_eq!(revisions(&iv), [3, 2, 1]);
    let sv = versions(&a, &pid, &nid).await?;
    for (i, src) in iv.iter().zip(&sv) {
        assert_eq!(i["tree"], src["tree"], "the same workspace tree");
        assert_eq!(i["message"], src["message"]);
        assert_eq!(i["kind"], "import");
    }
    for rev in 1..=3 {
        assert!(
            files_at(&a, &pid, &imp, Some(rev)).await? == history[rev as usize - 1],
            "revision {rev} of the import differs"
        );
    }

    // Damaged archives are refused and create nothing.
    let before = catalog_notebooks(&a, &pid).await?;
    let truncated = archive[..archive.len() / 2].to_vec();
    let mut corrupted = archive.clone();
    let mid = corrupted.len() / 3;
    corrupted[mid] ^= 0xff;
    let cut_tail = archive[..archive.len() - 1].to_vec();
    for (what, body) in [
        ("truncated", truncated),
        ("corrupted", corrupted),
        ("short by one byte", cut_tail),
        ("garbage", b"not an archive at all".to_vec()),
        ("empty", Vec::new()),
    ] {
        let got = a
            .post_bytes(
                &import("Broken"),
                "application/vnd.unicas.archive",
                body,
                &[],
            )
            .await?;
        assert_eq!(got.0, 422, "{what}: {}", got.1);
        refused(&got, 422, "VALIDATION_ERROR");
    }
    assert_eq!(catalog_notebooks(&a, &pid).await?, before);
    // A title that is taken, or none at all. These are refused before the body is read (the
    // hub answers `connection: close`), so each goes on a connection of its own: hyper's
    // client may otherwise hand the half-written connection to the next request
    // (hyperium/hyper#4176).
    let once = || server.client(Some(&token));
    refused(
        &once()
            .post_bytes(
                &import("exported"),
                "application/vnd.unicas.archive",
                archive.clone(),
                &[],
            )
            .await?,
        409,
        "name_taken",
    );
    // No title: refused from the query string, before the body is read. Sent without one, so
    // that the refusal is not raced by the client still writing an archive the hub never reads
    // (the connection closes after the answer, and a writing client can see that first).
    refused(
        &once()
            .post_bytes(
                &format!("/api/v1/projects/{pid}/notebooks/import"),
                "application/vnd.unicas.archive",
                Vec::new(),
                &[],
            )
            .await?,
        422,
        "VALIDATION_ERROR",
    );
    assert_eq!(catalog_notebooks(&a, &pid).await?, before);

    // Into another project (its own Space): everything is uploaded there.
    let other = a.project("Q").await?;
    let got = data(
        &a.post_bytes(
            &format!("/api/v1/projects/{other}/notebooks/import?title=Moved"),
            "application/vnd.unicas.archive",
            archive,
            &[],
        )
        .await?,
        201,
    );
    let moved = s(&got["notebook"]["id"]);
    for rev in 1..=3 {
        assert!(files_at(&a, &other, &moved, Some(rev)).await? == history[rev as usize - 1]);
    }
    Ok(())
}

// ---------- 9. push sync ----------

async fn push_sync(b: Backend) -> anyhow::Result<()> {
    let mut env = HubEnv::new(b).await?;
    env.set("UNICAS_HUB_SYNC_MAX_BYTES", 1 << 20);
    let token = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&token));
    let pid = a.project("P").await?;
    let created = data(
        &a.post(
            &format!("/api/v1/projects/{pid}/notebooks"),
            &json!({"title": "app", "source": {"type": "git", "sync_mode": "push", "entry_notebook": "app.py"}}),
        )
        .await?,
        201,
    );
    let nid = s(&created["notebook"]["id"]);
    let nb = nb_path(&pid, &nid);
    let sync_token = s(&created["sync_token"]);
    assert!(sync_token.starts_with("uhub_sync_"), "{sync_token}");
    assert_eq!(created["notebook"]["source"]["type"], "git");
    assert_eq!(created["notebook"]["source"]["entry_notebook"], "app.py");
    // Shown once.
    let shown = data(&a.get(&nb).await?, 200);
    assert!(!shown.to_string().contains(&sync_token));
    assert!(shown.get("sync_token").is_none());
    // A push-synced notebook changes only by sync.
    refused(
        &a.save(&pid, &nid, None, &[("app.py", "x")], &[]).await?,
        409,
        "CONFLICT",
    );

    let sync = |t: &str| server.client(Some(t));
    let push = |c: HubClient, body: Vec<u8>| async move {
        c.post_bytes("/api/sync/git/v1", "application/x-tar", body, &[])
            .await
    };

    let data_bin = random_bytes(200 << 10);
    // A path over the 100 bytes of a tar header's name (tar writes a long-name entry).
    let long = format!("lib/{}/{}.py", "d".repeat(70), "f".repeat(70));
    let tar1 = tar_dir(&[
        ("app.py", b"import marimo\napp = 1\n"),
        ("lib/util.py", b"def f():\n    return 1\n"),
        ("data.bin", &data_bin),
        (&long, b"long = True\n"),
    ])?;
    let tar1_len = tar1.len();
    let s1 = data(&push(sync(&sync_token), tar1).await?, 200);
    assert_eq!(s1["received_bytes"], tar1_len);
    assert_eq!(s1["revision"], 1);
    assert_eq!(s1["notebook_id"], json!(nid));
    assert_eq!(s1["file_count"], 4);
    let vid1 = s(&s1["version_id"]);
    let v1_files: Files = [
        ("app.py".to_string(), b"import marimo\napp = 1\n".to_vec()),
        ("data.bin".to_string(), data_bin.clone()),
        (
            "lib/util.py".to_string(),
            b"def f():\n    return 1\n".to_vec(),
        ),
        (long.clone(), b"long = True\n".to_vec()),
    ]
    .into();
    assert!(version_files(&a, &pid, &nid, &vid1).await? == v1_files);
    let (st, body) = a
        .get_bytes(&format!("{nb}/versions/{vid1}/files/lib%2Futil.py"))
        .await?;
    assert_eq!(
        (st.as_u16(), &body[..]),
        (200, &b"def f():\n    return 1\n"[..])
    );
    let vs = versions(&a, &pid, &nid).await?;
    assert_eq!(vs[0]["kind"], "sync");

    // One changed file: its bytes, the root directory and the version node are uploaded.
    let app2 = format!("import marimo\napp = 2\n{}\n", "#".repeat(3000));
    let tar2 = tar_dir(&[
        ("app.py", app2.as_bytes()),
        ("lib/util.py", b"def f():\n    return 1\n"),
        ("data.bin", &data_bin),
        (&long, b"long = True\n"),
    ])?;
    let s2 = sync(&sync_token)
        .post_bytes(
            "/api/sync/git/v1",
            "application/x-tar",
            tar2,
            &[
                ("x-sync-commit", "0123abcd"),
                ("x-sync-message", "second push"),
            ],
        )
        .await?;
    let s2 = data(&s2, 200);
    assert_eq!(s2["revision"], 2);
    assert_eq!(s2["uploaded_nodes"], 3, "{s2}");
    let up = s2["uploaded_bytes"].as_u64().unwrap();
    assert!(
        up >= app2.len() as u64 && up < app2.len() as u64 + 2048,
        "a one-file push uploaded {up} bytes for a {}-byte file",
        app2.len()
    );
    let vs = versions(&a, &pid, &nid).await?;
    assert_eq!(vs[0]["message"], "second push");
    assert_eq!(vs[0]["parent_revision"], 1);
    let f2 = files_at(&a, &pid, &nid, None).await?;
    assert_eq!(f2["app.py"], app2.as_bytes());
    assert!(f2["data.bin"] == data_bin);

    // Refused pushes store nothing.
    let missing_entry = tar_dir(&[("other.py", b"x")])?;
    let e = refused(
        &push(sync(&sync_token), missing_entry).await?,
        422,
        "VALIDATION_ERROR",
    );
    assert_eq!(e["entry_notebook"], "app.py");
    let good = tar_of(&[("app.py", b"ok")]);
    refused(
        &push(sync("uhub_sync_nb-aaaaaaaaaaaaaaaa_nope"), good.clone()).await?,
        401,
        "UNAUTHORIZED",
    );
    let mut wrong = sync_token.clone();
    wrong.push('x');
    refused(
        &push(sync(&wrong), good.clone()).await?,
        401,
        "UNAUTHORIZED",
    );
    refused(
        &push(server.client(None), good.clone()).await?,
        401,
        "UNAUTHORIZED",
    );
    refused(
        &push(server.client(Some(&token)), good.clone()).await?,
        401,
        "UNAUTHORIZED",
    );
    let got = sync(&sync_token)
        .post_bytes("/api/sync/git/v1", "text/plain", good.clone(), &[])
        .await?;
    assert_eq!(got.0, 415, "{}", got.1);
    assert_eq!(got.1["success"], false);
    for hostile in [
        tar_of(&[("app.py", b"ok"), ("../x", b"escape")]),
        tar_of(&[("app.py", b"ok"), ("lib/../../x", b"escape")]),
        tar_of(&[("app.py", b"ok"), ("/etc/x", b"absolute")]),
        b"this is not a tar archive, just some bytes that go on and on".repeat(20),
    ] {
        refused(
            &push(sync(&sync_token), hostile).await?,
            422,
            "VALIDATION_ERROR",
        );
    }
    refused(
        &sync(&sync_token)
            .post_bytes(
                "/api/sync/git/v1",
                "application/x-tar",
                good.clone(),
                &[("x-sync-commit", "not hex!")],
            )
            .await?,
        422,
        "VALIDATION_ERROR",
    );
    let oversized = tar_of(&[("app.py", b"ok"), ("huge.bin", &random_bytes(2 << 20))]);
    refused(
        &push(sync(&sync_token), oversized).await?,
        413,
        "PAYLOAD_TOO_LARGE",
    );
    assert_eq!(revisions(&versions(&a, &pid, &nid).await?), [2, 1]);
    assert_eq!(head(&a, &pid, &nid).await?, Some(2));

    // Rotating the token retires the old one.
    let rotated = data(&a.post(&format!("{nb}/sync-token"), &json!({})).await?, 200);
    let new_token = s(&rotated["sync_token"]);
    assert_ne!(new_token, sync_token);
    refused(
        &push(sync(&sync_token), good.clone()).await?,
        401,
        "UNAUTHORIZED",
    );
    let s3 = data(&push(sync(&new_token), good).await?, 200);
    assert_eq!(s3["revision"], 3);
    assert_eq!(
        files_at(&a, &pid, &nid, None).await?,
        text_files(&[("app.py", "ok")])
    );
    // Only push-synced notebooks have one.
    let local = a.notebook(&pid, "local", &[("a", "a")]).await?;
    refused(
        &a.post(&format!("{}/sync-token", nb_path(&pid, &local)), &json!({}))
            .await?,
        422,
        "VALIDATION_ERROR",
    );
    // A trashed notebook takes no pushes.
    data(&a.delete(&nb).await?, 200);
    refused(
        &push(sync(&new_token), tar_of(&[("app.py", b"late")])).await?,
        401,
        "UNAUTHORIZED",
    );
    Ok(())
}

/// The entry notebook must be a file of the pushed workspace. A symlinked directory on its path
/// must not let the check look outside the push, onto the hub host's filesystem.
async fn push_entry_notebook_is_checked_inside_the_push(b: Backend) -> anyhow::Result<()> {
    let (_env, server, a, pid, _) = alice_with_project(b).await?;
    let created = data(
        &a.post(
            &format!("/api/v1/projects/{pid}/notebooks"),
            &json!({"title": "app", "source": {"type": "git", "entry_notebook": "nb/app.py"}}),
        )
        .await?,
        201,
    );
    let nid = s(&created["notebook"]["id"]);
    let sync = server.client(Some(&s(&created["sync_token"])));
    let push = |body: Vec<u8>| {
        let sync = sync.clone();
        async move {
            sync.post_bytes("/api/sync/git/v1", "application/x-tar", body, &[])
                .await
        }
    };

    // A proper push: the entry notebook is a file of the push.
    let ok = data(&push(tar_of(&[("nb/app.py", b"print(1)\n")])).await?, 200);
    assert_eq!(ok["revision"], 1);

    // A hostile push: nb is a symlink to an absolute directory of the hub host. It is refused
    // while that directory holds no app.py...
    let outside = tempfile::tempdir()?;
    let target = outside
        .path()
        .to_str()
        .context("utf-8 temp dir")?
        .to_string();
    let body = tar_with_links(&[
        ("README.md", b"no notebook here", None),
        ("nb", b"", Some(&target)),
    ]);
    refused(&push(body.clone()).await?, 422, "VALIDATION_ERROR");
    assert_eq!(head(&a, &pid, &nid).await?, Some(1));
    // ...and must stay refused once it holds one: the push itself is the same.
    std::fs::write(outside.path().join("app.py"), b"host file")?;
    let got = push(body).await?;
    let head_now = head(&a, &pid, &nid).await?;
    let listing = data(
        &a.get(&format!("{}/workspace", nb_path(&pid, &nid))).await?,
        200,
    );
    assert_eq!(
        got.0, 422,
        "a push whose workspace holds no nb/app.py was accepted (the entry-notebook check \
         followed the pushed symlink nb -> {target} onto the hub host): {}; head is now \
         {head_now:?}, workspace {}",
        got.1, listing["entries"]
    );
    let e = refused(&got, 422, "VALIDATION_ERROR");
    assert_eq!(e["entry_notebook"], "nb/app.py");
    assert_eq!(head_now, Some(1), "a refused push stored a version");
    Ok(())
}

// ---------- 10. roles ----------

async fn roles_and_masking(b: Backend) -> anyhow::Result<()> {
    let env = HubEnv::new(b).await?;
    let alice = env.user("alice")?;
    let bob = env.user("bob")?;
    let server = env.start()?;
    let a = server.client(Some(&alice));
    let bb = server.client(Some(&bob));
    let pid = a.project("Private").await?;
    let nid = a
        .notebook(&pid, "secret", &[("s.txt", "classified")])
        .await?;
    let spare = a.notebook(&pid, "spare", &[("x.txt", "x")]).await?;
    let nb = nb_path(&pid, &nid);
    let proj = format!("/api/v1/projects/{pid}");
    let vid = s(&versions(&a, &pid, &nid).await?[0]["version_id"]);

    // Bob is nobody here: everything answers as if the project did not exist.
    for path in [
        proj.clone(),
        format!("{proj}/notebooks"),
        format!("{proj}/storage"),
        format!("{proj}/trash"),
        nb.clone(),
        format!("{nb}/workspace"),
        format!("{nb}/workspace/files/s.txt"),
        format!("{nb}/versions"),
        format!("{nb}/versions/{vid}"),
        format!("{nb}/versions/{vid}/files/s.txt"),
        format!("{nb}/export"),
    ] {
        let got = bb.get(&path).await?;
        assert_eq!(got.0, 404, "GET {path} as an outsider: {}", got.1);
        refused(&got, 404, "NOT_FOUND");
    }
    refused(
        &bb.save(&pid, &nid, Some(1), &[("s.txt", "x")], &[]).await?,
        404,
        "NOT_FOUND",
    );
    refused(&bb.delete(&nb).await?, 404, "NOT_FOUND");
    refused(
        &bb.post(&format!("{nb}/fork"), &json!({"new_title": "mine"}))
            .await?,
        404,
        "NOT_FOUND",
    );
    refused(
        &bb.put(
            &format!("{proj}/members"),
            &json!({"user_id": "bob", "role": "manager"}),
        )
        .await?,
        404,
        "NOT_FOUND",
    );
    assert_eq!(
        data(&bb.get("/api/v1/catalog").await?, 200)["projects"],
        json!([])
    );
    assert_eq!(
        data(&bb.get("/api/v1/projects").await?, 200)["items"],
        json!([])
    );

    // A viewer reads, and writes nothing.
    let p = data(
        &a.put(
            &format!("{proj}/members"),
            &json!({"user_id": "bob", "role": "viewer"}),
        )
        .await?,
        200,
    );
    assert!(
        p["members"]
            .as_array()
            .unwrap()
            .contains(&json!({"user_id": "bob", "role": "viewer"})),
        "{p}"
    );
    refused(
        &a.put(
            &format!("{proj}/members"),
            &json!({"user_id": "nobody", "role": "viewer"}),
        )
        .await?,
        422,
        "VALIDATION_ERROR",
    );
    refused(
        &a.put(
            &format!("{proj}/members"),
            &json!({"user_id": "bob", "role": "admin"}),
        )
        .await?,
        422,
        "VALIDATION_ERROR",
    );
    assert_eq!(data(&bb.get(&proj).await?, 200)["role"], "viewer");
    let cat = data(&bb.get("/api/v1/catalog").await?, 200);
    assert_eq!(cat["projects"].as_array().unwrap().len(), 1);
    assert_eq!(cat["projects"][0]["role"], "viewer");
    assert_eq!(
        files_at(&bb, &pid, &nid, None).await?,
        text_files(&[("s.txt", "classified")])
    );
    let (st, _) = bb.get_bytes(&format!("{nb}/export")).await?;
    assert_eq!(st, 200);
    // Storage is a viewer's read (what it answers is checked in its own test).
    let (st, _) = bb.get(&format!("{proj}/storage")).await?;
    assert!(st != 403 && st != 404, "a viewer is refused storage: {st}");
    refused(
        &bb.save(&pid, &nid, Some(1), &[("s.txt", "x")], &[]).await?,
        403,
        "FORBIDDEN",
    );
    refused(
        &bb.post_bytes(
            &format!("{proj}/uploads"),
            "application/octet-stream",
            b"tiny".to_vec(),
            &[],
        )
        .await?,
        403,
        "FORBIDDEN",
    );
    for (what, got) in [
        (
            "fork",
            bb.post(&format!("{nb}/fork"), &json!({"new_title": "mine"}))
                .await?,
        ),
        ("rename", bb.patch(&nb, &json!({"title": "renamed"})).await?),
        (
            "create",
            bb.post(&format!("{proj}/notebooks"), &json!({"title": "new"}))
                .await?,
        ),
        (
            "restore",
            bb.post(&format!("{nb}/versions/{vid}/restore"), &json!({}))
                .await?,
        ),
        ("trash", bb.delete(&nb).await?),
        (
            "promote",
            bb.put(
                &format!("{proj}/members"),
                &json!({"user_id": "bob", "role": "manager"}),
            )
            .await?,
        ),
    ] {
        assert_eq!(got.0, 403, "{what} as a viewer: {}", got.1);
        refused(&got, 403, "FORBIDDEN");
    }
    assert_eq!(head(&a, &pid, &nid).await?, Some(1));
    assert_eq!(catalog_notebooks(&a, &pid).await?.len(), 2);

    // An editor saves but does not administer.
    data(
        &a.put(
            &format!("{proj}/members"),
            &json!({"user_id": "bob", "role": "editor"}),
        )
        .await?,
        200,
    );
    let r2 = data(
        &bb.save(&pid, &nid, Some(1), &[("s.txt", "edited by bob")], &[])
            .await?,
        201,
    );
    assert_eq!(r2["revision"], 2);
    assert_eq!(versions(&a, &pid, &nid).await?[0]["author"], "bob");
    for (what, got) in [
        ("trash", bb.delete(&nb).await?),
        ("gc", bb.post(&format!("{proj}/gc"), &json!({})).await?),
        ("delete project", bb.delete(&proj).await?),
        (
            "update project",
            bb.patch(&proj, &json!({"name": "mine"})).await?,
        ),
        ("events", bb.get(&format!("{proj}/events")).await?),
    ] {
        assert_eq!(got.0, 403, "{what} as an editor: {}", got.1);
        refused(&got, 403, "FORBIDDEN");
    }
    assert!(catalog_notebooks(&a, &pid).await?.contains_key(&nid));
    // A manager does.
    data(
        &a.put(
            &format!("{proj}/members"),
            &json!({"user_id": "bob", "role": "manager"}),
        )
        .await?,
        200,
    );
    data(&bb.delete(&nb_path(&pid, &spare)).await?, 200);
    // Removed, he is nobody again.
    data(&a.delete(&format!("{proj}/members/bob")).await?, 200);
    refused(&bb.get(&nb).await?, 404, "NOT_FOUND");

    // Authentication.
    let anon = server.client(None);
    for path in [
        "/api/v1/catalog",
        "/api/v1/auth/me",
        proj.as_str(),
        nb.as_str(),
    ] {
        refused(&anon.get(path).await?, 401, "UNAUTHORIZED");
    }
    refused(
        &server
            .client(Some("uhub_pat_01ARZ3NDEKTSV4RRFFQ69G5FAV_guess"))
            .get("/api/v1/catalog")
            .await?,
        401,
        "UNAUTHORIZED",
    );
    refused(
        &server
            .client(Some("garbage"))
            .get("/api/v1/catalog")
            .await?,
        401,
        "UNAUTHORIZED",
    );
    let me = data(&bb.get("/api/v1/auth/me").await?, 200);
    assert_eq!(me["id"], "bob");
    assert_eq!(me["super_admin"], false);

    // A token of bob's own, revoked.
    let t = data(
        &bb.post("/api/v1/auth/tokens", &json!({"name": "laptop"}))
            .await?,
        201,
    );
    let laptop = server.client(Some(&s(&t["token"])));
    let tid = s(&t["id"]);
    assert_eq!(
        data(&laptop.get("/api/v1/auth/me").await?, 200)["id"],
        "bob"
    );
    let listed = data(&bb.get("/api/v1/auth/tokens").await?, 200);
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["id"] == json!(tid)),
        "{listed}"
    );
    assert!(
        !listed.to_string().contains(&s(&t["token"])),
        "secrets are not listed"
    );
    // Nobody else revokes it.
    refused(
        &a.delete(&format!("/api/v1/auth/tokens/{tid}")).await?,
        404,
        "NOT_FOUND",
    );
    data(&laptop.get("/api/v1/auth/me").await?, 200);
    data(
        &bb.delete(&format!("/api/v1/auth/tokens/{tid}")).await?,
        200,
    );
    refused(&laptop.get("/api/v1/auth/me").await?, 401, "UNAUTHORIZED");
    refused(
        &bb.delete(&format!("/api/v1/auth/tokens/{tid}")).await?,
        404,
        "NOT_FOUND",
    );
    data(&bb.get("/api/v1/auth/me").await?, 200);

    // A suspended user is refused, with every token; resumed, accepted again.
    env.cli(&["user", "suspend", "bob"])?;
    refused(&bb.get("/api/v1/auth/me").await?, 401, "UNAUTHORIZED");
    refused(&bb.get("/api/v1/catalog").await?, 401, "UNAUTHORIZED");
    data(&a.get("/api/v1/auth/me").await?, 200);
    env.cli(&["user", "resume", "bob"])?;
    data(&bb.get("/api/v1/auth/me").await?, 200);
    Ok(())
}

// ---------- 11. storage ----------

async fn storage_shows_dedup(b: Backend) -> anyhow::Result<()> {
    let (_env, _server, a, pid, _) = alice_with_project(b).await?;
    let empty = storage(&a, &pid).await?;
    for key in [
        "nodeCount",
        "readyContentBytes",
        "readyStoredBytes",
        "logicalBytes",
    ] {
        assert!(empty[key].is_i64(), "{key} missing: {empty}");
    }
    assert_eq!(empty["nodeCount"], 0);
    assert_eq!(empty["logicalBytes"], 0);

    let size = 4usize << 20;
    let big = random_bytes(size);
    let staged = upload(&a, &pid, &big).await?;
    let created = data(
        &a.post(
            &format!("/api/v1/projects/{pid}/notebooks"),
            &json!({"title": "big", "files": {"big.bin": {"staged": staged}, "note.txt": {"content": "save 1"}}}),
        )
        .await?,
        201,
    );
    let nid = s(&created["notebook"]["id"]);
    for i in 2..=10 {
        let note = format!("save {i}");
        data(
            &a.save(&pid, &nid, Some(i - 1), &[("note.txt", &note)], &[])
                .await?,
            201,
        );
    }
    let st = storage(&a, &pid).await?;
    let logical = st["logicalBytes"].as_i64().unwrap();
    let stored = st["readyStoredBytes"].as_i64().unwrap();
    let content = st["readyContentBytes"].as_i64().unwrap();
    let size = size as i64;
    assert_eq!(logical, 10 * (size + 6) + 1, "ten full copies: {st}");
    assert!(
        stored >= size * 9 / 10 && stored < size * 11 / 10,
        "the big file is stored once: {st}"
    );
    assert!(content >= size && content < size + 64 * 1024, "{st}");
    assert!(st["nodeCount"].as_i64().unwrap() > 10, "{st}");
    assert_eq!(st["keptVersions"], 10);
    assert!(st["dedupRatio"].as_f64().unwrap() > 9.0, "{st}");
    Ok(())
}

// ---------- 12. retention and GC ----------

async fn retention_and_gc(b: Backend) -> anyhow::Result<()> {
    let mut env = HubEnv::new(b).await?;
    env.set("UNICAS_HUB_MAX_VERSIONS", 3);
    env.set("UNICAS_LEASE_MAX_MS", 2000);
    let token = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&token));
    let pid = a.project("P").await?;
    let nbs = format!("/api/v1/projects/{pid}/notebooks");

    // Six revisions: one large file they all share, and one file of each revision's own.
    let big = random_bytes(3 << 20);
    let staged = upload(&a, &pid, &big).await?;
    let uniques: Vec<Vec<u8>> = (1..=6).map(|i| random_bytes(1000 + 100 * i)).collect();
    let created = data(
        &a.post(
            &nbs,
            &json!({"title": "kept", "files": {
                "big.bin": {"staged": staged},
                "u.bin": {"content_base64": b64(&uniques[0])},
            }}),
        )
        .await?,
        201,
    );
    let nid = s(&created["notebook"]["id"]);
    let nb = nb_path(&pid, &nid);
    for i in 2..=6i64 {
        data(
            &a.post(
                &format!("{nb}/workspace"),
                &json!({"expected_revision": i - 1, "files": {"u.bin": {"content_base64": b64(&uniques[i as usize - 1])}}}),
            )
            .await?,
            201,
        );
    }
    let expect = |rev: i64| -> Files {
        let mut f: Files = [
            ("big.bin".to_string(), big.clone()),
            (
                "u.bin".to_string(),
                uniques[rev.min(6) as usize - 1].clone(),
            ),
        ]
        .into();
        if rev == 7 {
            f.insert("note.txt".into(), b"seven".to_vec());
        }
        f
    };

    // Only the newest three are kept; the others stay listed as pruned and answer 410.
    let vs = versions(&a, &pid, &nid).await?;
    assert_eq!(revisions(&vs), [6, 5, 4, 3, 2, 1]);
    let states: Vec<String> = vs.iter().map(|v| s(&v["state"])).collect();
    assert_eq!(
        states,
        ["kept", "kept", "kept", "pruned", "pruned", "pruned"]
    );
    for v in vs.iter().filter(|v| v["state"] == "pruned") {
        let rev = v["revision"].as_i64().unwrap();
        let vid = s(&v["version_id"]);
        let e = refused(
            &a.get(&format!("{nb}/versions/{vid}")).await?,
            410,
            "revision_pruned",
        );
        assert_eq!(e["revision"], rev);
        refused(
            &a.get(&format!("{nb}/versions/{vid}/files/u.bin")).await?,
            410,
            "revision_pruned",
        );
        refused(
            &a.get(&format!("{nb}/workspace?revision={rev}")).await?,
            410,
            "revision_pruned",
        );
        refused(
            &a.get(&format!("{nb}/workspace/files/big.bin?revision={rev}"))
                .await?,
            410,
            "revision_pruned",
        );
        refused(
            &a.post(&format!("{nb}/versions/{vid}/restore"), &json!({}))
                .await?,
            410,
            "revision_pruned",
        );
        refused(
            &a.post(
                &format!("{nb}/fork"),
                &json!({"new_title": format!("f{rev}"), "revision": rev}),
            )
            .await?,
            410,
            "revision_pruned",
        );
        refused(
            &a.post(
                &format!("{nb}/branch-refused-edit"),
                &json!({"base_revision": rev, "files": {"x": {"content": "x"}}}),
            )
            .await?,
            410,
            "revision_pruned",
        );
    }
    assert_eq!(catalog_notebooks(&a, &pid).await?.len(), 1);

    // History goes on above the pruned numbers, and keeps pruning.
    let r7 = data(
        &a.save(&pid, &nid, Some(6), &[("note.txt", "seven")], &[])
            .await?,
        201,
    );
    assert_eq!(r7["revision"], 7);
    let vs = versions(&a, &pid, &nid).await?;
    assert_eq!(revisions(&vs), [7, 6, 5, 4, 3, 2, 1]);
    let states: Vec<String> = vs.iter().map(|v| s(&v["state"])).collect();
    assert_eq!(
        states,
        [
            "kept", "kept", "kept", "pruned", "pruned", "pruned", "pruned"
        ]
    );
    let by_rev: BTreeMap<i64, Value> = vs
        .iter()
        .map(|v| (v["revision"].as_i64().unwrap(), v.clone()))
        .collect();

    // What GC may take: the nodes only the pruned versions reference, computed in the CAS.
    let cas = hub_cas(&env, &server)?;
    let space: SpaceId = pid.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    let hash_of = |rev: i64, field: &str| -> anyhow::Result<Hash> {
        s(&by_rev[&rev][field])
            .parse()
            .map_err(|e| anyhow::anyhow!("{e}"))
    };
    let kept_roots: Vec<Hash> = (5..=7)
        .map(|r| hash_of(r, "hash"))
        .collect::<Result<_, _>>()?;
    let pruned_roots: Vec<Hash> = (1..=4)
        .map(|r| hash_of(r, "hash"))
        .collect::<Result<_, _>>()?;
    let kept_nodes = reachable(&cas, &space, &kept_roots).await?;
    let pruned_nodes = reachable(&cas, &space, &pruned_roots).await?;
    let only_pruned: HashMap<Hash, u64> = pruned_nodes
        .iter()
        .filter(|(h, _)| !kept_nodes.contains_key(h))
        .map(|(h, n)| (*h, *n))
        .collect();
    // By construction: each pruned revision's version node, tree and own file, nothing else.
    let mut by_construction = BTreeSet::new();
    for rev in 1..=4i64 {
        by_construction.insert(hash_of(rev, "hash")?);
        by_construction.insert(hash_of(rev, "tree")?);
        by_construction.insert(tests::leaf(&uniques[rev as usize - 1]).0);
    }
    let computed: BTreeSet<Hash> = only_pruned.keys().copied().collect();
    assert_eq!(
        computed, by_construction,
        "the nodes only pruned versions hold"
    );
    let unique_bytes: u64 = uniques[..4].iter().map(|u| u.len() as u64).sum();
    let leaf_bytes: u64 = (0..4)
        .map(|i| only_pruned[&tests::leaf(&uniques[i]).0])
        .sum();
    assert_eq!(leaf_bytes, unique_bytes);
    let freed_count = only_pruned.len() as i64;
    let freed_bytes: i64 = only_pruned.values().sum::<u64>() as i64;
    let kept_bytes: i64 = kept_nodes.values().sum::<u64>() as i64;

    // Leases lapse (the CAS clamps them to 2 s), then GC.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let before = cas.usage(&space).await?;
    let route_before = a.get(&format!("/api/v1/projects/{pid}/storage")).await?;
    assert_eq!(
        before.node_count as usize,
        kept_nodes.len() + only_pruned.len(),
        "the Space holds exactly what the versions reference: {before:?}"
    );
    assert_eq!(
        before.ready_content_bytes,
        kept_bytes + freed_bytes,
        "{before:?}"
    );
    let gc = data(
        &a.post(&format!("/api/v1/projects/{pid}/gc"), &json!({}))
            .await?,
        200,
    );
    assert_eq!(gc["deleted"], freed_count, "{gc}");
    assert_eq!(gc["reclaimed_content_bytes"], freed_bytes, "{gc}");
    let after = cas.usage(&space).await?;
    let route_after = a.get(&format!("/api/v1/projects/{pid}/storage")).await?;
    assert_eq!(
        before.node_count - after.node_count,
        freed_count,
        "before {before:?}, after {after:?}"
    );
    assert_eq!(
        before.ready_content_bytes - after.ready_content_bytes,
        freed_bytes,
        "before {before:?}, after {after:?}"
    );
    assert_eq!(after.node_count as usize, kept_nodes.len(), "{after:?}");
    assert_eq!(after.ready_content_bytes, kept_bytes, "{after:?}");
    for h in &computed {
        let got = cas.read_metadata(&space, h).await;
        assert_eq!(
            got.as_ref().err().and_then(|e| e.status()),
            Some(404),
            "{h} survived GC: {got:?}"
        );
    }

    // Every kept version still loads, byte-identical; a second GC finds nothing.
    for rev in 5..=7i64 {
        assert!(
            files_at(&a, &pid, &nid, Some(rev)).await? == expect(rev),
            "revision {rev} after GC"
        );
        let vid = s(&by_rev[&rev]["version_id"]);
        assert!(version_files(&a, &pid, &nid, &vid).await? == expect(rev));
    }
    let gc2 = data(
        &a.post(&format!("/api/v1/projects/{pid}/gc"), &json!({}))
            .await?,
        200,
    );
    assert_eq!(gc2["deleted"], 0, "{gc2}");

    // The storage route shows those numbers, before and after.
    let kept_logical: i64 = (5..=7)
        .map(|r| by_rev[&r]["size_bytes"].as_i64().unwrap())
        .sum();
    for (when, got, usage) in [
        ("before GC", route_before, before),
        ("after GC", route_after, after),
    ] {
        let st = data(&got, 200);
        assert_eq!(st["nodeCount"], usage.node_count, "{when}: {st}");
        assert_eq!(
            st["readyContentBytes"], usage.ready_content_bytes,
            "{when}: {st}"
        );
        assert_eq!(
            st["readyStoredBytes"], usage.ready_stored_bytes,
            "{when}: {st}"
        );
        assert_eq!(st["logicalBytes"], kept_logical, "{when}: {st}");
        assert_eq!(st["keptVersions"], 3, "{when}: {st}");
        assert_eq!(st["prunedVersions"], 4, "{when}: {st}");
    }
    Ok(())
}

// ---------- 13. single user ----------

async fn single_user_mode(b: Backend) -> anyhow::Result<()> {
    let mut env = HubEnv::new(b).await?;
    env.set("UNICAS_HUB_AUTH", "none");
    let server = env.start()?;
    let c = server.client(None);
    let me = data(&c.get("/api/v1/auth/me").await?, 200);
    assert_eq!(me["id"], "local");
    let pid = c.project("Mine").await?;
    let p = data(&c.get(&format!("/api/v1/projects/{pid}")).await?, 200);
    assert_eq!(p["owner"], "local");
    let nid = c.notebook(&pid, "nb", &[("a.py", "1")]).await?;
    data(
        &c.save(&pid, &nid, Some(1), &[("a.py", "2")], &[]).await?,
        201,
    );
    let vs = versions(&c, &pid, &nid).await?;
    assert_eq!(revisions(&vs), [2, 1]);
    assert_eq!(vs[0]["author"], "local");
    assert_eq!(
        files_at(&c, &pid, &nid, None).await?,
        text_files(&[("a.py", "2")])
    );
    let cat = data(&c.get("/api/v1/catalog").await?, 200);
    assert_eq!(cat["projects"].as_array().unwrap().len(), 1);
    // No admin token is printed: there is nothing to log in to.
    assert!(
        !server
            .stdout_lines()
            .iter()
            .any(|l| l.starts_with("admin token: ")),
        "{:?}",
        server.stdout_lines()
    );
    Ok(())
}

// ---------- 14. OpenAPI ----------

async fn openapi_lists_every_route(b: Backend) -> anyhow::Result<()> {
    let env = HubEnv::new(b).await?;
    let server = env.start()?;
    let c = server.client(None);
    let (st, doc) = c.get("/api/v1/doc").await?;
    assert_eq!(st, 200);
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
        "{}",
        doc["openapi"]
    );
    let used: &[(&str, &str)] = &[
        ("get", "/api/v1/catalog"),
        ("get", "/api/v1/system"),
        ("get", "/api/v1/users"),
        ("get", "/api/v1/events"),
        ("get", "/api/v1/auth/me"),
        ("get", "/api/v1/auth/tokens"),
        ("post", "/api/v1/auth/tokens"),
        ("delete", "/api/v1/auth/tokens/{token_id}"),
        ("get", "/api/v1/projects"),
        ("post", "/api/v1/projects"),
        ("get", "/api/v1/projects/{pid}"),
        ("patch", "/api/v1/projects/{pid}"),
        ("delete", "/api/v1/projects/{pid}"),
        ("put", "/api/v1/projects/{pid}/members"),
        ("delete", "/api/v1/projects/{pid}/members/{user_id}"),
        ("get", "/api/v1/projects/{pid}/events"),
        ("get", "/api/v1/projects/{pid}/storage"),
        ("post", "/api/v1/projects/{pid}/gc"),
        ("get", "/api/v1/projects/{pid}/trash"),
        ("post", "/api/v1/projects/{pid}/trash/{token}/restore"),
        ("delete", "/api/v1/projects/{pid}/trash/{token}"),
        ("post", "/api/v1/projects/{pid}/uploads"),
        ("get", "/api/v1/projects/{pid}/notebooks"),
        ("post", "/api/v1/projects/{pid}/notebooks"),
        ("post", "/api/v1/projects/{pid}/notebooks/import"),
        ("get", "/api/v1/projects/{pid}/notebooks/{nid}"),
        ("patch", "/api/v1/projects/{pid}/notebooks/{nid}"),
        ("delete", "/api/v1/projects/{pid}/notebooks/{nid}"),
        ("get", "/api/v1/projects/{pid}/notebooks/{nid}/workspace"),
        ("post", "/api/v1/projects/{pid}/notebooks/{nid}/workspace"),
        (
            "get",
            "/api/v1/projects/{pid}/notebooks/{nid}/workspace/files/{path}",
        ),
        ("get", "/api/v1/projects/{pid}/notebooks/{nid}/versions"),
        (
            "get",
            "/api/v1/projects/{pid}/notebooks/{nid}/versions/{vid}",
        ),
        (
            "get",
            "/api/v1/projects/{pid}/notebooks/{nid}/versions/{vid}/files/{path}",
        ),
        (
            "post",
            "/api/v1/projects/{pid}/notebooks/{nid}/versions/{vid}/restore",
        ),
        ("post", "/api/v1/projects/{pid}/notebooks/{nid}/fork"),
        (
            "post",
            "/api/v1/projects/{pid}/notebooks/{nid}/branch-refused-edit",
        ),
        ("get", "/api/v1/projects/{pid}/notebooks/{nid}/export"),
        ("post", "/api/v1/projects/{pid}/notebooks/{nid}/sync-token"),
        ("post", "/api/sync/git/v1"),
    ];
    let paths = doc["paths"].as_object().context("no paths")?;
    let mut missing = Vec::new();
    for (method, path) in used {
        let op = &doc["paths"][*path][*method];
        if !op.is_object() {
            missing.push(format!("{} {path}", method.to_uppercase()));
            continue;
        }
        assert!(
            op["responses"].as_object().is_some_and(|r| !r.is_empty()),
            "{method} {path} documents no responses"
        );
    }
    assert!(
        missing.is_empty(),
        "routes missing from /api/v1/doc: {missing:?}\ndocumented: {:?}",
        paths.keys().collect::<Vec<_>>()
    );
    // The document describes the envelope and both bearer schemes.
    let schemes = &doc["components"]["securitySchemes"];
    assert!(
        schemes["token"].is_object() && schemes["sync_token"].is_object(),
        "{schemes}"
    );
    assert!(doc["components"]["schemas"]["ErrorEnvelope"].is_object());
    // Served without authentication, also as openapi.json.
    let (st, same) = c.get("/api/v1/openapi.json").await?;
    assert_eq!(st, 200);
    assert_eq!(same["paths"], doc["paths"]);
    // Every documented route exists: none answers the router's fallback 404.
    let hub_token = server
        .admin_token()
        .context("the first start printed no admin token")?;
    let authed = server.client(Some(&hub_token));
    for (method, path) in used.iter().filter(|(m, _)| *m == "get") {
        let concrete = path
            .replace("{pid}", "proj-aaaaaaaaaaaaaaaa")
            .replace("{nid}", "nb-aaaaaaaaaaaaaaaa")
            .replace("{vid}", "ver_01ARZ3NDEKTSV4RRFFQ69G5FAV")
            .replace("{path}", "x")
            .replace("{token_id}", "x");
        let got = authed.get(&concrete).await?;
        if got.0 == 404 {
            assert_ne!(
                got.1["error"]["message"], "no such route",
                "{method} {path} is documented but not routed"
            );
        }
    }
    Ok(())
}
