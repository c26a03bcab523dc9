//! The storage benchmark of the hub: replays the history of a real Git repository of notebooks
//! through push sync (`POST /api/sync/git/v1`), one push per commit, oldest first, and sets what
//! the CAS stores beside what the same snapshots cost elsewhere, measured in the same run.
//!
//! ```text
//! scripts/bench hub [REPO] [OPTIONS]     # builds release binaries, starts a local S3 server
//! hub-bench REPO [OPTIONS]
//!   REPO                     a Git directory or work tree; its HEAD is replayed
//!   --topo                   every commit reachable from HEAD in topological order
//!                            (default: `git rev-list --reverse --first-parent HEAD`)
//!   --limit N                only the first N commits of that list
//!   --compress-min-bytes N   compression threshold of the replays that compress (default 64,
//!                            the service's default)
//!   --compress-level N       their zstd level (default 3, the service's default)
//!   --no-plain               skip the replay with the layout before compression and deltas
//!                            (compression off, no deltas)
//!   --no-zstd                skip the replay with compression at rest and no deltas
//!   --delta-max-depth N      chain depth of the replay with deltas (default 8, the service's
//!                            default)
//!   --no-delta               skip the replay with the service's defaults (compression and
//!                            deltas against the bases the hub names)
//!   --no-restic | --no-git   skip those baselines
//!   --fs                     the filesystem store even when an S3 server is configured
//!   --csv FILE               also write one line per push to FILE
//! ```
//!
//! Each replay starts a fresh `unicas-hub serve` (the `e2e-unicas-hub` build) embedding its CAS,
//! SQLite metadata. With `UNICAS_S3_ENDPOINT` and `UNICAS_TEST_BUCKET` set (scripts/bench starts
//! a moto server), the CAS's object store is S3 reached through a counting proxy, so object-store
//! requests are counted for real (presigned uploads go through the proxy too: their URLs are
//! signed for its address). Otherwise the store is the filesystem and the count is derived from
//! the CAS's `/metrics` (see [`derived_store_requests`]).
//!
//! Reported, for the same history:
//! - storage: the CAS's `readyStoredBytes` (with `readyContentBytes`, `nodeCount`) from
//!   `GET /api/v1/projects/{pid}/storage`, beside the seed-000 layout (every version a full copy:
//!   the sum over commits of the tree's file bytes, from `git ls-tree`, checked against the
//!   hub's `logicalBytes`), git's packs after `git gc --aggressive --prune=now` (the same
//!   snapshots as a linear history, and a clone of HEAD when the repository is complete), and a
//!   restic repository (v2, compression auto) with one backup per commit;
//! - per push: uploaded bytes (beside the tar body), save latency (beside `restic backup` of the
//!   same tree), object-store requests (beside the files a full copy would write) and CAS API
//!   requests by route.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tests::fault_proxy::FaultProxy;
use tests::hub::{HubClient, HubEnv};
use tests::{Backend, Blobs};

/// How the CAS of one replay stores objects.
#[derive(Debug, Clone, Copy)]
struct Layout {
    compress_min_bytes: u64,
    compress_level: i32,
    delta_max_depth: u32,
}

#[derive(Debug, Clone)]
struct Options {
    repo: PathBuf,
    topo: bool,
    limit: Option<usize>,
    compress_min_bytes: u64,
    compress_level: i32,
    delta_max_depth: u32,
    plain: bool,
    zstd: bool,
    delta: bool,
    restic: bool,
    git: bool,
    fs: bool,
    csv: Option<PathBuf>,
}

fn usage() -> anyhow::Error {
    anyhow::anyhow!(
        "usage: hub-bench REPO [--topo] [--limit N] [--compress-min-bytes N] \
         [--compress-level N] [--delta-max-depth N] [--no-plain] [--no-zstd] [--no-delta] [--no-restic] [--no-git] \
         [--fs] [--csv FILE]"
    )
}

fn parse_options() -> anyhow::Result<Options> {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let mut repo = None;
    let mut o = Options {
        repo: PathBuf::new(),
        topo: false,
        limit: None,
        compress_min_bytes: 64,
        compress_level: 3,
        delta_max_depth: 8,
        plain: true,
        zstd: true,
        delta: true,
        restic: true,
        git: true,
        fs: false,
        csv: None,
    };
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match a.as_str() {
            "--topo" => o.topo = true,
            "--limit" => o.limit = Some(value("--limit")?.parse()?),
            "--compress-min-bytes" => {
                o.compress_min_bytes = value("--compress-min-bytes")?.parse()?;
                anyhow::ensure!(o.compress_min_bytes > 0, "--compress-min-bytes must be > 0");
            }
            "--compress-level" => o.compress_level = value("--compress-level")?.parse()?,
            "--delta-max-depth" => o.delta_max_depth = value("--delta-max-depth")?.parse()?,
            "--no-plain" => o.plain = false,
            "--no-zstd" => o.zstd = false,
            "--no-delta" => o.delta = false,
            "--no-restic" => o.restic = false,
            "--no-git" => o.git = false,
            "--fs" => o.fs = true,
            "--csv" => o.csv = Some(PathBuf::from(value("--csv")?)),
            "-h" | "--help" => return Err(usage()),
            s if s.starts_with('-') => bail!("unknown option {s}; {}", usage()),
            s if repo.is_none() => repo = Some(PathBuf::from(s)),
            s => bail!("unexpected argument {s}; {}", usage()),
        }
    }
    o.repo = repo.ok_or_else(usage)?;
    Ok(o)
}

// ---------------------------------------------------------------------------------------------
// Git

/// Runs git on `git_dir`; returns stdout, or fails with its stderr.
fn git(git_dir: &Path, args: &[&str]) -> anyhow::Result<Vec<u8>> {
    let out = Command::new("git")
        .arg("--git-dir")
        .arg(git_dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("cannot run git")?;
    if !out.status.success() {
        bail!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

fn git_text(git_dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    Ok(String::from_utf8(git(git_dir, args)?)?.trim().to_string())
}

/// Runs a command to completion; fails with its stderr.
fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.stdin(Stdio::null()).output()?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// One commit to replay: the regular files of its tree, as `git ls-tree` lists them.
#[derive(Debug, Clone)]
struct Commit {
    id: String,
    /// Sum of the sizes of the tree's regular files (what one full copy stores).
    bytes: u64,
    files: u64,
    /// Distinct blobs of regular files: object id → size.
    blobs: Vec<(String, u64)>,
    /// The paths of its regular files.
    paths: Vec<String>,
}

/// The regular files of `commit`'s tree; `None` when the repository lacks one of its objects.
fn tree_of(git_dir: &Path, commit: &str) -> anyhow::Result<Option<Commit>> {
    let out = Command::new("git")
        .arg("--git-dir")
        .arg(git_dir)
        .args(["ls-tree", "-r", "-l", "-z", commit])
        .stdin(Stdio::null())
        .output()?;
    if !out.status.success() {
        return Ok(None);
    }
    let mut c = Commit {
        id: commit.to_string(),
        bytes: 0,
        files: 0,
        blobs: Vec::new(),
        paths: Vec::new(),
    };
    for entry in out.stdout.split(|b| *b == 0).filter(|e| !e.is_empty()) {
        let entry = std::str::from_utf8(entry)?;
        let (meta, path) = entry.split_once('\t').context("ls-tree entry")?;
        let f: Vec<&str> = meta.split_whitespace().collect();
        // <mode> SP <type> SP <object> SP+ <size>
        if f.len() == 4 && f[1] == "blob" && (f[0] == "100644" || f[0] == "100755") {
            // `-` when the blob is missing (a partial clone): the commit cannot be replayed.
            let Ok(size) = f[3].parse::<u64>() else {
                return Ok(None);
            };
            c.bytes += size;
            c.files += 1;
            c.blobs.push((f[2].to_string(), size));
            c.paths.push(path.to_string());
        }
    }
    Ok(Some(c))
}

/// Reads of old files: this many, each a random file of a random version of the older half of
/// the history, through `GET …/versions/{vid}/files/{path}`, checked against git's bytes.
const OLD_READS: usize = 200;

/// `s` with every byte but the unreserved ones percent-encoded, for a URL path segment.
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn read_old_files(
    client: &HubClient,
    pid: &str,
    nid: &str,
    commits: &[Commit],
    versions: &[String],
) -> anyhow::Result<Vec<Duration>> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let half = commits.len().div_ceil(2);
    let mut took = Vec::with_capacity(OLD_READS);
    for _ in 0..OLD_READS {
        let i = rng.random_range(0..half);
        let c = &commits[i];
        if c.paths.is_empty() {
            continue;
        }
        let k = rng.random_range(0..c.paths.len());
        let path: Vec<String> = c.paths[k].split('/').map(percent_encode).collect();
        let url = format!(
            "/api/v1/projects/{pid}/notebooks/{nid}/versions/{}/files/{}",
            versions[i],
            path.join("/")
        );
        let t = Instant::now();
        let (status, bytes) = client.get_bytes(&url).await?;
        took.push(t.elapsed());
        anyhow::ensure!(status.is_success(), "{url}: {status}");
        anyhow::ensure!(
            bytes.len() as u64 == c.blobs[k].1,
            "{url}: {} bytes, git has {}",
            bytes.len(),
            c.blobs[k].1
        );
    }
    Ok(took)
}

/// The tar of `commit`'s tree, as `git archive` streams it.
fn archive(git_dir: &Path, commit: &str) -> anyhow::Result<Vec<u8>> {
    git(git_dir, &["archive", "--format=tar", commit])
}

/// Total size of the files below `dir`.
fn dir_bytes(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("{}", d.display()))? {
            let e = e?;
            let m = e.metadata()?;
            if m.is_dir() {
                stack.push(e.path());
            } else {
                total += m.len();
            }
        }
    }
    Ok(total)
}

/// Size of the packs of `git_dir` after `git gc --aggressive --prune=now`.
fn gc_and_measure(git_dir: &Path) -> anyhow::Result<u64> {
    run(Command::new("git").arg("--git-dir").arg(git_dir).args([
        "gc",
        "--aggressive",
        "--prune=now",
        "--quiet",
    ]))?;
    dir_bytes(&git_dir.join("objects/pack"))
}

/// The replayed snapshots as a linear history of their own (each original commit with its
/// parent rewritten to the previous replayed one), cloned into a fresh repository, gc'd.
fn git_linear(src: &Path, commits: &[Commit], work: &Path) -> anyhow::Result<u64> {
    let objects = PathBuf::from(git_text(
        src,
        &[
            "rev-parse",
            "--path-format=absolute",
            "--git-path",
            "objects",
        ],
    )?);
    let staging = work.join("linear-staging.git");
    run(Command::new("git")
        .args(["init", "--quiet", "--bare"])
        .arg(&staging))?;
    std::fs::write(
        staging.join("objects/info/alternates"),
        format!("{}\n", objects.display()),
    )?;
    let mut previous: Option<String> = None;
    for c in commits {
        let raw = git(src, &["cat-file", "commit", &c.id])?;
        let text = String::from_utf8_lossy(&raw);
        let (header, body) = text.split_once("\n\n").unwrap_or((&text, ""));
        let mut out = String::new();
        for line in header.lines() {
            if line.starts_with("parent ") {
                continue;
            }
            out.push_str(line);
            out.push('\n');
            if line.starts_with("tree ")
                && let Some(p) = &previous
            {
                out.push_str(&format!("parent {p}\n"));
            }
        }
        out.push('\n');
        out.push_str(body);
        let mut child = Command::new("git")
            .arg("--git-dir")
            .arg(&staging)
            .args([
                "hash-object",
                "-t",
                "commit",
                "-w",
                "--stdin",
                "--literally",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .context("stdin")?
            .write_all(out.as_bytes())?;
        let done = child.wait_with_output()?;
        anyhow::ensure!(
            done.status.success(),
            "git hash-object: {}",
            String::from_utf8_lossy(&done.stderr)
        );
        previous = Some(String::from_utf8(done.stdout)?.trim().to_string());
    }
    let head = previous.context("no commits")?;
    git(&staging, &["update-ref", "refs/heads/main", &head])?;
    git(&staging, &["symbolic-ref", "HEAD", "refs/heads/main"])?;
    let clone = work.join("linear.git");
    run(Command::new("git")
        .args([
            "clone",
            "--quiet",
            "--bare",
            "--no-local",
            "--single-branch",
        ])
        .arg(&staging)
        .arg(&clone))?;
    gc_and_measure(&clone)
}

/// A fresh clone of HEAD's branch (every commit reachable from HEAD), gc'd.
fn git_full(src: &Path, work: &Path) -> anyhow::Result<u64> {
    let clone = work.join("full.git");
    run(Command::new("git")
        .args([
            "clone",
            "--quiet",
            "--bare",
            "--no-local",
            "--single-branch",
        ])
        .arg(src)
        .arg(&clone))?;
    gc_and_measure(&clone)
}

// ---------------------------------------------------------------------------------------------
// restic

struct Restic {
    bytes: u64,
    backups: Vec<Duration>,
    version: String,
}

/// One `restic backup` of each commit's checked-out tree into a fresh repository (v2).
fn restic(git_dir: &Path, commits: &[Commit], work: &Path) -> anyhow::Result<Restic> {
    let version = Command::new("restic")
        .arg("version")
        .output()
        .context("restic is not installed (apt-get install -y restic)")?;
    let version = String::from_utf8_lossy(&version.stdout)
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    let repo = work.join("restic-repo");
    let tree = work.join("restic-tree");
    let cache = work.join("restic-cache");
    let restic = || {
        let mut c = Command::new("restic");
        c.env("RESTIC_PASSWORD", "hub-bench")
            .env("RESTIC_CACHE_DIR", &cache)
            .arg("--no-cache")
            .arg("--quiet")
            .arg("-r")
            .arg(&repo);
        c
    };
    run(restic().args(["init", "--repository-version", "2"]))?;
    let mut backups = Vec::with_capacity(commits.len());
    for c in commits {
        if tree.exists() {
            std::fs::remove_dir_all(&tree)?;
        }
        std::fs::create_dir_all(&tree)?;
        let tar = archive(git_dir, &c.id)?;
        let mut child = Command::new("tar")
            .arg("-xf")
            .arg("-")
            .arg("-C")
            .arg(&tree)
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        child.stdin.take().context("stdin")?.write_all(&tar)?;
        let done = child.wait_with_output()?;
        anyhow::ensure!(
            done.status.success(),
            "tar: {}",
            String::from_utf8_lossy(&done.stderr)
        );
        let t = Instant::now();
        run(restic().current_dir(&tree).args([
            "backup",
            "--host",
            "hub-bench",
            "--tag",
            &c.id,
            ".",
        ]))?;
        backups.push(t.elapsed());
    }
    Ok(Restic {
        bytes: dir_bytes(&repo)?,
        backups,
        version,
    })
}

// ---------------------------------------------------------------------------------------------
// The hub

/// One push and what it cost.
#[derive(Debug, Default, Clone)]
struct Push {
    received_bytes: u64,
    uploaded_bytes: u64,
    uploaded_nodes: u64,
    size_bytes: u64,
    file_count: u64,
    latency: Duration,
    /// Object-store requests by kind (measured, or derived on the filesystem store).
    store: BTreeMap<String, u64>,
    /// CAS API requests by "METHOD route".
    cas: BTreeMap<String, u64>,
}

struct Replay {
    label: String,
    /// Latencies of reading a random file of a random version of the older half.
    old_reads: Vec<Duration>,
    storage: Value,
    pushes: Vec<Push>,
    measured_store: bool,
}

/// `unicas_http_requests_total` of the CAS by "METHOD route", without `/metrics` itself.
async fn cas_requests(
    http: &reqwest::Client,
    cas_url: &str,
) -> anyhow::Result<BTreeMap<String, u64>> {
    let text = http
        .get(format!("{cas_url}/metrics"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    let label = |labels: &str, name: &str| -> Option<String> {
        let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
        let end = labels[start..].find('"')? + start;
        Some(labels[start..end].to_string())
    };
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("unicas_http_requests_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let (Some(method), Some(route)) = (label(labels, "method"), label(labels, "route")) else {
            continue;
        };
        if route == "/metrics" {
            continue;
        }
        let n = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        *out.entry(format!("{method} {route}")).or_default() += n;
    }
    Ok(out)
}

fn diff(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Object-store requests of one push on the filesystem store, derived from the CAS's API
/// requests as an S3 deployment would serve them: a node upload is inline below
/// `small_upload_bytes` (1 MiB; no object) and the lease that publishes it writes the
/// canonical object (1 PUT); a larger one is a presigned PUT, read back by the validating lease
/// (1 GET) before that PUT. Every node read (`GET .../nodes/{hash}`) is one GET. Leases of
/// ready nodes, root-ref updates and usage touch only the database.
fn derived_store_requests(cas: &BTreeMap<String, u64>, push: &Push) -> BTreeMap<String, u64> {
    let uploads: u64 = cas
        .iter()
        .filter(|(k, _)| k.starts_with("PUT ") && k.contains("upload"))
        .map(|(_, v)| v)
        .sum();
    let reads: u64 = cas
        .iter()
        .filter(|(k, _)| k.starts_with("GET ") && k.contains("nodes") && !k.contains("meta"))
        .map(|(_, v)| v)
        .sum();
    let mut out = BTreeMap::new();
    out.insert("PUT".to_string(), uploads.max(push.uploaded_nodes));
    if reads > 0 {
        out.insert("GET".to_string(), reads);
    }
    out
}

async fn replay(
    o: &Options,
    commits: &[Commit],
    label: &str,
    layout: Layout,
) -> anyhow::Result<Replay> {
    let s3 = !o.fs
        && std::env::var("UNICAS_S3_ENDPOINT").is_ok()
        && std::env::var("UNICAS_TEST_BUCKET").is_ok();
    let backend = if s3 {
        Backend::SQLITE_S3
    } else {
        Backend::SQLITE_FS
    };
    let mut env = HubEnv::new(backend).await?;
    env.set("UNICAS_RATE_LIMIT_PER_IP", 0)
        .set("UNICAS_RATE_LIMIT_PER_APP", 0)
        .set("UNICAS_HUB_SYNC_MAX_BYTES", 4u64 << 30);
    env.set("UNICAS_COMPRESS_MIN_BYTES", layout.compress_min_bytes)
        .set("UNICAS_COMPRESS_LEVEL", layout.compress_level)
        .set("UNICAS_DELTA_MAX_DEPTH", layout.delta_max_depth);
    let proxy = if backend.blobs == Blobs::S3 {
        let upstream = std::env::var("UNICAS_S3_ENDPOINT")?;
        let proxy = FaultProxy::start(&upstream).await?;
        env.set("UNICAS_S3_ENDPOINT", &proxy.url);
        Some(proxy)
    } else {
        None
    };
    let server = env.start()?;
    let cas_url = server
        .cas_url
        .clone()
        .context("the hub did not embed a CAS")?;
    let admin = server
        .admin_token()
        .context("the hub printed no admin token")?;
    let client = server.client(Some(&admin));
    let pid = client.project("hub-bench").await?;
    let (status, created) = client
        .post(
            &format!("/api/v1/projects/{pid}/notebooks"),
            &json!({"title": "history", "source": {"type": "git", "sync_mode": "push"}}),
        )
        .await?;
    anyhow::ensure!(
        status.is_success(),
        "creating the notebook: {status} {created}"
    );
    let nid = created["data"]["notebook"]["id"]
        .as_str()
        .context("no notebook id")?
        .to_string();
    let sync_token = created["data"]["sync_token"]
        .as_str()
        .context("no sync token")?
        .to_string();
    let sync = HubClient::new(&server.url, Some(&sync_token));
    let http = reqwest::Client::new();

    let mut pushes = Vec::with_capacity(commits.len());
    let mut versions = Vec::with_capacity(commits.len());
    let started = Instant::now();
    for (i, c) in commits.iter().enumerate() {
        let tar = archive(&o.repo, &c.id)?;
        let cas_before = cas_requests(&http, &cas_url).await?;
        let store_before = proxy.as_ref().map(|p| p.counts().kinds());
        let t = Instant::now();
        let (status, answer) = sync
            .post_bytes(
                "/api/sync/git/v1",
                "application/x-tar",
                tar,
                &[("x-sync-commit", c.id.as_str())],
            )
            .await?;
        let latency = t.elapsed();
        if !status.is_success() {
            bail!(
                "push {} of {} ({}) failed: {status} {answer}\n{}",
                i + 1,
                commits.len(),
                c.id,
                server.log()
            );
        }
        let cas_after = cas_requests(&http, &cas_url).await?;
        let d = &answer["data"];
        versions.push(d["version_id"].as_str().unwrap_or_default().to_string());
        let n = |k: &str| d[k].as_u64().unwrap_or(0);
        let mut p = Push {
            received_bytes: n("received_bytes"),
            uploaded_bytes: n("uploaded_bytes"),
            uploaded_nodes: n("uploaded_nodes"),
            size_bytes: n("size_bytes"),
            file_count: n("file_count"),
            latency,
            store: BTreeMap::new(),
            cas: diff(&cas_after, &cas_before),
        };
        p.store = match (&proxy, store_before) {
            (Some(proxy), Some(before)) => diff(&proxy.counts().kinds(), &before),
            _ => derived_store_requests(&p.cas, &p),
        };
        pushes.push(p);
        if (i + 1).is_multiple_of(25) {
            eprintln!(
                "  {label}: {} of {} pushes, {:.0} s",
                i + 1,
                commits.len(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    let (status, storage) = client
        .get(&format!("/api/v1/projects/{pid}/storage"))
        .await?;
    anyhow::ensure!(status.is_success(), "storage: {status} {storage}");
    let old_reads = read_old_files(&client, &pid, &nid, commits, &versions).await?;
    drop(server);
    Ok(Replay {
        label: label.to_string(),
        old_reads,
        storage: storage["data"].clone(),
        pushes,
        measured_store: proxy.is_some(),
    })
}

// ---------------------------------------------------------------------------------------------
// Figures

/// Nearest-rank percentile of `v` (sorted here).
fn pct<T: Copy + Ord>(v: &[T], p: f64) -> Option<T> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort();
    let rank = ((p * s.len() as f64).ceil() as usize).clamp(1, s.len());
    Some(s[rank - 1])
}

fn mean(v: &[u64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<u64>() as f64 / v.len() as f64
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `1234567` → `1,234,567`.
fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn mb(n: u64) -> String {
    format!("{:.3} MB", n as f64 / 1e6)
}

const LABEL: usize = 58;
const COL: usize = 26;

fn row(label: &str, cols: &[String]) {
    let mut line = format!("  {label:<LABEL$}");
    for c in cols {
        line.push_str(&format!("{c:>COL$}"));
    }
    println!("{}", line.trim_end());
}

/// A figure that could not be measured, and why (the last line of the error).
fn na(label: &str, e: &anyhow::Error) {
    let e = format!("{e:#}");
    let why = e.strip_prefix("n/a: ").unwrap_or(&e);
    println!(
        "  {label:<LABEL$}  n/a: {}",
        why.lines().last().unwrap_or_default().trim()
    );
}

fn stats_u64(v: &[u64]) -> String {
    format!(
        "{:.0} / {} / {}",
        mean(v),
        pct(v, 0.5).unwrap_or(0),
        pct(v, 0.99).unwrap_or(0)
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut o = parse_options()?;
    let t0 = Instant::now();
    // A Git directory or a work tree.
    let git_dir = Command::new("git")
        .arg("-C")
        .arg(&o.repo)
        .args(["rev-parse", "--path-format=absolute", "--git-dir"])
        .output()?;
    anyhow::ensure!(
        git_dir.status.success(),
        "{} is not a Git repository: {}",
        o.repo.display(),
        String::from_utf8_lossy(&git_dir.stderr).trim()
    );
    o.repo = PathBuf::from(String::from_utf8(git_dir.stdout)?.trim());
    let head = git_text(&o.repo, &["rev-parse", "HEAD"])?;
    let shallow = git_text(&o.repo, &["rev-parse", "--is-shallow-repository"])? == "true";
    let reachable = git_text(&o.repo, &["rev-list", "--count", "HEAD"])?;
    let order = if o.topo {
        vec!["rev-list", "--reverse", "--topo-order", "HEAD"]
    } else {
        vec!["rev-list", "--reverse", "--first-parent", "HEAD"]
    };
    let mut ids: Vec<String> = git_text(&o.repo, &order)?
        .lines()
        .map(str::to_string)
        .collect();
    if let Some(n) = o.limit {
        ids.truncate(n);
    }
    let mut commits = Vec::with_capacity(ids.len());
    let mut incomplete = Vec::new();
    for id in &ids {
        match tree_of(&o.repo, id)? {
            Some(c) => commits.push(c),
            None => incomplete.push(id.clone()),
        }
    }
    anyhow::ensure!(!commits.is_empty(), "no commit to replay");
    let full_copies: u64 = commits.iter().map(|c| c.bytes).sum();
    let distinct: BTreeMap<&str, u64> = commits
        .iter()
        .flat_map(|c| c.blobs.iter().map(|(h, s)| (h.as_str(), *s)))
        .collect();
    let distinct_bytes: u64 = distinct.values().sum();
    let mean_files = commits.iter().map(|c| c.files).sum::<u64>() as f64 / commits.len() as f64;

    println!(
        "hub storage benchmark: {} at {} (HEAD)",
        o.repo.display(),
        &head[..12.min(head.len())]
    );
    println!(
        "history: {} commits, {} ({} reachable from HEAD{}), replayed oldest first, one push each",
        commits.len(),
        if o.topo {
            "every commit in topological order"
        } else {
            "first-parent chain of HEAD"
        },
        reachable,
        if shallow { "; SHALLOW clone" } else { "" }
    );
    if !incomplete.is_empty() {
        println!(
            "  skipped {} commits whose trees reference objects missing from the repository \
             (partial clone): {}",
            incomplete.len(),
            incomplete
                .iter()
                .map(|c| &c[..10])
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let last = commits.last().map_or(0, |c| c.bytes);
    println!(
        "trees: {:.0} files on average; last tree {} in {} files; {} distinct file versions",
        mean_files,
        mb(last),
        commits.last().map_or(0, |c| c.files),
        thousands(distinct.len() as u64)
    );

    let work = tempfile::Builder::new().prefix("hub-bench-").tempdir()?;

    // The hub, with the layout before compression and deltas, with compression alone, and
    // with the defaults (compression and deltas).
    let mut replays = Vec::new();
    let zstd = |delta_max_depth| Layout {
        compress_min_bytes: o.compress_min_bytes,
        compress_level: o.compress_level,
        delta_max_depth,
    };
    let mut variants: Vec<(String, Layout)> = Vec::new();
    if o.plain {
        let off = Layout {
            compress_min_bytes: 0,
            compress_level: o.compress_level,
            delta_max_depth: 0,
        };
        variants.push(("compression off".to_string(), off));
    }
    if o.zstd {
        let label = format!(
            "zstd >= {} B, level {}",
            o.compress_min_bytes, o.compress_level
        );
        variants.push((label, zstd(0)));
    }
    if o.delta {
        let label = if o.delta_max_depth == 8 && o.compress_level == 3 && o.compress_min_bytes == 64
        {
            "zstd + deltas (defaults)".to_string()
        } else {
            format!("zstd + deltas, depth {}", o.delta_max_depth)
        };
        variants.push((label, zstd(o.delta_max_depth)));
    }
    for (label, layout) in &variants {
        let t = Instant::now();
        eprintln!(
            "replaying {} commits through the hub ({label})",
            commits.len()
        );
        let r = replay(&o, &commits, label, *layout)
            .await
            .with_context(|| format!("replay ({label})"))?;
        eprintln!("  done in {:.0} s", t.elapsed().as_secs_f64());
        replays.push(r);
    }

    // git and restic of the same snapshots.
    let (git_linear_bytes, git_full_bytes) = if o.git {
        eprintln!("git gc --aggressive of the same snapshots");
        let linear = git_linear(&o.repo, &commits, work.path());
        let missing = git(
            &o.repo,
            &["rev-list", "--objects", "--missing=print", "HEAD"],
        )?
        .split(|b| *b == b'\n')
        .filter(|l| l.first() == Some(&b'?'))
        .count();
        let full = if missing > 0 {
            Err(anyhow::anyhow!(
                "n/a: {missing} objects reachable from HEAD are missing (partial clone)"
            ))
        } else {
            eprintln!("git gc --aggressive of a clone of HEAD");
            git_full(&o.repo, work.path())
        };
        (Some(linear), Some(full))
    } else {
        (None, None)
    };
    let restic_result = if o.restic {
        eprintln!("restic backup of each of the {} trees", commits.len());
        Some(restic(&o.repo, &commits, work.path()))
    } else {
        None
    };

    if let Some(path) = &o.csv {
        let mut out = String::from(
            "variant,push,commit,files,file_bytes,received_bytes,uploaded_bytes,uploaded_nodes,\
             latency_ms,store_requests,cas_requests\n",
        );
        for r in &replays {
            for (i, (p, c)) in r.pushes.iter().zip(&commits).enumerate() {
                out.push_str(&format!(
                    "{},{},{},{},{},{},{},{},{:.1},{},{}\n",
                    r.label,
                    i + 1,
                    c.id,
                    p.file_count,
                    p.size_bytes,
                    p.received_bytes,
                    p.uploaded_bytes,
                    p.uploaded_nodes,
                    ms(p.latency),
                    p.store.values().sum::<u64>(),
                    p.cas.values().sum::<u64>()
                ));
            }
        }
        std::fs::write(path, out).with_context(|| format!("{}", path.display()))?;
    }

    // ---- storage
    let git_base = git_linear_bytes
        .as_ref()
        .and_then(|r| r.as_ref().ok())
        .copied();
    let vs = |bytes: u64| -> Vec<String> {
        vec![
            thousands(bytes),
            mb(bytes),
            format!("{:.4}", bytes as f64 / full_copies as f64),
            git_base.map_or("-".into(), |g| format!("{:.2}", bytes as f64 / g as f64)),
        ]
    };
    println!();
    let short = |s: &str| -> String { s.chars().take(COL - 2).collect() };
    println!(
        "  {:<LABEL$}{:>COL$}{:>14}{:>14}{:>14}",
        "storage of the whole history", "bytes", "", "/ full copies", "/ git packed"
    );
    let srow = |label: &str, bytes: u64| {
        let v = vs(bytes);
        println!(
            "  {label:<LABEL$}{:>COL$}{:>14}{:>14}{:>14}",
            v[0], v[1], v[2], v[3]
        );
    };
    let note = |label: &str, text: &str| println!("  {label:<LABEL$}{text:>COL$}");
    srow(
        "baseline: seed-000 layout, every version a full copy",
        full_copies,
    );
    for r in &replays {
        let logical = r.storage["logicalBytes"].as_u64().unwrap_or(0);
        note(
            &format!("  hub logicalBytes ({})", r.label),
            &format!(
                "{} {}",
                thousands(logical),
                if logical == full_copies {
                    "= git trees"
                } else {
                    "DIFFERS from git trees"
                }
            ),
        );
    }
    match &git_linear_bytes {
        Some(Ok(b)) => srow(
            &format!("baseline: git packed, the same {} snapshots", commits.len()),
            *b,
        ),
        Some(Err(e)) => na("baseline: git packed, the same snapshots", e),
        None => {}
    }
    match &git_full_bytes {
        Some(Ok(b)) => srow(
            &format!("git packed, clone of HEAD ({reachable} commits)"),
            *b,
        ),
        Some(Err(e)) => na(
            &format!("git packed, clone of HEAD ({reachable} commits)"),
            e,
        ),
        None => {}
    }
    match &restic_result {
        Some(Ok(r)) => srow(
            &format!(
                "restic repo v2, compression auto ({}), {} snapshots",
                r.version.trim_start_matches("restic "),
                commits.len()
            ),
            r.bytes,
        ),
        Some(Err(e)) => na("restic repo v2", e),
        None => {}
    }
    srow(
        "distinct file versions, uncompressed (whole-file dedup)",
        distinct_bytes,
    );
    for r in &replays {
        let s = &r.storage;
        let stored = s["readyStoredBytes"].as_u64().unwrap_or(0);
        srow(&format!("CAS readyStoredBytes, {}", r.label), stored);
        note(
            "  readyContentBytes",
            &thousands(s["readyContentBytes"].as_u64().unwrap_or(0)),
        );
        note(
            "  nodeCount / keptVersions",
            &format!(
                "{} / {}",
                thousands(s["nodeCount"].as_u64().unwrap_or(0)),
                s["keptVersions"].as_u64().unwrap_or(0)
            ),
        );
    }

    // ---- per push
    if !replays.is_empty() {
        println!();
        let mut header = format!(
            "  {:<LABEL$}",
            format!("per push ({} pushes)", commits.len())
        );
        for r in &replays {
            header.push_str(&format!("{:>COL$}", short(&r.label)));
        }
        println!("{header}");
        let col =
            |f: &dyn Fn(&Replay) -> String| -> Vec<String> { replays.iter().map(f).collect() };
        let rest = |r: &Replay| -> Vec<Push> { r.pushes.iter().skip(1).cloned().collect() };
        // One row per key of a per-push count: its mean over the pushes, and the first push's.
        let by_key = |pick: &dyn Fn(&Push) -> &BTreeMap<String, u64>| {
            let keys: BTreeSet<&String> = replays
                .iter()
                .flat_map(|r| r.pushes.iter().flat_map(|p| pick(p).keys()))
                .collect();
            for k in keys {
                row(
                    &format!("  {k}, mean (first push)"),
                    &col(&|r| {
                        let v: Vec<u64> = r
                            .pushes
                            .iter()
                            .map(|p| pick(p).get(k).copied().unwrap_or(0))
                            .collect();
                        format!("{:.2} ({})", mean(&v), v[0])
                    }),
                );
            }
        };
        row(
            "uploaded bytes, first push",
            &col(&|r| thousands(r.pushes[0].uploaded_bytes)),
        );
        row(
            "  baseline: its tar body",
            &col(&|r| thousands(r.pushes[0].received_bytes)),
        );
        row(
            "uploaded bytes, pushes 2.., total",
            &col(&|r| thousands(rest(r).iter().map(|p| p.uploaded_bytes).sum())),
        );
        row(
            "  mean / p50 / p99",
            &col(&|r| stats_u64(&rest(r).iter().map(|p| p.uploaded_bytes).collect::<Vec<_>>())),
        );
        row(
            "  baseline: tar bodies, mean / p50 / p99",
            &col(&|r| stats_u64(&rest(r).iter().map(|p| p.received_bytes).collect::<Vec<_>>())),
        );
        row(
            "  uploaded / tar body, pushes 2..",
            &col(&|r| {
                let up: u64 = rest(r).iter().map(|p| p.uploaded_bytes).sum();
                let body: u64 = rest(r).iter().map(|p| p.received_bytes).sum();
                format!("{:.4}", up as f64 / body.max(1) as f64)
            }),
        );
        row(
            "uploaded bytes, all pushes (total)",
            &col(&|r| thousands(r.pushes.iter().map(|p| p.uploaded_bytes).sum())),
        );
        row(
            "uploaded nodes per push, mean / p50 / p99",
            &col(&|r| {
                stats_u64(
                    &r.pushes
                        .iter()
                        .map(|p| p.uploaded_nodes)
                        .collect::<Vec<_>>(),
                )
            }),
        );
        let lat = |r: &Replay| -> Vec<Duration> { r.pushes.iter().map(|p| p.latency).collect() };
        row(
            "save latency, ms: p50 / p99 / mean",
            &col(&|r| {
                let l = lat(r);
                format!(
                    "{:.0} / {:.0} / {:.0}",
                    ms(pct(&l, 0.5).unwrap_or_default()),
                    ms(pct(&l, 0.99).unwrap_or_default()),
                    l.iter().map(|d| ms(*d)).sum::<f64>() / l.len() as f64
                )
            }),
        );
        row(
            "  first push, ms",
            &col(&|r| format!("{:.0}", ms(r.pushes[0].latency))),
        );
        row(
            &format!("read a file of an old version ({OLD_READS}), ms: p50 / p99 / mean"),
            &col(&|r| {
                let l = &r.old_reads;
                format!(
                    "{:.1} / {:.1} / {:.1}",
                    ms(pct(l, 0.5).unwrap_or_default()),
                    ms(pct(l, 0.99).unwrap_or_default()),
                    l.iter().map(|d| ms(*d)).sum::<f64>() / l.len().max(1) as f64
                )
            }),
        );
        if let Some(Ok(rs)) = &restic_result {
            let l = &rs.backups;
            let base = format!(
                "{:.0} / {:.0} / {:.0}",
                ms(pct(l, 0.5).unwrap_or_default()),
                ms(pct(l, 0.99).unwrap_or_default()),
                l.iter().map(|d| ms(*d)).sum::<f64>() / l.len() as f64
            );
            row(
                "  baseline: restic backup of the tree, ms",
                &col(&|_| base.clone()),
            );
            row(
                "  hub p50 / restic p50",
                &col(&|r| {
                    format!(
                        "{:.3}",
                        ms(pct(&lat(r), 0.5).unwrap_or_default())
                            / ms(pct(l, 0.5).unwrap_or_default()).max(1e-9)
                    )
                }),
            );
        }
        let totals = |r: &Replay| -> Vec<u64> {
            r.pushes
                .iter()
                .map(|p| p.store.values().sum::<u64>())
                .collect()
        };
        let measured = replays.iter().all(|r| r.measured_store);
        row(
            if measured {
                "object-store requests (S3, counted at a proxy), mean / p50 / p99"
            } else {
                "object-store requests (DERIVED, filesystem store), mean / p50 / p99"
            },
            &col(&|r| stats_u64(&totals(r))),
        );
        row("  first push", &col(&|r| thousands(totals(r)[0])));
        row(
            "  max",
            &col(&|r| thousands(totals(r).iter().copied().max().unwrap_or(0))),
        );
        by_key(&|p| &p.store);
        row(
            "  baseline: files per commit (a full copy writes each)",
            &col(&|_| format!("{mean_files:.1}")),
        );
        row(
            "  requests / files per commit",
            &col(&|r| format!("{:.4}", mean(&totals(r)) / mean_files)),
        );
        row(
            "CAS API requests per push (/metrics), mean / p50 / p99",
            &col(&|r| {
                stats_u64(
                    &r.pushes
                        .iter()
                        .map(|p| p.cas.values().sum::<u64>())
                        .collect::<Vec<_>>(),
                )
            }),
        );
        by_key(&|p| &p.cas);
        // Per-push cross-check of what the hub counted against the git trees.
        row(
            "pushes whose size_bytes/file_count differ from git",
            &col(&|r| {
                thousands(
                    r.pushes
                        .iter()
                        .zip(&commits)
                        .filter(|(p, c)| p.size_bytes != c.bytes || p.file_count != c.files)
                        .count() as u64,
                )
            }),
        );
    }

    // ---- verdict
    println!();
    println!("verdict");
    for r in &replays {
        let stored = r.storage["readyStoredBytes"].as_u64().unwrap_or(0);
        let ratio = stored as f64 / full_copies as f64;
        println!(
            "  CAS stored / full copies ({}): {:.4}  (requirement <= 0.1: {})",
            r.label,
            ratio,
            if ratio <= 0.1 { "met" } else { "NOT met" }
        );
        if let Some(g) = git_base {
            let q = stored as f64 / g as f64;
            println!(
                "  CAS stored / git packed ({}): {:.2}  (goal <= 1: {}{})",
                r.label,
                q,
                if q <= 1.0 { "met" } else { "not met" },
                if q > 1.0 {
                    format!(", {} over git", mb(stored - g))
                } else {
                    String::new()
                }
            );
        }
    }
    if let Some(g) = git_base {
        println!(
            "  note: the CAS cuts notebooks at their cells and other text into chunks of a few \
             KiB, stores each distinct chunk once (the distinct file versions hold {} here), \
             plus one tree node per changed directory and one version node per push; with the \
             defaults each object is zstd-compressed and a changed chunk, file or directory is \
             kept as a delta against the one it replaces. git also compresses many objects \
             together in a pack ({} here): chunks compressed one by one lose that context, which \
             is what packs of small nodes would recover.",
            mb(distinct_bytes),
            mb(g)
        );
    }
    println!("\n(total run time {:.0} s)", t0.elapsed().as_secs_f64());
    Ok(())
}
