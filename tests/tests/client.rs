//! The client and the `unicas` tool end to end: trees, files, chunking, export and import, and a
//! server restart in the middle of a tree put.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use tests::*;

/// `unicas` with the connection of `app` on `server` in `space`.
fn unicas(server_url: &str, app: &TestApp, space: &str, args: &[&str]) -> Output {
    Command::new(binary("e2e-unicas"))
        .args(args)
        .env("UNICAS_SERVER", server_url)
        .env("UNICAS_APP", app.app.as_str())
        .env("UNICAS_SPACE", space)
        .env("UNICAS_SIGNING_KEY", &app.key.private_path)
        .env("UNICAS_KID", &app.kid)
        .env("UNICAS_ISSUER", &app.issuer)
        .stdin(Stdio::null())
        .output()
        .expect("unicas runs")
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "unicas failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn json(out: Output) -> Value {
    serde_json::from_str(ok(out).trim()).expect("json")
}

fn failed(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "expected a failure, got {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(out.stdout.is_empty(), "nothing on stdout when failing");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A copy of this repository's own files, plus an empty file, empty directories, an executable,
/// a symlink and a 12 MiB file.
fn sample_tree(root: &Path) -> anyhow::Result<PathBuf> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = root.join("tree");
    let files = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(&repo)
        .output()?;
    anyhow::ensure!(files.status.success(), "git ls-files failed");
    for name in files.stdout.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let rel = Path::new(std::str::from_utf8(name)?);
        let src = repo.join(rel);
        if !src.is_file() {
            continue;
        }
        let dst = dir.join(rel);
        std::fs::create_dir_all(dst.parent().unwrap())?;
        std::fs::copy(&src, &dst)?;
    }
    std::fs::write(dir.join("empty.txt"), b"")?;
    std::fs::create_dir_all(dir.join("empty-dir"))?;
    std::fs::create_dir_all(dir.join("nested/empty/deeper"))?;
    std::fs::write(dir.join("run.sh"), b"#!/bin/sh\necho hi\n")?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.join("run.sh"), std::fs::Permissions::from_mode(0o755))?;
    std::os::unix::fs::symlink("README.md", dir.join("readme-link"))?;
    let mut big = vec![0u8; 12 << 20];
    rand::RngCore::fill_bytes(
        &mut <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(12),
        &mut big[..],
    );
    std::fs::create_dir_all(dir.join("data"))?;
    std::fs::write(dir.join("data/big.bin"), big)?;
    Ok(dir)
}

fn diff(a: &Path, b: &Path) {
    let out = Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(a)
        .arg(b)
        .output()
        .expect("diff runs");
    assert!(
        out.status.success(),
        "trees differ:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

async fn tree_round_trip(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let dir = sample_tree(env.dir.path())?;
    let run = |args: &[&str]| unicas(&server.url, &app, "s", args);

    let first = json(run(&["--json", "tree", "put", dir.to_str().unwrap()]));
    let hash = first["hash"].as_str().unwrap().to_string();
    assert!(
        first["uploadedBytes"].as_u64().unwrap() > 12 << 20,
        "{first}"
    );
    // Large nodes go up by one PUT each to the URL the search for missing nodes was given,
    // and are then leased in batches: the single-lease route only leases the root at the end.
    let scrape = reqwest::get(format!("{}/metrics", server.url))
        .await?
        .text()
        .await?;
    let route = |method: &str, route: &str| {
        metric(
            &scrape,
            &format!(
                "unicas_http_requests_total{{method=\"{method}\",route=\"{route}\",status=\"200\"}}"
            ),
        )
    };
    let (single, puts) = (
        route("POST", "/v1/cas/nodes/{hash}/lease"),
        route("PUT", "/v1/cas/uploads/{generation}"),
    );
    eprintln!("first tree put: {single} single leases, {puts} uploads");
    assert!(puts >= 8.0 || b.blobs == Blobs::S3, "{puts} uploads");
    assert_eq!(single, 1.0, "single leases: {single}");
    // Plain output is exactly the hash.
    assert_eq!(
        ok(run(&["tree", "put", dir.to_str().unwrap()])),
        format!("{hash}\n")
    );

    let out = env.dir.path().join("out");
    ok(run(&["tree", "get", &hash, out.to_str().unwrap()]));
    diff(&dir, &out);
    use std::os::unix::fs::PermissionsExt;
    assert_ne!(
        std::fs::metadata(out.join("run.sh"))?.permissions().mode() & 0o111,
        0,
        "executable kept"
    );
    assert_eq!(
        std::fs::read_link(out.join("readme-link"))?,
        Path::new("README.md")
    );
    // Into a non-empty directory: refused.
    assert!(failed(&run(&["tree", "get", &hash, out.to_str().unwrap()])).contains("not empty"));

    // The same tree again uploads nothing.
    let again = json(run(&["--json", "tree", "put", dir.to_str().unwrap()]));
    assert_eq!(again["hash"], first["hash"]);
    assert_eq!(again["uploadedBytes"], 0, "{again}");

    // One byte changed in the middle of the large file: only the chunks around it move.
    let big = dir.join("data/big.bin");
    let mut bytes = std::fs::read(&big)?;
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&big, &bytes)?;
    let edited = json(run(&["--json", "tree", "put", dir.to_str().unwrap()]));
    let moved = edited["uploadedBytes"].as_u64().unwrap();
    eprintln!(
        "one byte changed in a 12 MiB file: {moved} bytes in {} nodes uploaded (of {} tree bytes)",
        edited["uploadedNodes"], edited["treeBytes"]
    );
    assert_ne!(edited["hash"], first["hash"]);
    assert!(moved < 9 << 20, "at most a couple of chunks move: {edited}");
    let out2 = env.dir.path().join("out2");
    ok(run(&[
        "tree",
        "get",
        edited["hash"].as_str().unwrap(),
        out2.to_str().unwrap(),
    ]));
    diff(&dir, &out2);
    // The same tree in a path Space, as the public contract names Spaces: another partition.
    let in_path = |args: &[&str]| unicas(&server.url, &app, "/team/notes", args);
    let pathed = json(in_path(&["--json", "tree", "put", dir.to_str().unwrap()]));
    assert_eq!(pathed["hash"], edited["hash"]);
    assert!(
        pathed["uploadedBytes"].as_u64().unwrap() > 12 << 20,
        "{pathed}"
    );
    let out3 = env.dir.path().join("out3");
    ok(in_path(&[
        "tree",
        "get",
        pathed["hash"].as_str().unwrap(),
        out3.to_str().unwrap(),
    ]));
    diff(&dir, &out3);

    // Files on their own.
    let put = json(run(&["--json", "put", big.to_str().unwrap()]));
    assert_eq!(put["chunked"], true);
    assert_eq!(put["uploadedBytes"], 0, "its chunks are stored already");
    let got = env.dir.path().join("big.copy");
    ok(run(&[
        "get",
        put["hash"].as_str().unwrap(),
        "-o",
        got.to_str().unwrap(),
    ]));
    assert_eq!(std::fs::read(&got)?, bytes);
    // A file of at most 4 KiB is one leaf (larger text is cut into chunks).
    let small = ok(run(&["get", &leaf_hash_of(&dir.join("run.sh"))?]));
    assert_eq!(small, std::fs::read_to_string(dir.join("run.sh"))?);
    let stat = json(run(&["--json", "stat", put["hash"].as_str().unwrap()]));
    assert_eq!(
        stat["metadata"]["contentType"],
        cas_format::SVALUE_CONTENT_TYPE
    );
    let gone = cas_format::Hash::digest(b"never stored").to_string();
    assert!(failed(&run(&["get", &gone])).contains("404"));
    env.assert_consistent("hub")?;
    Ok(())
}

/// The leaf hash of a small file, as `unicas hash` computes it.
fn leaf_hash_of(path: &Path) -> anyhow::Result<String> {
    let out = Command::new(binary("e2e-unicas"))
        .args(["hash", "--content-type", "application/octet-stream"])
        .arg(path)
        .output()?;
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

async fn export_and_import(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let dir = env.dir.path().join("small");
    std::fs::create_dir_all(dir.join("sub"))?;
    std::fs::write(dir.join("a.txt"), b"alpha\n")?;
    std::fs::write(dir.join("sub/b.txt"), b"beta\n")?;
    std::fs::write(
        dir.join("big.bin"),
        (0..3u32 << 20)
            .map(|i| (i % 253) as u8)
            .collect::<Vec<u8>>(),
    )?;
    let run = |space: &str, args: &[&str]| unicas(&server.url, &app, space, args);
    let root = ok(run("from", &["tree", "put", dir.to_str().unwrap()]))
        .trim()
        .to_string();
    let archive = env.dir.path().join("tree.ucar");
    let exported = json(run(
        "from",
        &["--json", "export", &root, "-o", archive.to_str().unwrap()],
    ));
    let offline = ok(run(
        "from",
        &["archive", "verify", archive.to_str().unwrap()],
    ));
    assert!(
        offline.starts_with(&format!("root {root}\nnodes {}\n", exported["nodes"])),
        "{offline}"
    );

    // Into another Space, retained: the roots come back on stdout.
    let imported = ok(run(
        "to",
        &[
            "import",
            archive.to_str().unwrap(),
            "--retain",
            "--request-id",
            "import:tree:1",
        ],
    ));
    assert_eq!(imported, format!("{root}\n"));
    let out = env.dir.path().join("imported");
    ok(run("to", &["tree", "get", &root, out.to_str().unwrap()]));
    diff(&dir, &out);
    assert_eq!(ok(run("to", &["refs", "list"])), format!("{root} 1\n"));
    // Twice: nothing moves, the root ref is a replay.
    let again = json(run(
        "to",
        &[
            "--json",
            "import",
            archive.to_str().unwrap(),
            "--retain",
            "--request-id",
            "import:tree:1",
        ],
    ));
    assert_eq!(
        (again["uploadedBytes"].as_u64(), again["replayed"].as_bool()),
        (Some(0), Some(true)),
        "{again}"
    );
    assert_eq!(ok(run("to", &["refs", "list"])), format!("{root} 1\n"));

    // Broken archives are refused before anything is stored or referenced.
    let bytes = std::fs::read(&archive)?;
    let truncated = env.dir.path().join("truncated.ucar");
    std::fs::write(&truncated, &bytes[..bytes.len() - 100])?;
    let mut flipped_bytes = bytes.clone();
    let at = flipped_bytes.len() / 2;
    flipped_bytes[at] ^= 0x01;
    let flipped = env.dir.path().join("flipped.ucar");
    std::fs::write(&flipped, &flipped_bytes)?;
    // A parent whose child is neither in the archive nor in the target Space.
    let (child, _) = leaf(b"a child nobody has");
    let (parent, parent_bytes) = node("application/x-test", &[child], b"parent");
    let mut w = cas_format::archive::ArchiveWriter::new(Vec::new(), &[parent], Default::default())?;
    w.write_node(&parent_bytes)?;
    let dangling = env.dir.path().join("dangling.ucar");
    std::fs::write(&dangling, w.finish()?.0)?;
    for (file, expect) in [
        (&truncated, "truncated"),
        (&flipped, "invalid archive"),
        (&dangling, "neither in it nor in the target Space"),
    ] {
        let err = failed(&run(
            "clean",
            &[
                "import",
                file.to_str().unwrap(),
                "--retain",
                "--request-id",
                "import:bad",
            ],
        ));
        assert!(err.contains(expect), "{}: {err}", file.display());
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
    let usage = json(run("clean", &["--json", "usage"]));
    assert_eq!(usage["nodeCount"], 0, "nothing was stored: {usage}");
    assert_eq!(
        ok(run("clean", &["refs", "list"])),
        "",
        "nothing is root-referenced"
    );
    // --retain needs a request id.
    assert!(
        failed(&run(
            "clean",
            &["import", archive.to_str().unwrap(), "--retain"]
        ))
        .contains("--request-id")
    );
    Ok(())
}

/// The server is killed and restarted (same address) while a tree put is uploading: the put
/// completes by retrying, and a second run uploads nothing more.
async fn restart_during_tree_put(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    env.set("UNICAS_LISTEN", format!("127.0.0.1:{port}"));
    let app = env.create_app("hub")?;
    let dir = env.dir.path().join("many");
    std::fs::create_dir_all(&dir)?;
    for i in 0..60u32 {
        let content: Vec<u8> = (0..(512u32 << 10))
            .map(|k| (k.wrapping_mul(i + 3) >> 3) as u8)
            .collect();
        std::fs::write(dir.join(format!("f{i:03}.bin")), content)?;
    }
    let mut server = env.start()?;
    let url = server.url.clone();
    let child = Command::new(binary("e2e-unicas"))
        .args(["--json", "tree", "put", "--parallel", "2"])
        .arg(&dir)
        .env("UNICAS_SERVER", &url)
        .env("UNICAS_APP", "hub")
        .env("UNICAS_SPACE", "s")
        .env("UNICAS_SIGNING_KEY", &app.key.private_path)
        .env("UNICAS_KID", &app.kid)
        .env("UNICAS_ISSUER", &app.issuer)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Kill once some nodes are stored.
    let client = app.client(&server);
    let sp = space("s");
    for _ in 0..400 {
        if client.usage(&sp).await?.node_count >= 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.kill();
    let stored_at_kill = env.meta().await?.usage_row(&app.app, &sp).await?.node_count;
    server = env.start()?;
    let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
    let first: Value = if out.status.success() {
        serde_json::from_slice(&out.stdout)?
    } else {
        // The retries ran out before the server came back: running it again completes.
        eprintln!("first run failed: {}", String::from_utf8_lossy(&out.stderr));
        json(unicas(
            &server.url,
            &app,
            "s",
            &["--json", "tree", "put", dir.to_str().unwrap()],
        ))
    };
    let total = first["treeBytes"].as_u64().unwrap();
    let uploaded = first["uploadedBytes"].as_u64().unwrap();
    eprintln!(
        "killed with {stored_at_kill} nodes stored; the run uploaded {uploaded} of {total} bytes"
    );
    assert!(
        stored_at_kill > 0 && stored_at_kill < 61,
        "killed mid-way: {stored_at_kill}"
    );
    // No duplicate work beyond the uploads in flight at the kill (two at a time).
    assert!(uploaded <= total + 2 * (600 << 10), "{uploaded} of {total}");
    let again = json(unicas(
        &server.url,
        &app,
        "s",
        &["--json", "tree", "put", dir.to_str().unwrap()],
    ));
    assert_eq!(again["uploadedBytes"], 0);
    let out_dir = env.dir.path().join("back");
    ok(unicas(
        &server.url,
        &app,
        "s",
        &[
            "tree",
            "get",
            first["hash"].as_str().unwrap(),
            out_dir.to_str().unwrap(),
        ],
    ));
    diff(&dir, &out_dir);
    env.assert_consistent("hub")?;
    Ok(())
}

e2e!(tree_round_trip, export_and_import, restart_during_tree_put);
