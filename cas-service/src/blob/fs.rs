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

    /// Writes `bytes` at `key` durably in one blocking task: a spool file written, then put in
    /// place as [`FsStore::put_file`] does.
    pub async fn put_bytes(&self, key: &str, bytes: Bytes) -> Result<(), BlobError> {
        let root = self.root.clone();
        let spool = self.spool.clone();
        let owned = key.to_string();
        blocking(move || {
            Ok(spool.file_now("object-").and_then(|file| {
                let (dirs, name) = split(&owned);
                std::io::Write::write_all(&mut file.file(), &bytes)
                    .and_then(|()| root.descend(dirs.iter().map(String::as_str), true))
                    .and_then(|dir| place(file, &dir, &name))
                    .map_err(io("store", &owned))
            }))
        })
        .await
        .map_err(io("store", key))?
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
}
