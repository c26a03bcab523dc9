//! The local-folder object store of the embedded default. Every object is written to a spool
//! file, fsynced, and then renamed (or, for write-once uploads, hard-linked, which fails if the
//! target exists) into place, and the directory is fsynced: an object is either absent or
//! complete, also across a crash. Every directory and file below the root is opened by handle
//! without following links (see [`super::dir`]).

use std::io::ErrorKind;
use std::path::Path;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::dir::{SafeDir, SpoolFile};
use super::{BlobError, BodyStream, ListedObject, ObjectReader, PutOnceError, Spool, blocking};

mod adopt;
pub use adopt::HeldUpload;

#[derive(Debug, Clone)]
pub struct FsStore {
    root: SafeDir,
    spool: Spool,
}

fn io<'a>(op: &'static str, key: &'a str) -> impl FnOnce(std::io::Error) -> BlobError + 'a {
    move |source| BlobError::Io {
        op,
        key: key.to_string(),
        source,
    }
}

/// A key's directory components and file name.
fn split(key: &str) -> (Vec<String>, String) {
    let mut parts: Vec<String> = key.split('/').map(str::to_string).collect();
    let name = parts.pop().unwrap_or_default();
    (parts, name)
}

/// Puts a written spool file in place as `name` in `dir`, durably: the file fsynced, renamed,
/// the directory fsynced. Blocking.
fn place(spool: SpoolFile, dir: &SafeDir, name: &str) -> std::io::Result<()> {
    spool.file().sync_all()?;
    spool.rename_into(dir, name)?;
    dir.sync()
}

/// An I/O error for a second item (`std::io::Error` is not `Clone`).
fn copy_error(e: &std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), e.to_string())
}

/// The result of an item of [`FsStore::put_many_bytes`] that `e` failed.
fn store_failed(e: &std::io::Error, key: &str) -> Result<(), BlobError> {
    Err(io("store", key)(copy_error(e)))
}

/// Blocking tasks that write the objects of one [`FsStore::put_many_bytes`] at once (each a
/// run of consecutive items), and that fsync its directories.
const PLACING_TASKS: usize = 8;

/// Directories opened by handle during one run of writes, each once: its components, its
/// handle, the items renamed into it, and whether a directory was created in it (which its
/// fsync makes durable).
#[derive(Default)]
struct Dirs {
    open: Vec<(Vec<String>, SafeDir, Vec<usize>, bool)>,
}

impl Dirs {
    /// The slot of the directory at `components`, opened (and created, as its parents) on
    /// first use, each parent through its own slot. Blocking.
    fn slot(&mut self, root: &SafeDir, components: &[String]) -> std::io::Result<usize> {
        if let Some(i) = self.open.iter().position(|(c, ..)| c == components) {
            return Ok(i);
        }
        let dir = match components.split_last() {
            Some((last, parent)) => {
                let p = self.slot(root, parent)?;
                let (dir, created) = self.open[p].1.child_unsynced(last, true)?;
                self.open[p].3 |= created;
                dir
            }
            None => root.clone(),
        };
        self.open
            .push((components.to_vec(), dir, Vec::new(), false));
        Ok(self.open.len() - 1)
    }

    /// Takes in the directories of another run (whose items start at `offset`).
    fn merge(&mut self, other: Dirs, offset: usize) {
        for (components, dir, items, created) in other.open {
            let items = items.into_iter().map(|i| i + offset);
            match self.open.iter_mut().find(|(c, ..)| *c == components) {
                Some((_, _, mine, made)) => {
                    mine.extend(items);
                    *made |= created;
                }
                None => self.open.push((components, dir, items.collect(), created)),
            }
        }
    }

    /// The directories to fsync, each with the items it makes durable: those renamed into it
    /// or, when a directory was created in it, every item below it.
    fn to_sync(&self) -> Vec<(SafeDir, Vec<usize>)> {
        self.open
            .iter()
            .filter(|(_, _, items, created)| *created || !items.is_empty())
            .map(|(components, dir, items, created)| {
                let mut covered = items.clone();
                if *created {
                    for (c, _, below, _) in &self.open {
                        if c.len() > components.len() && c.starts_with(components) {
                            covered.extend(below);
                        }
                    }
                }
                (dir.clone(), covered)
            })
            .collect()
    }
}

/// Writes each item of a run to a spool file (the floor checked first), fsyncs it and renames
/// it into its directory, but does not fsync the directories: they are answered with the
/// items renamed into each. Blocking.
fn place_run(
    root: &SafeDir,
    spool: &Spool,
    items: &[(String, Bytes)],
) -> (Vec<Result<(), BlobError>>, Dirs) {
    let mut dirs = Dirs::default();
    let results = items
        .iter()
        .enumerate()
        .map(|(i, (key, bytes))| {
            let file = spool.file_now("object-")?;
            let (components, name) = split(key);
            std::io::Write::write_all(&mut file.file(), bytes)
                .and_then(|()| file.file().sync_all())
                .and_then(|()| dirs.slot(root, &components))
                .and_then(|slot| {
                    file.rename_into(&dirs.open[slot].1, &name)?;
                    dirs.open[slot].2.push(i);
                    Ok(())
                })
                .map_err(io("store", key))
        })
        .collect();
    (results, dirs)
}

/// fsyncs each directory; answers those whose fsync failed, with the items each was to make
/// durable. Blocking.
fn sync_dirs(dirs: Vec<(SafeDir, Vec<usize>)>) -> Vec<(std::io::Error, Vec<usize>)> {
    dirs.into_iter()
        .filter_map(|(dir, items)| dir.sync().err().map(|e| (e, items)))
        .collect()
}

impl FsStore {
    pub fn open(root: &Path, min_free_bytes: u64) -> anyhow::Result<Self> {
        let dir = SafeDir::open_root(root, true).map_err(|e| {
            anyhow::anyhow!("cannot open the blob store at {}: {e}", root.display())
        })?;
        let spool = dir.child(".spool", true).map_err(|e| {
            anyhow::anyhow!(
                "cannot open the spool of the blob store at {}: {e}",
                root.display()
            )
        })?;
        Ok(FsStore {
            root: dir,
            spool: Spool::new(spool, min_free_bytes),
        })
    }

    pub fn spool(&self) -> &Spool {
        &self.spool
    }

    /// The directory that holds `key`, opened (and created when asked) by handle.
    async fn dir_of(&self, key: &str, create: bool) -> std::io::Result<(SafeDir, String)> {
        let root = self.root.clone();
        let (dirs, name) = split(key);
        blocking(move || {
            let dir = root.descend(dirs.iter().map(String::as_str), create)?;
            Ok((dir, name))
        })
        .await
    }

    pub async fn put_once(
        &self,
        key: &str,
        body: BodyStream,
        max: u64,
    ) -> Result<u64, PutOnceError> {
        let (dir, name) = self
            .dir_of(key, true)
            .await
            .map_err(io("create directory for", key))?;
        let (part, written) = self.spool.write(key, body, max).await?;
        // No fsync: an upload lost or torn by a power failure is refused by the next lease's
        // validation and simply uploaded again. Canonical objects, which rows point at, are
        // fsynced (`put_file`). The link fails if the target exists: write once.
        let linked = blocking(move || part.link_into(&dir, &name)).await;
        match linked {
            Ok(()) => Ok(written),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(PutOnceError::Exists),
            Err(e) => Err(io("link", key)(e).into()),
        }
    }

    /// Moves a finished spool file into place at `key`, durably ([`place`]), in one blocking
    /// task.
    pub async fn put_file(&self, key: &str, spool: SpoolFile) -> Result<(), BlobError> {
        let root = self.root.clone();
        let owned = key.to_string();
        blocking(move || {
            let (dirs, name) = split(&owned);
            Ok(root
                .descend(dirs.iter().map(String::as_str), true)
                .map_err(io("create directory for", &owned))
                .and_then(|dir| place(spool, &dir, &name).map_err(io("store", &owned))))
        })
        .await
        .map_err(io("store", key))?
    }

    /// Writes `bytes` at `key` durably in one blocking task ([`FsStore::put_many_bytes`] of
    /// one).
    pub async fn put_bytes(&self, key: &str, bytes: Bytes) -> Result<(), BlobError> {
        let mut results = self.put_many_bytes(vec![(key.to_string(), bytes)]).await;
        results
            .pop()
            .unwrap_or_else(|| Err(io("store", key)(ErrorKind::Other.into())))
    }

    /// Writes each `(key, bytes)` durably: runs of consecutive items in [`PLACING_TASKS`]
    /// blocking tasks at once, each object written to a spool file (the floor checked before
    /// each), fsynced and renamed into place; then every directory that took one fsynced once.
    /// One result per item, in order; an item that fails leaves nothing at its key and does not
    /// fail the others (a directory whose fsync fails fails the items renamed into it). A
    /// single object is placed and its directory fsynced by one blocking task.
    pub async fn put_many_bytes(&self, items: Vec<(String, Bytes)>) -> Vec<Result<(), BlobError>> {
        let keys: Vec<String> = items.iter().map(|(k, _)| k.clone()).collect();
        let (mut results, unsynced) = if items.len() <= 1 {
            let (root, spool) = (self.root.clone(), self.spool.clone());
            let placed = blocking(move || {
                let (results, dirs) = place_run(&root, &spool, &items);
                Ok((results, sync_dirs(dirs.to_sync())))
            })
            .await;
            placed.unwrap_or_else(|e| {
                let failed = keys.iter().map(|k| store_failed(&e, k)).collect();
                (failed, Vec::new())
            })
        } else {
            self.place_runs(items, &keys).await
        };
        for (e, items) in unsynced {
            for i in items {
                results[i] = store_failed(&e, &keys[i]);
            }
        }
        results
    }

    /// The runs of [`FsStore::put_many_bytes`], [`PLACING_TASKS`] at once, then their
    /// directories, each once: the results, and the directories whose fsync failed with the
    /// items each was to make durable.
    async fn place_runs(
        &self,
        items: Vec<(String, Bytes)>,
        keys: &[String],
    ) -> (
        Vec<Result<(), BlobError>>,
        Vec<(std::io::Error, Vec<usize>)>,
    ) {
        use futures_util::future::join_all;
        let run = keys.len().div_ceil(PLACING_TASKS).max(1);
        let mut runs = Vec::new();
        let mut rest = items;
        while !rest.is_empty() {
            let tail = rest.split_off(run.min(rest.len()));
            runs.push(std::mem::replace(&mut rest, tail));
        }
        let placed = join_all(runs.into_iter().map(|run| {
            let (root, spool) = (self.root.clone(), self.spool.clone());
            let len = run.len();
            async move {
                (
                    len,
                    blocking(move || Ok(place_run(&root, &spool, &run))).await,
                )
            }
        }))
        .await;
        let mut results = Vec::with_capacity(keys.len());
        let mut dirs = Dirs::default();
        for (len, run) in placed {
            let offset = results.len();
            match run {
                Ok((r, d)) => {
                    results.extend(r);
                    dirs.merge(d, offset);
                }
                Err(e) => results.extend(
                    keys[offset..offset + len]
                        .iter()
                        .map(|k| store_failed(&e, k)),
                ),
            }
        }
        // Each directory once, after every name renamed into it.
        let to_sync = dirs.to_sync();
        let per_task = to_sync.len().div_ceil(PLACING_TASKS).max(1);
        let unsynced = join_all(to_sync.chunks(per_task).map(|chunk| {
            let chunk = chunk.to_vec();
            let all: Vec<usize> = chunk.iter().flat_map(|(_, i)| i.clone()).collect();
            async move {
                // The task itself failed: none of its directories is known to be synced.
                blocking(move || Ok(sync_dirs(chunk)))
                    .await
                    .unwrap_or_else(|e| vec![(e, all)])
            }
        }))
        .await;
        (results, unsynced.into_iter().flatten().collect())
    }

    pub async fn get(
        &self,
        key: &str,
        range: Option<(u64, u64)>,
    ) -> Result<Option<(ObjectReader, u64)>, BlobError> {
        let root = self.root.clone();
        let (dirs, name) = split(key);
        let found = blocking(move || {
            root.descend(dirs.iter().map(String::as_str), false)?
                .open_file(&name)
        })
        .await;
        let file = match found {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("open", key)(e)),
        };
        let mut file = tokio::fs::File::from_std(file);
        let len = file.metadata().await.map_err(io("stat", key))?.len();
        match range {
            None => Ok(Some((Box::pin(file), len))),
            Some((start, end)) => {
                file.seek(std::io::SeekFrom::Start(start))
                    .await
                    .map_err(io("seek", key))?;
                Ok(Some((Box::pin(file.take(end.saturating_sub(start))), len)))
            }
        }
    }

    pub async fn delete(&self, key: &str) -> Result<(), BlobError> {
        let removed = match self.dir_of(key, false).await {
            Ok((dir, name)) => blocking(move || dir.unlink(&name)).await,
            Err(e) => Err(e),
        };
        match removed {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("delete", key)(e)),
        }
    }

    /// Deletes `keys` in one blocking task; one result per key, in order.
    pub async fn delete_many(&self, keys: &[String]) -> Vec<Result<(), BlobError>> {
        let root = self.root.clone();
        let owned = keys.to_vec();
        let removed = blocking(move || {
            Ok(owned
                .iter()
                .map(|key| {
                    let (dirs, name) = split(key);
                    let gone = root
                        .descend(dirs.iter().map(String::as_str), false)
                        .and_then(|dir| dir.unlink(&name));
                    match gone {
                        Err(e) if e.kind() != ErrorKind::NotFound => Err(io("delete", key)(e)),
                        _ => Ok(()),
                    }
                })
                .collect::<Vec<_>>())
        })
        .await;
        match removed {
            Ok(results) => results,
            Err(e) => keys
                .iter()
                .map(|k| {
                    Err(BlobError::Io {
                        op: "delete",
                        key: k.clone(),
                        source: std::io::Error::new(e.kind(), e.to_string()),
                    })
                })
                .collect(),
        }
    }

    pub async fn list(&self, prefix: &str) -> Result<Vec<ListedObject>, BlobError> {
        let root = self.root.clone();
        let start: Vec<String> = prefix
            .trim_end_matches('/')
            .split('/')
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect();
        let p = prefix.to_string();
        blocking(move || {
            let mut out = Vec::new();
            let top = match root.descend(start.iter().map(String::as_str), false) {
                Ok(d) => d,
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(out),
                Err(e) => return Err(e),
            };
            let mut stack = vec![(start.join("/"), top)];
            while let Some((at, dir)) = stack.pop() {
                for (name, is_dir, size, modified_ms) in dir.entries()? {
                    let key = if at.is_empty() {
                        name.clone()
                    } else {
                        format!("{at}/{name}")
                    };
                    if is_dir {
                        if name != ".spool" {
                            stack.push((key, dir.child(&name, false)?));
                        }
                        continue;
                    }
                    out.push(ListedObject {
                        key,
                        size,
                        modified_ms,
                    });
                }
            }
            out.retain(|o| o.key.starts_with(&p));
            out.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(out)
        })
        .await
        .map_err(io("list", prefix))
    }

    pub async fn ping(&self) -> bool {
        let root = self.root.clone();
        blocking(move || root.free_bytes()).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spooled(root: &Path) -> usize {
        std::fs::read_dir(root.join(".spool"))
            .expect("spool")
            .count()
    }

    #[tokio::test]
    async fn bytes_are_stored_whole_or_not_at_all() {
        let root = tempfile::tempdir().expect("dir");
        let outside = tempfile::tempdir().expect("dir");
        let store = FsStore::open(root.path(), 0).expect("store");
        store
            .put_bytes("a/b/obj", Bytes::from_static(b"content"))
            .await
            .expect("put");
        assert_eq!(
            std::fs::read(root.path().join("a/b/obj")).expect("read"),
            b"content"
        );
        assert_eq!(spooled(root.path()), 0);

        // A directory of the key that is a link is refused; nothing is written through it and
        // the spool file is gone.
        std::os::unix::fs::symlink(outside.path(), root.path().join("esc")).expect("link");
        let refused = store
            .put_bytes("esc/obj", Bytes::from_static(b"x"))
            .await
            .expect_err("through a link");
        assert!(
            matches!(refused, BlobError::Io { op: "store", .. }),
            "{refused}"
        );
        assert_eq!(std::fs::read_dir(outside.path()).expect("list").count(), 0);
        assert_eq!(spooled(root.path()), 0);

        // Below the free-space floor nothing is written.
        let full = FsStore::open(root.path(), u64::MAX).expect("store");
        let refused = full
            .put_bytes("a/b/other", Bytes::from_static(b"x"))
            .await
            .expect_err("below the floor");
        assert!(matches!(refused, BlobError::Full { .. }), "{refused}");
        assert!(!root.path().join("a/b/other").exists());
        assert_eq!(spooled(root.path()), 0);
    }

    #[tokio::test]
    async fn many_objects_are_written_together_each_failing_alone() {
        let root = tempfile::tempdir().expect("dir");
        let outside = tempfile::tempdir().expect("dir");
        std::os::unix::fs::symlink(outside.path(), root.path().join("esc")).expect("link");
        // Existing and new directories, two objects in one directory, one key through a link
        // and one whose name is not a plain component, between good ones.
        std::fs::create_dir_all(root.path().join("a/b")).expect("mkdir");
        let store = FsStore::open(root.path(), 0).expect("store");
        let items: Vec<(String, Bytes)> = [
            ("a/b/one", "1"),
            ("esc/two", "2"),
            ("a/c/three", "3"),
            ("a/b/four", "4"),
            ("a/b/..", "5"),
            ("d/e/f/six", "6"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), Bytes::from(v.repeat(1000))))
        .collect();
        let results = store.put_many_bytes(items.clone()).await;
        assert_eq!(results.len(), items.len());
        for ((key, bytes), result) in items.iter().zip(&results) {
            if key.starts_with("esc/") || key.ends_with("..") {
                let e = result.as_ref().expect_err(key);
                assert!(matches!(e, BlobError::Io { op: "store", .. }), "{e}");
            } else {
                result.as_ref().expect(key);
                let read = std::fs::read(root.path().join(key)).expect(key);
                assert_eq!(read, bytes.as_ref(), "{key}");
            }
        }
        assert_eq!(std::fs::read_dir(outside.path()).expect("list").count(), 0);
        assert_eq!(spooled(root.path()), 0);

        // Below the floor every item is refused and nothing is written.
        let full = FsStore::open(root.path(), u64::MAX).expect("store");
        let results = full
            .put_many_bytes(vec![
                ("g/one".to_string(), Bytes::from_static(b"1")),
                ("g/two".to_string(), Bytes::from_static(b"2")),
            ])
            .await;
        assert!(
            results
                .iter()
                .all(|r| matches!(r, Err(BlobError::Full { .. }))),
            "{results:?}"
        );
        assert!(!root.path().join("g").exists());
        assert_eq!(spooled(root.path()), 0);
        assert!(full.put_many_bytes(Vec::new()).await.is_empty());
    }

    #[test]
    fn a_created_directory_is_synced_with_everything_below_it() {
        let root = tempfile::tempdir().expect("dir");
        std::fs::create_dir(root.path().join("a")).expect("mkdir");
        let root = SafeDir::open_root(root.path(), false).expect("root");
        let path = |p: &str| p.split('/').map(str::to_string).collect::<Vec<_>>();
        let mut dirs = Dirs::default();
        for (i, p) in ["a/b", "a/b", "a/c/d", "a"].iter().enumerate() {
            let slot = dirs.slot(&root, &path(p)).expect("slot");
            dirs.open[slot].2.push(i);
        }
        let mut synced: Vec<(String, Vec<usize>)> = dirs
            .to_sync()
            .into_iter()
            .map(|(d, mut items)| {
                items.sort_unstable();
                (d.path().display().to_string(), items)
            })
            .collect();
        synced.sort();
        let root_path = root.path().display().to_string();
        // `a` existed: the root is not synced; `b` and `c` were created in `a`, `d` in `c`.
        assert_eq!(
            synced,
            vec![
                (format!("{root_path}/a"), vec![0, 1, 2, 3]),
                (format!("{root_path}/a/b"), vec![0, 1]),
                (format!("{root_path}/a/c"), vec![2]),
                (format!("{root_path}/a/c/d"), vec![2]),
            ]
        );
    }
}
