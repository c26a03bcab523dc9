//! The local-folder object store of the embedded default. Every object is written to a spool
//! file, fsynced, and then renamed (or, for write-once uploads, hard-linked, which fails if the
//! target exists) into place, and the directory is fsynced: an object is either absent or
//! complete, also across a crash.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use super::{BlobError, BodyStream, ListedObject, ObjectReader, PutOnceError};

#[derive(Debug, Clone)]
pub struct FsStore {
    root: PathBuf,
}

fn io<'a>(op: &'static str, key: &'a str) -> impl FnOnce(std::io::Error) -> BlobError + 'a {
    move |source| BlobError::Io {
        op,
        key: key.to_string(),
        source,
    }
}

/// fsyncs a directory so that a rename or link in it survives a power loss.
async fn sync_dir(dir: &Path) -> std::io::Result<()> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || std::fs::File::open(&dir)?.sync_all())
        .await
        .map_err(std::io::Error::other)?
}

impl FsStore {
    pub fn open(root: &Path) -> anyhow::Result<Self> {
        let store = FsStore {
            root: root.to_path_buf(),
        };
        std::fs::create_dir_all(store.spool_dir()).map_err(|e| {
            anyhow::anyhow!("cannot create the blob store at {}: {e}", root.display())
        })?;
        Ok(store)
    }

    pub fn spool_dir(&self) -> PathBuf {
        self.root.join(".spool")
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    async fn parent_dir(&self, key: &str) -> Result<PathBuf, BlobError> {
        let path = self.path(key);
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(io("create directory for", key))?;
        Ok(dir)
    }

    pub async fn put_once(
        &self,
        key: &str,
        mut body: BodyStream,
        max: u64,
    ) -> Result<u64, PutOnceError> {
        self.parent_dir(key).await?;
        let target = self.path(key);
        if tokio::fs::try_exists(&target).await.unwrap_or(false) {
            return Err(PutOnceError::Exists);
        }
        let part = tempfile::Builder::new()
            .prefix("upload-")
            .tempfile_in(self.spool_dir())
            .map_err(|e| BlobError::Io {
                op: "create spool file for",
                key: key.to_string(),
                source: e,
            })?;
        let (file, part_path) = part.into_parts();
        let mut file = tokio::fs::File::from_std(file);
        let mut written = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(PutOnceError::Body)?;
            written += chunk.len() as u64;
            if written > max {
                return Err(PutOnceError::TooLarge(max));
            }
            file.write_all(&chunk).await.map_err(io("write", key))?;
        }
        // No fsync: an upload lost or torn by a power failure is refused by the next lease's
        // validation and simply uploaded again. Canonical objects, which rows point at, are
        // fsynced (`put_file`).
        file.flush().await.map_err(io("write", key))?;
        drop(file);
        match tokio::fs::hard_link(&part_path, &target).await {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => return Err(PutOnceError::Exists),
            Err(e) => return Err(io("link", key)(e).into()),
        }
        // `part_path` removes the spool name when dropped; the link keeps the data.
        drop(part_path);
        Ok(written)
    }

    pub async fn put_file(&self, key: &str, file: &Path) -> Result<(), BlobError> {
        let dir = self.parent_dir(key).await?;
        tokio::fs::File::open(file)
            .await
            .map_err(io("open spool file for", key))?
            .sync_all()
            .await
            .map_err(io("sync", key))?;
        tokio::fs::rename(file, self.path(key))
            .await
            .map_err(io("rename into", key))?;
        sync_dir(&dir).await.map_err(io("sync directory of", key))?;
        Ok(())
    }

    pub async fn get(
        &self,
        key: &str,
        range: Option<(u64, u64)>,
    ) -> Result<Option<(ObjectReader, u64)>, BlobError> {
        let mut file = match tokio::fs::File::open(self.path(key)).await {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("open", key)(e)),
        };
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
        match tokio::fs::remove_file(self.path(key)).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("delete", key)(e)),
        }
    }

    pub async fn list(&self, prefix: &str) -> Result<Vec<ListedObject>, BlobError> {
        let root = self.root.clone();
        let start = self.path(prefix);
        let prefix = prefix.to_string();
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let mut stack = vec![start];
            while let Some(dir) = stack.pop() {
                let entries = match std::fs::read_dir(&dir) {
                    Ok(e) => e,
                    Err(e) if e.kind() == ErrorKind::NotFound => continue,
                    Err(e) => return Err(io("list", &prefix)(e)),
                };
                for entry in entries {
                    let entry = entry.map_err(io("list", &prefix))?;
                    let meta = entry.metadata().map_err(io("list", &prefix))?;
                    let path = entry.path();
                    if meta.is_dir() {
                        if path.file_name() != Some(".spool".as_ref()) {
                            stack.push(path);
                        }
                        continue;
                    }
                    let Ok(rel) = path.strip_prefix(&root) else {
                        continue;
                    };
                    let key = rel
                        .components()
                        .map(|c| c.as_os_str().to_string_lossy())
                        .collect::<Vec<_>>()
                        .join("/");
                    let modified_ms = meta
                        .modified()
                        .ok()
                        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                        .map_or(0, |d| d.as_millis() as i64);
                    out.push(ListedObject {
                        key,
                        size: meta.len(),
                        modified_ms,
                    });
                }
            }
            out.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(out)
        })
        .await
        .map_err(|e| io("list", "")(std::io::Error::other(e)))?
    }

    pub async fn ping(&self) -> bool {
        tokio::fs::metadata(&self.root).await.is_ok()
    }
}
