//! Durable SQLite commits without holding the writer through the fsync.
//!
//! With `synchronous = FULL` a SQLite commit appends its pages to the write-ahead log and
//! fsyncs the log before it returns, all while holding the database's single writer: the next
//! transaction cannot begin until the disk has answered, and the writer sits idle for the
//! length of every fsync. The writer connection instead commits with `synchronous = NORMAL`
//! (the commit appends to the log and returns; the log is fsynced before each checkpoint and
//! the database file after it) and [`WalSync`] makes each commit durable *after* the writer
//! is released: a commit takes a ticket while it still holds the writer, and is answered only
//! once an fsync of the log that began after it has returned. One fsync serves every commit
//! made before it began, so while one is under way the next transactions run and queue for
//! the next one.
//!
//! Why this keeps the promise: the log is appended in commit order, and after a crash SQLite
//! recovers it up to the last commit whose frames are all present and checksummed; an fsync
//! of the log that began after a commit returned covers every frame of that commit and of all
//! before it. What changes is that other connections may read a commit in the moment between
//! its return and its fsync; a write that depends on what it read commits after it, in the
//! same log, so it can never be durable without it. An fsync that fails leaves the log's
//! state unknown (the kernel may have dropped the pages it could not write): every later
//! commit is then refused until the process restarts and SQLite recovers from what is on
//! disk.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Mutex;

/// The write-ahead log of one SQLite database and how far it is known to be durable.
#[derive(Debug)]
pub struct WalSync {
    /// The log (`<database>-wal`).
    path: PathBuf,
    /// Tickets handed out: one for every commit, in commit order.
    committed: AtomicU64,
    /// Held by whoever fsyncs; the state of the last fsync.
    state: Mutex<Synced>,
}

#[derive(Debug, Default)]
struct Synced {
    /// Every ticket up to this one is durable.
    through: u64,
    /// The open log and its inode (a log that was removed and created again is opened anew,
    /// and its directory fsynced, so that its name is durable too).
    log: Option<(File, u64)>,
    /// An fsync failed: nothing written since can be promised.
    failed: Option<String>,
}

/// A commit that other connections can already read, not yet known to be durable.
#[must_use = "a commit is durable only once `durable` returns Ok"]
#[derive(Debug)]
pub struct Pending {
    sync: Option<(Arc<WalSync>, u64)>,
}

impl Pending {
    /// A commit that was durable when it returned (Postgres, or SQLite with `FULL`).
    pub fn durable_now() -> Self {
        Pending { sync: None }
    }

    /// Waits until the commit is durable.
    pub async fn durable(self) -> Result<(), sqlx::Error> {
        match self.sync {
            None => Ok(()),
            Some((wal, ticket)) => wal.durable(ticket).await,
        }
    }

    /// The commit's place in its log's order (`None`: durable already).
    #[cfg(test)]
    pub(crate) fn ticket(&self) -> Option<u64> {
        self.sync.as_ref().map(|(_, t)| *t)
    }
}

impl WalSync {
    /// The log of the SQLite database file `database`.
    pub fn new(database: PathBuf) -> Arc<Self> {
        let mut path = database.into_os_string();
        path.push("-wal");
        Arc::new(WalSync {
            path: PathBuf::from(path),
            committed: AtomicU64::new(0),
            state: Mutex::new(Synced::default()),
        })
    }

    /// Records a commit that just returned; call it while still holding the writer, so that
    /// tickets follow the order of the log.
    pub fn committed(self: &Arc<Self>) -> Pending {
        let ticket = self.committed.fetch_add(1, Ordering::SeqCst) + 1;
        Pending {
            sync: Some((self.clone(), ticket)),
        }
    }

    /// Every commit up to this ticket is known to be durable.
    #[cfg(test)]
    pub(crate) async fn synced_through(&self) -> u64 {
        self.state.lock().await.through
    }

    /// Returns once `ticket` is durable: after an fsync of the log that began after it.
    async fn durable(self: &Arc<Self>, ticket: u64) -> Result<(), sqlx::Error> {
        let mut state = self.state.lock().await;
        if let Some(e) = &state.failed {
            return Err(unsynced(e));
        }
        if state.through >= ticket {
            return Ok(());
        }
        // Everyone committed so far: this fsync begins after all of them.
        let target = self.committed.load(Ordering::SeqCst);
        let wal = self.clone();
        let log = state.log.take();
        let synced = tokio::task::spawn_blocking(move || wal.fsync(log))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r);
        match synced {
            Ok(log) => {
                state.log = Some(log);
                state.through = target;
                Ok(())
            }
            Err(e) => {
                let e = e.to_string();
                tracing::error!(
                    error = %e,
                    log = %self.path.display(),
                    "the write-ahead log could not be fsynced: every later commit is refused \
                     until the process restarts"
                );
                state.failed = Some(e.clone());
                Err(unsynced(&e))
            }
        }
    }

    /// fsyncs the log (opened again if it is not the one open), and its directory when the
    /// log is new to this process.
    fn fsync(&self, log: Option<(File, u64)>) -> std::io::Result<(File, u64)> {
        let current = std::fs::metadata(&self.path)?.ino();
        let (file, inode) = match log {
            Some((file, inode)) if inode == current => (file, inode),
            _ => {
                let file = File::open(&self.path)?;
                let inode = file.metadata()?.ino();
                if let Some(dir) = self.path.parent() {
                    let dir = if dir.as_os_str().is_empty() {
                        std::path::Path::new(".")
                    } else {
                        dir
                    };
                    File::open(dir)?.sync_all()?;
                }
                (file, inode)
            }
        };
        file.sync_data()?;
        Ok((file, inode))
    }
}

fn unsynced(e: &str) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::other(format!(
        "the commit could not be made durable (the write-ahead log's fsync failed: {e}); \
         restart the service"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ticket is durable only after an fsync that began after it; one fsync covers every
    /// ticket handed out before it began.
    #[tokio::test]
    async fn one_fsync_covers_every_earlier_commit() {
        let dir = tempfile_dir("wal-sync");
        let db = dir.join("x.db");
        std::fs::write(dir.join("x.db-wal"), b"log").expect("log");
        let wal = WalSync::new(db);
        let first = wal.committed();
        let second = wal.committed();
        assert_eq!((first.ticket(), second.ticket()), (Some(1), Some(2)));
        assert_eq!(wal.synced_through().await, 0);
        second.durable().await.expect("durable");
        assert_eq!(wal.synced_through().await, 2);
        // Covered by the fsync the second one made.
        first.durable().await.expect("durable");
        let third = wal.committed();
        assert_eq!(wal.synced_through().await, 2);
        third.durable().await.expect("durable");
        assert_eq!(wal.synced_through().await, 3);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A log that cannot be fsynced fails its commit and every later one.
    #[tokio::test]
    async fn a_failed_fsync_refuses_every_later_commit() {
        let dir = tempfile_dir("wal-fail");
        let wal = WalSync::new(dir.join("missing.db"));
        let e = wal.committed().durable().await.expect_err("no log");
        assert!(e.to_string().contains("could not be made durable"), "{e}");
        std::fs::write(dir.join("missing.db-wal"), b"log").expect("log");
        let e = wal
            .committed()
            .durable()
            .await
            .expect_err("refused after a failure");
        assert!(e.to_string().contains("restart the service"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// The writer of a durable SQLite pool commits without an fsync (`NORMAL`, readers keep
    /// `FULL`) and is free again at once; the commit is answered durable only after the log's
    /// fsync.
    #[tokio::test]
    async fn a_commit_frees_the_writer_before_its_fsync() {
        let (pool, dir) = crate::sql::tests::table_t("wal-pool", 2, "n INTEGER").await;
        let wal = pool
            .wal()
            .expect("a durable SQLite pool fsyncs its log")
            .clone();
        let mut w = pool.write().await.expect("write");
        sqlx::query("INSERT INTO t (n) VALUES (0)")
            .execute(w.conn())
            .await
            .expect("insert");
        let pending = w.commit_visible().await.expect("commit");
        let ticket = pending.ticket().expect("a SQLite commit has a ticket");
        assert!(wal.synced_through().await < ticket);
        let mut next = tokio::time::timeout(std::time::Duration::from_secs(5), pool.write())
            .await
            .expect("the writer is free before the commit is durable")
            .expect("write");
        let setting = |row: Option<i64>| row.expect("synchronous");
        let writer: Option<i64> = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_optional(next.conn())
            .await
            .expect("pragma");
        let reader: Option<i64> = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_optional(pool.pool())
            .await
            .expect("pragma");
        assert_eq!((setting(writer), setting(reader)), (1, 2), "NORMAL, FULL");
        sqlx::query("INSERT INTO t (n) VALUES (1)")
            .execute(next.conn())
            .await
            .expect("insert");
        next.commit().await.expect("commit");
        assert!(
            wal.synced_through().await > ticket,
            "commit() waits for the fsync"
        );
        pending.durable().await.expect("covered by the later fsync");
        pool.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    fn tempfile_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("unicas-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    }
}
