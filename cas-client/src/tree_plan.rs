//! Planning a directory as a tree: one walk lists its entries, then its files are read and
//! hashed on several threads at once (hashing is what planning spends its time on), and the
//! directory nodes are built bottom-up from what they found.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use cas_format::Hash;

use crate::dag::Plan;
use crate::error::ClientError;
use crate::files::{FileRef, plan_file};
use crate::tree::{Entry, plan_entries, valid_name};

/// Threads that read and hash files at most.
const PLANNERS_MAX: usize = 4;

/// An entry found by the walk, before its file is planned.
enum Walked {
    /// The `index`-th file the walk found.
    File {
        index: usize,
        executable: bool,
    },
    Dir(BTreeMap<String, Walked>),
    Symlink(String),
}

/// Plans the directory at `path` (recursively). Blocking: call it from a blocking thread.
pub fn plan_dir(plan: &mut Plan, path: &Path) -> Result<Hash, ClientError> {
    let mut files = Vec::new();
    let root = walk(path, &mut files)?;
    let planned = plan_files(plan, &files)?;
    build(plan, root, &planned)
}

/// The entries of the directory at `path`, recursively; appends each file's path to `files`.
fn walk(path: &Path, files: &mut Vec<PathBuf>) -> Result<BTreeMap<String, Walked>, ClientError> {
    let io = |e| ClientError::io(format!("cannot read {}", path.display()), e);
    let mut entries = BTreeMap::new();
    for item in std::fs::read_dir(path).map_err(io)? {
        let item = item.map_err(io)?;
        let name = item.file_name().into_string().map_err(|n| {
            ClientError::Invalid(format!("{}: file name {n:?} is not UTF-8", path.display()))
        })?;
        if !valid_name(&name) {
            return Err(ClientError::Invalid(format!(
                "{}: invalid file name {name:?}",
                path.display()
            )));
        }
        let child = item.path();
        let meta = std::fs::symlink_metadata(&child).map_err(io)?;
        let entry = if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&child).map_err(io)?;
            let target = target.into_os_string().into_string().map_err(|t| {
                ClientError::Invalid(format!(
                    "{}: link target {t:?} is not UTF-8",
                    child.display()
                ))
            })?;
            Walked::Symlink(target)
        } else if meta.is_dir() {
            Walked::Dir(walk(&child, files)?)
        } else if meta.is_file() {
            use std::os::unix::fs::PermissionsExt;
            files.push(child);
            Walked::File {
                index: files.len() - 1,
                executable: meta.permissions().mode() & 0o111 != 0,
            }
        } else {
            return Err(ClientError::Invalid(format!(
                "{}: not a file, directory or symlink",
                child.display()
            )));
        };
        entries.insert(name, entry);
    }
    Ok(entries)
}

/// Plans every file of `files` into `plan`, several at once; their references in order. When
/// some fail, the error of the first of them (in walk order) is returned.
fn plan_files(plan: &mut Plan, files: &[PathBuf]) -> Result<Vec<FileRef>, ClientError> {
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, PLANNERS_MAX)
        .min(files.len().max(1));
    let next = AtomicUsize::new(0);
    // The first failure by index: every file before it was claimed, so was planned too.
    let failed: Mutex<Option<(usize, ClientError)>> = Mutex::new(None);
    let stop = || failed.lock().map_or(true, |f| f.is_some());
    let fail = |index: usize, e: ClientError| {
        if let Ok(mut f) = failed.lock()
            && f.as_ref().is_none_or(|(first, _)| index < *first)
        {
            *f = Some((index, e));
        }
    };
    let mut found: Vec<Option<FileRef>> = vec![None; files.len()];
    let parts: Vec<(Plan, Vec<(usize, FileRef)>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut own = Plan::default();
                    let mut done = Vec::new();
                    while !stop() {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        let Some(path) = files.get(index) else { break };
                        match plan_file(&mut own, path) {
                            Ok(file) => done.push((index, file)),
                            Err(e) => fail(index, e),
                        }
                    }
                    (own, done)
                })
            })
            .collect();
        workers.into_iter().filter_map(|w| w.join().ok()).collect()
    });
    if let Some((_, e)) = failed.into_inner().ok().flatten() {
        return Err(e);
    }
    for (own, done) in parts {
        plan.merge(own);
        for (index, file) in done {
            found[index] = Some(file);
        }
    }
    found
        .into_iter()
        .zip(files)
        .map(|(f, path)| {
            f.ok_or_else(|| {
                ClientError::Invalid(format!("{} could not be planned", path.display()))
            })
        })
        .collect()
}

/// The directory node of walked `entries`, its files planned as `files`; and those of its
/// subdirectories before it.
fn build(
    plan: &mut Plan,
    entries: BTreeMap<String, Walked>,
    files: &[FileRef],
) -> Result<Hash, ClientError> {
    let mut planned = BTreeMap::new();
    for (name, walked) in entries {
        let entry = match walked {
            Walked::File { index, executable } => Entry::File {
                file: files[index],
                executable,
            },
            Walked::Dir(sub) => Entry::Dir {
                node: build(plan, sub, files)?,
            },
            Walked::Symlink(target) => Entry::Symlink { target },
        };
        planned.insert(name, entry);
    }
    plan_entries(plan, &planned)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files planned on several threads give the tree (and the nodes) that planning them one
    /// after another gives; a file that cannot be read fails the plan, naming the first one.
    #[test]
    fn parallel_planning_matches_sequential() {
        let dir = tempfile::tempdir().expect("dir");
        let mut expected = Plan::default();
        let mut entries = BTreeMap::new();
        for i in 0..40usize {
            let name = format!("f{i:02}");
            let content: Vec<u8> = (0..(i * 7_919) % 300_000).map(|b| (b * i) as u8).collect();
            std::fs::write(dir.path().join(&name), &content).expect("write");
            let file = plan_file(&mut expected, &dir.path().join(&name)).expect("file");
            entries.insert(
                name,
                Entry::File {
                    file,
                    executable: false,
                },
            );
        }
        let root = plan_entries(&mut expected, &entries).expect("root");
        let mut plan = Plan::default();
        assert_eq!(plan_dir(&mut plan, dir.path()).expect("plan"), root);
        let mut want: Vec<Hash> = expected.nodes.keys().copied().collect();
        let mut got: Vec<Hash> = plan.nodes.keys().copied().collect();
        want.sort();
        got.sort();
        assert_eq!(got, want);

        // Files that cannot be read: the plan fails, naming the first in walk order.
        let mut files = Vec::new();
        walk(dir.path(), &mut files).expect("walk");
        let gone = [files[3].clone(), files[20].clone()];
        for f in &gone {
            std::fs::remove_file(f).expect("remove");
        }
        let e = plan_files(&mut Plan::default(), &files).expect_err("missing files");
        assert!(
            e.to_string().contains(&gone[0].display().to_string()),
            "{e}"
        );
    }
}
