//! The baselines of the hub benchmark: git (loose history replayed into a bare repository and
//! `git gc --aggressive`, a clone of HEAD) and restic, over the same snapshots.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Runs git on `git_dir`; returns stdout, or fails with its stderr.
pub(crate) fn git(git_dir: &Path, args: &[&str]) -> anyhow::Result<Vec<u8>> {
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

pub(crate) fn git_text(git_dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    Ok(String::from_utf8(git(git_dir, args)?)?.trim().to_string())
}

/// Runs a command to completion; fails with its stderr.
pub(crate) fn run(cmd: &mut Command) -> anyhow::Result<()> {
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
pub(crate) struct Commit {
    pub(crate) id: String,
    /// Sum of the sizes of the tree's regular files (what one full copy stores).
    pub(crate) bytes: u64,
    pub(crate) files: u64,
    /// Distinct blobs of regular files: object id → size.
    pub(crate) blobs: Vec<(String, u64)>,
    /// The paths of its regular files.
    pub(crate) paths: Vec<String>,
}

/// The regular files of `commit`'s tree; `None` when the repository lacks one of its objects.
pub(crate) fn tree_of(git_dir: &Path, commit: &str) -> anyhow::Result<Option<Commit>> {
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

/// The tar of `commit`'s tree, as `git archive` streams it.
pub(crate) fn archive(git_dir: &Path, commit: &str) -> anyhow::Result<Vec<u8>> {
    git(git_dir, &["archive", "--format=tar", commit])
}

/// Total size of the files below `dir`.
pub(crate) fn dir_bytes(dir: &Path) -> anyhow::Result<u64> {
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
pub(crate) fn gc_and_measure(git_dir: &Path) -> anyhow::Result<u64> {
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
pub(crate) fn git_linear(src: &Path, commits: &[Commit], work: &Path) -> anyhow::Result<u64> {
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
    bare_clone_measured(&staging, &work.join("linear.git"))
}

/// A fresh clone of HEAD's branch (every commit reachable from HEAD), gc'd.
pub(crate) fn git_full(src: &Path, work: &Path) -> anyhow::Result<u64> {
    bare_clone_measured(src, &work.join("full.git"))
}

/// A bare single-branch clone of `src` at `clone`, gc'd and measured.
fn bare_clone_measured(src: &Path, clone: &Path) -> anyhow::Result<u64> {
    run(Command::new("git")
        .args([
            "clone",
            "--quiet",
            "--bare",
            "--no-local",
            "--single-branch",
        ])
        .arg(src)
        .arg(clone))?;
    gc_and_measure(clone)
}

pub(crate) struct Restic {
    pub(crate) bytes: u64,
    pub(crate) backups: Vec<Duration>,
    pub(crate) version: String,
}

/// One `restic backup` of each commit's checked-out tree into a fresh repository (v2).
pub(crate) fn restic(git_dir: &Path, commits: &[Commit], work: &Path) -> anyhow::Result<Restic> {
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
