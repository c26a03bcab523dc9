//! Spooling request bodies (pushes, imports, staged uploads): a bounded number at once, above a
//! free-space floor, into anonymous files of the spool directory. A spool file has no name, so
//! it is only ever used through its handle and nothing can redirect it; it disappears with its
//! last handle, also after a crash.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::HubConfig;
use crate::error::{HubError, HubResult};

/// Bytes read between two checks of the free-space floor.
const CHECK_EVERY: u64 = 8 << 20;

/// The spools of one hub process.
pub struct Spools {
    slots: Arc<Semaphore>,
    max: usize,
    dir: PathBuf,
    min_free: u64,
}

/// A held spool slot; released when dropped.
pub struct SpoolSlot {
    _permit: OwnedSemaphorePermit,
}

/// Why a guarded body stopped: the disk went below its floor.
#[derive(Debug)]
struct DiskFull;

impl std::fmt::Display for DiskFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the disk is below its free-space floor")
    }
}

impl std::error::Error for DiskFull {}

/// Whether an I/O error is the floor being reached (from [`Spools::guard`]).
pub fn is_disk_full(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::StorageFull
        || e.get_ref().is_some_and(|inner| inner.is::<DiskFull>())
}

impl Spools {
    pub fn new(config: &HubConfig) -> Self {
        Spools {
            slots: Arc::new(Semaphore::new(config.max_concurrent_spools)),
            max: config.max_concurrent_spools,
            dir: config.spool_dir(),
            min_free: config.min_free_bytes,
        }
    }

    /// A slot, or 503 `busy` when every slot is taken.
    pub fn slot(&self) -> HubResult<SpoolSlot> {
        match self.slots.clone().try_acquire_owned() {
            Ok(permit) => Ok(SpoolSlot { _permit: permit }),
            Err(_) => Err(HubError::busy(
                format!(
                    "{} uploads, pushes or imports are being received already; retry shortly",
                    self.max
                ),
                5,
            )),
        }
    }

    fn free_bytes(&self) -> std::io::Result<u64> {
        let s = rustix::fs::statvfs(&self.dir)?;
        Ok(s.f_bavail.saturating_mul(s.f_frsize))
    }

    /// 507 when the disk is below its floor.
    pub fn check_free(&self) -> HubResult<()> {
        if self.min_free == 0 {
            return Ok(());
        }
        let free = self
            .free_bytes()
            .map_err(|e| HubError::internal("cannot read the spool disk's free space", e))?;
        if free < self.min_free {
            tracing::warn!(
                free,
                floor = self.min_free,
                "the spool disk is below its floor"
            );
            return Err(HubError::insufficient_storage());
        }
        Ok(())
    }

    /// A new anonymous spool file (checked against the floor).
    pub fn file(&self) -> HubResult<std::fs::File> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| HubError::internal("cannot create the spool directory", e))?;
        self.check_free()?;
        tempfile::tempfile_in(&self.dir)
            .map_err(|e| HubError::internal("cannot create a spool file", e))
    }

    /// `reader`, failing with a disk-full error once the disk goes below its floor (checked
    /// every few MiB read).
    pub fn guard<R: Read>(&self, reader: R) -> impl Read + use<R> {
        GuardedRead {
            inner: reader,
            since_check: 0,
            dir: self.dir.clone(),
            min_free: self.min_free,
        }
    }

    /// Copies `body` into a new spool file, refusing more than `limit` bytes (413) and a disk
    /// below its floor (507). Returns the file, at its start, and the bytes written.
    pub async fn copy(
        &self,
        body: impl AsyncRead + Unpin,
        limit: u64,
        what: &str,
    ) -> HubResult<(std::fs::File, u64)> {
        let file = self.file()?;
        let handle = file
            .try_clone()
            .map_err(|e| HubError::internal("cannot open a spool file", e))?;
        let mut out =
            tokio::io::BufWriter::with_capacity(1 << 20, tokio::fs::File::from_std(handle));
        let mut body = body.take(limit.saturating_add(1));
        let mut buf = vec![0u8; 256 << 10];
        let (mut n, mut since_check) = (0u64, 0u64);
        loop {
            let read = body
                .read(&mut buf)
                .await
                .map_err(|e| HubError::invalid(format!("the {what} could not be read: {e}")))?;
            if read == 0 {
                break;
            }
            n += read as u64;
            if n > limit {
                return Err(HubError::too_large(format!(
                    "the {what} is larger than {limit} bytes"
                )));
            }
            since_check += read as u64;
            if since_check >= CHECK_EVERY {
                self.check_free()?;
                since_check = 0;
            }
            out.write_all(&buf[..read])
                .await
                .map_err(|e| HubError::internal("cannot write a spool file", e))?;
        }
        out.flush()
            .await
            .map_err(|e| HubError::internal("cannot write a spool file", e))?;
        Ok((file, n))
    }
}

struct GuardedRead<R> {
    inner: R,
    since_check: u64,
    dir: PathBuf,
    min_free: u64,
}

impl<R: Read> Read for GuardedRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.min_free > 0 && self.since_check >= CHECK_EVERY {
            self.since_check = 0;
            let s = rustix::fs::statvfs(&self.dir)?;
            if s.f_bavail.saturating_mul(s.f_frsize) < self.min_free {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    DiskFull,
                ));
            }
        }
        let n = self.inner.read(buf)?;
        self.since_check += n as u64;
        Ok(n)
    }
}
