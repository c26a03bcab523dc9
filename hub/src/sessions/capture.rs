//! Reading back what a session changed: its workspace directory against the tree it was
//! last saved as. The directory is written by notebook code, so it is read as hostile input:
//! every directory and file is opened relative to its parent's handle with `O_NOFOLLOW`, a
//! symlink becomes a link entry whose target is text, anything else that is not a file is left
//! out, and the walk is bounded in depth, files and bytes. A file is copied to an unnamed spool
//! file and planned from there, so what is stored is what was read, even if marimo writes to
//! it meanwhile. Files whose size and modification time are those of the last save are not
//! read again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cas_client::files::plan_spooled;
use cas_client::tree::{MAX_PATH_DEPTH, valid_name};
use cas_client::{Change, Entry, Plan, TreeLimits};
use cas_format::{Hash, SpaceId};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::error::{HubError, HubResult};

/// Names never saved from a session's directory, at any depth: marimo's own state and caches
/// that are made again.
const IGNORED: &[&str] = &[
    "__marimo__",
    "__pycache__",
    ".venv",
    ".ipynb_checkpoints",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    "node_modules",
    ".DS_Store",
];

fn ignored(parts: &[&str]) -> bool {
    parts.iter().any(|p| IGNORED.contains(p)) || parts.windows(2).any(|w| w == [".git", "hooks"])
}

/// What a capture may read.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_bytes: u64,
    pub max_files: u64,
}

/// A file as it was when last saved or written out: read again only if this changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub size: u64,
    pub mtime_ns: i128,
}

/// What the hub knows of each file of the directory (path → stamp and entry).
pub type Known = HashMap<String, (Stamp, Entry)>;

/// One entry of the directory as read.
#[derive(Debug)]
struct Seen {
    entry: Entry,
    stamp: Option<Stamp>,
    /// Nodes to store if this is a change.
    plan: Option<Plan>,
}

/// The outcome of reading a directory.
#[derive(Debug, Default)]
struct Walked {
    entries: BTreeMap<String, Seen>,
    dirs: BTreeSet<String>,
    /// Paths left out (over a limit, unreadable or changing while read): never taken as
    /// deleted.
    skipped: BTreeSet<String>,
    read_bytes: u64,
    files: u64,
}

/// What changed, ready for a save.
#[derive(Debug, Default)]
pub struct Captured {
    pub changes: Vec<(Vec<String>, Change)>,
    pub plan: Plan,
    /// The stamps of every file as read, to become [`Known`] once the save is committed.
    pub known: Known,
    pub skipped: Vec<String>,
}

fn stamp(st: &rustix::fs::Stat) -> Stamp {
    Stamp {
        size: st.st_size as u64,
        mtime_ns: i128::from(st.st_mtime) * 1_000_000_000 + i128::from(st.st_mtime_nsec),
    }
}

struct Walker<'a> {
    known: &'a Known,
    limits: Limits,
    spool_dir: &'a Path,
    out: Walked,
}

impl Walker<'_> {
    fn walk(&mut self, dir: &OwnedFd, prefix: &str, depth: usize) -> std::io::Result<()> {
        let mut names = Vec::new();
        for e in rustix::fs::Dir::read_from(dir)? {
            let e = e?;
            let Ok(name) = e.file_name().to_str() else {
                tracing::warn!(
                    under = prefix,
                    "a session file with a name that is not UTF-8 is not saved"
                );
                continue;
            };
            if name != "." && name != ".." {
                names.push(name.to_string());
            }
        }
        names.sort();
        for name in names {
            let path = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let parts: Vec<&str> = path.split('/').collect();
            if ignored(&parts) {
                continue;
            }
            if !valid_name(&name) || path.len() > cas_client::tree::MAX_PATH_BYTES {
                tracing::warn!(path, "a session file with an invalid name is not saved");
                continue;
            }
            let st = match rustix::fs::statat(dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                // Gone since it was listed: as if it had not been there.
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(at(&path, e.into())),
            };
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory if depth < MAX_PATH_DEPTH => {
                    let sub = rustix::fs::openat(
                        dir,
                        name.as_str(),
                        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                    )
                    .map_err(|e| at(&path, e.into()))?;
                    self.out.dirs.insert(path.clone());
                    self.walk(&sub, &path, depth + 1)?;
                }
                FileType::Directory => {
                    self.out.skipped.insert(path);
                }
                FileType::Symlink => {
                    let target = rustix::fs::readlinkat(dir, name.as_str(), Vec::new())?;
                    match target.into_string() {
                        Ok(target) if !target.is_empty() && target.len() <= 4096 => {
                            self.out.entries.insert(
                                path,
                                Seen {
                                    entry: Entry::Symlink { target },
                                    stamp: None,
                                    plan: None,
                                },
                            );
                        }
                        _ => {
                            self.out.skipped.insert(path);
                        }
                    }
                }
                FileType::RegularFile => {
                    let shown = path.clone();
                    self.file(dir, &name, path, &st)
                        .map_err(|e| at(&shown, e))?
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn file(
        &mut self,
        dir: &OwnedFd,
        name: &str,
        path: String,
        st: &rustix::fs::Stat,
    ) -> std::io::Result<()> {
        let executable = st.st_mode & 0o111 != 0;
        let now = stamp(st);
        self.out.files += 1;
        if self.out.files > self.limits.max_files {
            tracing::warn!(
                path,
                limit = self.limits.max_files,
                "a session file beyond the file limit is not saved"
            );
            self.out.skipped.insert(path);
            return Ok(());
        }
        if let Some((was, entry)) = self.known.get(&path)
            && *was == now
            && matches!(entry, Entry::File { executable: e, .. } if *e == executable)
        {
            self.out.entries.insert(
                path,
                Seen {
                    entry: entry.clone(),
                    stamp: Some(now),
                    plan: None,
                },
            );
            return Ok(());
        }
        if self.out.read_bytes.saturating_add(now.size) > self.limits.max_bytes {
            tracing::warn!(
                path,
                size = now.size,
                limit = self.limits.max_bytes,
                "a session file beyond the byte limit is not saved"
            );
            self.out.skipped.insert(path);
            return Ok(());
        }
        let fd = rustix::fs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut src = File::from(fd);
        let mut copy = tempfile::tempfile_in(self.spool_dir)
            .map_err(|e| at(&self.spool_dir.display().to_string(), e))?;
        let copied = std::io::copy(&mut std::io::Read::take(&mut src, now.size + 1), &mut copy)?;
        let after = stamp(&rustix::fs::fstat(&src)?);
        if copied != now.size || after != now {
            // Being written right now: the next save takes it.
            self.out.skipped.insert(path);
            return Ok(());
        }
        self.out.read_bytes += copied;
        let mut plan = Plan::default();
        let file = plan_spooled(&mut plan, &Arc::new(copy), 0, copied)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        self.out.entries.insert(
            path,
            Seen {
                entry: Entry::File { file, executable },
                stamp: Some(now),
                plan: Some(plan),
            },
        );
        Ok(())
    }
}

/// Opens the file `parts` below `root` for reading, never through a link. Blocking.
pub fn open_below(root: &Path, parts: &[&str]) -> std::io::Result<File> {
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut dir = rustix::fs::open(root, dir_flags, Mode::empty())?;
    let Some((last, dirs)) = parts.split_last() else {
        return Err(std::io::ErrorKind::InvalidInput.into());
    };
    for d in dirs {
        dir = rustix::fs::openat(&dir, *d, dir_flags, Mode::empty())?;
    }
    let f = rustix::fs::openat(
        &dir,
        *last,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let file = File::from(f);
    if !file.metadata()?.is_file() {
        return Err(std::io::ErrorKind::InvalidInput.into());
    }
    Ok(file)
}

/// `e`, saying which path it is about.
fn at(path: &str, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{path}: {e}"))
}

/// Reads `root` (blocking: run it on a blocking thread).
fn walk_dir(
    root: &Path,
    known: &Known,
    limits: Limits,
    spool_dir: &Path,
) -> std::io::Result<Walked> {
    let top = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| at(&root.display().to_string(), e.into()))?;
    let mut w = Walker {
        known,
        limits,
        spool_dir,
        out: Walked::default(),
    };
    w.walk(&top, "", 1)?;
    Ok(w.out)
}

/// Whether `path` lies strictly below one of `dirs`.
fn below_any(path: &str, dirs: &BTreeSet<String>) -> bool {
    dirs.iter().any(|d| {
        path.len() > d.len() && path.starts_with(d.as_str()) && path.as_bytes()[d.len()] == b'/'
    })
}

/// What changed in `root` since the tree `base` (`None`: an empty workspace).
pub async fn capture(
    cas: &cas_client::AppCasClient,
    space: &SpaceId,
    base: Option<Hash>,
    root: PathBuf,
    known: Known,
    limits: Limits,
    spool_dir: PathBuf,
) -> HubResult<Captured> {
    let mut before: BTreeMap<String, Entry> = BTreeMap::new();
    if let Some(base) = base {
        let tree_limits = TreeLimits {
            max_entries: limits.max_files.saturating_mul(4).max(1024),
            ..TreeLimits::default()
        };
        let mut walk = cas.walk(space, &base, tree_limits).await?;
        while let Some(w) = walk.next().await? {
            before.insert(w.path, w.entry);
        }
    }
    let walked = tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&spool_dir)?;
        walk_dir(&root, &known, limits, &spool_dir)
    })
    .await
    .map_err(|e| HubError::internal("reading a session's files", e))?
    .map_err(|e| HubError::internal("reading a session's files", e))?;
    let mut out = Captured {
        skipped: walked.skipped.iter().cloned().collect(),
        ..Captured::default()
    };
    let seen: BTreeSet<String> = walked.entries.keys().cloned().collect();
    let mut put: BTreeSet<String> = BTreeSet::new();
    for (path, s) in walked.entries {
        if let Some(stamp) = s.stamp {
            out.known.insert(path.clone(), (stamp, s.entry.clone()));
        }
        let same = match (before.get(&path), &s.entry) {
            (
                Some(Entry::File {
                    file: a,
                    executable: x,
                }),
                Entry::File {
                    file: b,
                    executable: y,
                },
            ) => a.node == b.node && x == y,
            (Some(a), b) => a == b,
            (None, _) => false,
        };
        if !same {
            if let Some(plan) = s.plan {
                out.plan.nodes.extend(plan.nodes);
            }
            out.changes.push((split(&path), Change::Put(s.entry)));
            put.insert(path);
        }
    }
    // What the base has and the directory does not: removed, a whole directory at once. A
    // path left out of the walk, or with something left out below it, is kept as it was.
    let mut removed: BTreeSet<String> = BTreeSet::new();
    for (path, entry) in &before {
        let parts: Vec<&str> = path.split('/').collect();
        if ignored(&parts)
            || below_any(path, &removed)
            || below_any(path, &put)
            || walked.skipped.contains(path)
            || walked
                .skipped
                .iter()
                .any(|s| below_any(s, &BTreeSet::from([path.clone()])))
        {
            continue;
        }
        let gone = match entry {
            Entry::Dir { .. } => !walked.dirs.contains(path) && !seen.contains(path),
            _ => !seen.contains(path),
        };
        if gone {
            removed.insert(path.clone());
            out.changes.push((split(path), Change::Remove));
        }
    }
    Ok(out)
}

fn split(path: &str) -> Vec<String> {
    path.split('/').map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marimo_state_and_caches_are_never_saved() {
        for p in [
            "__marimo__/session/notebook.py.json",
            "pkg/__pycache__/x.pyc",
            ".venv/bin/python",
            ".git/hooks/pre-commit",
            "a/.git/hooks/post-checkout",
        ] {
            let parts: Vec<&str> = p.split('/').collect();
            assert!(ignored(&parts), "{p}");
        }
        for p in ["notebook.py", ".git/config", "data/hooks/x", "marimo/x.py"] {
            let parts: Vec<&str> = p.split('/').collect();
            assert!(!ignored(&parts), "{p}");
        }
    }

    #[test]
    fn a_removed_directory_covers_what_it_held() {
        let removed = BTreeSet::from(["data".to_string()]);
        assert!(below_any("data/x.csv", &removed));
        assert!(!below_any("data", &removed));
        assert!(!below_any("database.csv", &removed));
    }

    #[test]
    fn walks_files_links_and_limits_without_following_links() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("files");
        std::fs::create_dir_all(root.join("sub")).expect("mkdir");
        std::fs::create_dir_all(root.join("__marimo__")).expect("mkdir");
        std::fs::write(root.join("notebook.py"), b"print(1)\n").expect("write");
        std::fs::write(root.join("sub/big.bin"), vec![7u8; 4096]).expect("write");
        std::fs::write(root.join("__marimo__/state.json"), b"{}").expect("write");
        let outside = dir.path().join("secret");
        std::fs::create_dir(&outside).expect("mkdir");
        std::fs::write(outside.join("key"), b"k").expect("write");
        std::os::unix::fs::symlink(&outside, root.join("escape")).expect("symlink");
        let spool = dir.path().join("spool");
        std::fs::create_dir(&spool).expect("mkdir");
        let limits = Limits {
            max_bytes: 1024,
            max_files: 100,
        };
        let w = walk_dir(&root, &Known::new(), limits, &spool).expect("walk");
        let paths: Vec<&str> = w.entries.keys().map(String::as_str).collect();
        assert_eq!(
            paths,
            ["escape", "notebook.py"],
            "the link is an entry, not followed"
        );
        assert!(
            matches!(&w.entries["escape"].entry, Entry::Symlink { target } if target == outside.to_str().unwrap_or(""))
        );
        assert!(
            w.skipped.contains("sub/big.bin"),
            "over the byte limit: {:?}",
            w.skipped
        );
        // A file known with the same stamp is not read again.
        let known: Known = w
            .entries
            .iter()
            .filter_map(|(p, s)| Some((p.clone(), (s.stamp?, s.entry.clone()))))
            .collect();
        let again = walk_dir(&root, &known, limits, &spool).expect("walk");
        assert!(again.entries["notebook.py"].plan.is_none());
        assert_eq!(again.read_bytes, 0);
    }
}
