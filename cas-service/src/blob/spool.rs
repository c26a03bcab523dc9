//! The spool: where a store writes bytes before they are moved into place or sent on.

use bytes::Bytes;
use tokio::task::JoinHandle;

use super::{BlobError, BodyStream, PutOnceError, SafeDir, SpoolFile, blocking};

/// Bytes of a body's chunks written to a spool file by one blocking write.
const SPOOL_BATCH: usize = 1 << 20;

/// Where a store spools bytes: a directory held by handle, with a free-space floor below which
/// nothing more is written.
#[derive(Debug, Clone)]
pub struct Spool {
    dir: SafeDir,
    min_free: u64,
}

impl Spool {
    pub fn new(dir: SafeDir, min_free: u64) -> Self {
        Spool { dir, min_free }
    }

    /// Fails with [`BlobError::Full`] when the disk is below its floor.
    pub async fn check_free(&self) -> Result<(), BlobError> {
        if self.min_free == 0 {
            return Ok(());
        }
        let spool = self.clone();
        blocking(move || Ok(spool.check_free_now()))
            .await
            .map_err(|source| self.io("check free space of", source))?
    }

    /// [`Spool::check_free`], blocking.
    pub fn check_free_now(&self) -> Result<(), BlobError> {
        if self.min_free == 0 {
            return Ok(());
        }
        let free = self
            .dir
            .free_bytes()
            .map_err(|source| self.io("check free space of", source))?;
        if free < self.min_free {
            return Err(BlobError::Full {
                free,
                floor: self.min_free,
            });
        }
        Ok(())
    }

    fn io(&self, op: &'static str, source: std::io::Error) -> BlobError {
        BlobError::Io {
            op,
            key: self.dir.path().display().to_string(),
            source,
        }
    }

    /// A new spool file named `<prefix>…`, blocking: the floor is checked first.
    pub fn file_now(&self, prefix: &str) -> Result<SpoolFile, BlobError> {
        self.check_free_now()?;
        SpoolFile::create(&self.dir, prefix)
            .map_err(|source| self.io("create spool file in", source))
    }

    /// A new spool file named `<prefix>…`.
    pub async fn file(&self, prefix: &str) -> Result<SpoolFile, BlobError> {
        let spool = self.clone();
        let prefix = prefix.to_string();
        blocking(move || Ok(spool.file_now(&prefix)))
            .await
            .map_err(|source| self.io("create spool file in", source))?
    }

    /// Writes `body` (at most `max` bytes) to a new spool file for `key`; checks the floor
    /// again every 8 MiB. The body's chunks are written as they are, a batch of them
    /// ([`SPOOL_BATCH`] bytes) by one blocking write while the next batch is received.
    pub async fn write(
        &self,
        key: &str,
        mut body: BodyStream,
        max: u64,
    ) -> Result<(SpoolFile, u64), PutOnceError> {
        use futures_util::StreamExt;
        let spool = self.file("upload-").await?;
        let io = |source| BlobError::Io {
            op: "spool",
            key: key.to_string(),
            source,
        };
        let mut writer = Writer::Idle(spool.handle().map_err(io)?);
        let mut batch: Vec<Bytes> = Vec::new();
        let mut batched = 0usize;
        let mut written = 0u64;
        let mut checked = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(PutOnceError::Body)?;
            written += chunk.len() as u64;
            if written > max {
                return Err(PutOnceError::TooLarge(max));
            }
            if written - checked > 8 << 20 {
                self.check_free().await?;
                checked = written;
            }
            batched += chunk.len();
            batch.push(chunk);
            if batched >= SPOOL_BATCH {
                writer = writer.write(std::mem::take(&mut batch)).await.map_err(io)?;
                batched = 0;
            }
        }
        writer
            .write(batch)
            .await
            .map_err(io)?
            .file()
            .await
            .map_err(io)?;
        Ok((spool, written))
    }
}

/// A spool file being written: idle, or held by the blocking write under way.
enum Writer {
    Idle(std::fs::File),
    Writing(JoinHandle<std::io::Result<std::fs::File>>),
}

impl Writer {
    /// The file, once the write under way (if any) has finished.
    async fn file(self) -> std::io::Result<std::fs::File> {
        match self {
            Writer::Idle(file) => Ok(file),
            Writer::Writing(task) => task.await.map_err(std::io::Error::other)?,
        }
    }

    /// Starts writing `chunks` after what is being written; returns at once.
    async fn write(self, chunks: Vec<Bytes>) -> std::io::Result<Writer> {
        let mut file = self.file().await?;
        if chunks.is_empty() {
            return Ok(Writer::Idle(file));
        }
        Ok(Writer::Writing(tokio::task::spawn_blocking(move || {
            for chunk in &chunks {
                std::io::Write::write_all(&mut file, chunk)?;
            }
            Ok(file)
        })))
    }
}
