//! Group commit: many short write operations share one durable commit.
//!
//! A [`GroupCommit`] serializes the operations of one key (a database on SQLite, a partition
//! on Postgres) as a mutex would, but keeps the transaction open between them: each operation
//! runs inside a savepoint of the key's open batch (the first one of a batch needs none), and
//! when it is done it is *queued* for the batch's commit rather than committed alone. The last
//! operation in line (nobody waiting for the key), or the one that fills the batch, commits
//! it, and every operation of the batch is answered with the result of that one commit. So an
//! answer still means committed and durable; what changes is that one fsync serves everyone
//! who arrived while the previous one was under way.
//!
//! A queued operation's savepoint is released by the statement that opens the next one's (or
//! by the commit), so an operation of a batch costs one round trip for its savepoint, not two.
//!
//! An operation that fails (or is dropped) before it is queued is rolled back to its savepoint
//! alone (the first one of a batch, with the batch, which holds nothing else); the others of
//! its batch commit. A failed commit fails every operation of its batch and none of them is
//! applied. A queued operation whose batch nobody else commits (everyone behind it gave up
//! waiting) commits it itself after [`FLUSH_AFTER`]; an operation dropped while others are
//! queued in its batch and nobody waits commits the others at once.
//!
//! An operation held with [`GroupCommit::hold_deferred`] opens its savepoint only when it asks
//! ([`Operation::protect`]): what it runs before that cannot be rolled back alone, so if it
//! fails or is dropped after running a statement, its whole batch fails (everyone queued in it
//! is answered with the error and nothing of it is applied). That is one round trip fewer for
//! an operation whose statements fail only when the database does (a lost connection), not
//! because of what it was asked.
//!
//! A caller may know more than who is waiting: work it has queued for another task that will
//! hold the key in a moment. [`Operation::commit_followed`] leaves the batch open for that one
//! as for an operation already waiting; [`GroupCommit::flush`] commits it if the follower does
//! not come after all.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sqlx::{Any, Transaction};
use tokio::sync::{Mutex, OwnedMutexGuard, oneshot};

use crate::sql::WriteTx;

/// How many operations one batch holds at most.
pub const MAX_BATCH: usize = 256;
/// How long a batch stays open for more operations at most.
pub const MAX_BATCH_AGE: Duration = Duration::from_millis(20);
/// How long a queued operation waits for someone else to commit its batch.
pub const FLUSH_AFTER: Duration = Duration::from_millis(50);

/// What one commit did: how many operations it held and how long the commit took.
#[derive(Debug, Clone, Copy)]
pub struct CommitStats {
    pub operations: usize,
    pub duration: Duration,
    pub ok: bool,
}

/// What a group commit tells its observer (for metrics).
#[derive(Debug, Clone, Copy)]
pub enum CommitEvent {
    /// An operation waited this long for its key.
    Held { waited: Duration },
    /// A new batch waited this long for its transaction (a database connection and, on
    /// Postgres, the partition's advisory lock).
    Began { waited: Duration },
    /// An operation held its key this long: from its turn (savepoint or transaction opened)
    /// until it was queued for its batch's commit or given up, the commit not included. Its
    /// sum over a key's operations is how much of the time that key's work ran one operation
    /// after another.
    Released { held: Duration },
    /// A batch was committed (or failed to be).
    Committed(CommitStats),
}

/// Told of every [`CommitEvent`].
pub type CommitObserver = Arc<dyn Fn(CommitEvent) + Send + Sync>;

type Answer = Result<(), Arc<str>>;

struct Batch {
    tx: WriteTx,
    /// Unique in the process (see [`Operation::batch_id`]), increasing in the order batches open.
    seq: u64,
    opened: Instant,
    /// The queued operations, answered by the commit.
    waiters: Vec<oneshot::Sender<Answer>>,
    /// An operation was abandoned inside its savepoint: roll it back before anything else.
    abandoned: bool,
    /// The last queued operation's savepoint is still open: the next operation releases it in
    /// the same round trip as it opens its own, and the commit releases it with the rest.
    unreleased: bool,
    /// Told whether the commit succeeded, before the key is released (see
    /// [`Operation::commit_then`]).
    settled: Vec<Settled>,
}

/// Told whether a batch's commit succeeded (`true`) or failed (`false`).
pub type Settled = Box<dyn FnOnce(bool) + Send>;

#[derive(Default)]
struct Slot {
    open: Option<Batch>,
}

/// The number of the next batch opened in this process, by any key.
static NEXT_BATCH: AtomicU64 = AtomicU64::new(0);

struct Shared {
    slot: Arc<Mutex<Slot>>,
    /// Operations waiting for the key: while any are, a finished operation leaves the batch
    /// open for them.
    waiting: AtomicUsize,
    observer: Option<CommitObserver>,
    /// [`FLUSH_AFTER`], or another wait.
    flush_after: Duration,
}

impl Shared {
    /// The commit of the open batch under `guard` (see [`flush`]), to run in a task of its own.
    fn flushing(&self, guard: OwnedMutexGuard<Slot>) -> impl Future<Output = ()> + Send + 'static {
        let observer = self.observer.clone();
        async move { flush(guard, observer.as_ref()).await }
    }
}

/// The group commit of one key. Cheap to clone.
#[derive(Clone)]
pub struct GroupCommit {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit")
            .field("waiting", &self.shared.waiting.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Counts an operation as waiting for the key until it holds it (or gives up).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        Waiting(n)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn failed(e: &sqlx::Error) -> Arc<str> {
    Arc::from(e.to_string())
}

fn to_error(message: Arc<str>) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::other(format!(
        "the batch commit failed: {message}"
    )))
}

impl GroupCommit {
    pub fn new(observer: Option<CommitObserver>) -> Self {
        GroupCommit::with_flush_after(observer, FLUSH_AFTER)
    }

    /// A group commit whose queued operations wait `flush_after` (rather than
    /// [`FLUSH_AFTER`]) for someone else to commit their batch.
    pub fn with_flush_after(observer: Option<CommitObserver>, flush_after: Duration) -> Self {
        GroupCommit {
            shared: Arc::new(Shared {
                slot: Arc::new(Mutex::new(Slot::default())),
                waiting: AtomicUsize::new(0),
                observer,
                flush_after,
            }),
        }
    }

    /// Commits the open batch now if operations are queued in it (one left open for a
    /// follower that did not come); answers when that commit is done.
    pub async fn flush(&self) {
        let guard = self.shared.slot.clone().lock_owned().await;
        if guard.open.as_ref().is_some_and(|b| !b.waiters.is_empty()) {
            // In a task of its own, as every commit: done even if the caller goes away.
            let _ = tokio::spawn(self.shared.flushing(guard)).await;
        }
    }

    /// Nobody holds, waits for or has queued anything in this key (a map of keys may forget
    /// it).
    pub fn is_idle(&self) -> bool {
        Arc::strong_count(&self.shared) == 1
            && self
                .shared
                .slot
                .try_lock()
                .is_ok_and(|slot| slot.open.is_none())
    }

    /// Holds the key for one operation, inside a savepoint of the open batch (or as the first
    /// operation of a new one); `begin` opens a
    /// new batch's transaction (and takes whatever lock it needs inside it) when none is open.
    pub async fn hold<F, Fut>(&self, begin: F) -> Result<Operation, sqlx::Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<WriteTx, sqlx::Error>>,
    {
        self.hold_with(begin, false).await
    }

    /// As [`GroupCommit::hold`], but an operation queued behind others opens no savepoint
    /// until [`Operation::protect`]: until then, if it fails or is dropped after running a
    /// statement, its whole batch fails with it.
    pub async fn hold_deferred<F, Fut>(&self, begin: F) -> Result<Operation, sqlx::Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<WriteTx, sqlx::Error>>,
    {
        self.hold_with(begin, true).await
    }

    async fn hold_with<F, Fut>(&self, begin: F, deferred: bool) -> Result<Operation, sqlx::Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<WriteTx, sqlx::Error>>,
    {
        let started = Instant::now();
        let mut guard = {
            let _waiting = Waiting::new(&self.shared.waiting);
            self.shared.slot.clone().lock_owned().await
        };
        let observe = |event| {
            if let Some(o) = &self.shared.observer {
                o(event);
            }
        };
        let turn = Instant::now();
        observe(CommitEvent::Held {
            waited: turn - started,
        });
        if guard.open.as_ref().is_some_and(|b| b.abandoned) {
            let batch = guard.open.as_mut().map(|b| &mut b.tx);
            let undone = match batch {
                Some(tx) => undo_savepoint(tx).await,
                None => Ok(()),
            };
            match undone {
                Ok(()) => {
                    if let Some(b) = guard.open.as_mut() {
                        b.abandoned = false;
                    }
                }
                Err(e) => fail_batch(&mut guard, &e),
            }
        }
        // The first operation of a batch needs no savepoint: if it fails, the batch holds
        // nothing else and is dropped whole.
        let first = guard.open.is_none();
        if first {
            let beginning = Instant::now();
            let tx = begin().await?;
            observe(CommitEvent::Began {
                waited: beginning.elapsed(),
            });
            let seq = NEXT_BATCH.fetch_add(1, Ordering::Relaxed);
            guard.open = Some(Batch {
                tx,
                seq,
                opened: Instant::now(),
                waiters: Vec::new(),
                abandoned: false,
                unreleased: false,
                settled: Vec::new(),
            });
        }
        let mut op = Operation {
            guard: Some(guard),
            shared: self.shared.clone(),
            undo: if first {
                Undo::Batch
            } else {
                Undo::Unprotected { ran: false }
            },
            turn,
        };
        if !deferred {
            op.protect().await?;
        }
        Ok(op)
    }
}

/// How an operation that fails is undone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Undo {
    /// With its batch, which holds nothing else (the first operation of a batch).
    Batch,
    /// By rolling back to its savepoint.
    Savepoint,
    /// It has no savepoint (yet): if it ran a statement, only by failing its whole batch.
    Unprotected { ran: bool },
}

/// Rolls back the abandoned operation's savepoint.
async fn undo_savepoint(tx: &mut WriteTx) -> Result<(), sqlx::Error> {
    sqlx::raw_sql("ROLLBACK TO SAVEPOINT unicas_op; RELEASE SAVEPOINT unicas_op")
        .execute(tx.conn())
        .await?;
    Ok(())
}

/// Drops the open batch (its transaction rolls back) and fails everyone queued in it.
fn fail_batch(slot: &mut Slot, e: &sqlx::Error) {
    if let Some(batch) = slot.open.take() {
        tracing::warn!(error = %e, operations = batch.waiters.len(), "a write batch failed");
        for settled in batch.settled {
            settled(false);
        }
        let message = failed(e);
        for w in batch.waiters {
            let _ = w.send(Err(message.clone()));
        }
    }
}

/// Commits the open batch, if any, and answers everyone queued in it. The key is released
/// once the commit is made, before it is known to be durable (see [`crate::wal_sync`]): the
/// next batch begins while this one waits for its fsync.
async fn flush(mut slot: OwnedMutexGuard<Slot>, observer: Option<&CommitObserver>) {
    let Some(mut batch) = slot.open.take() else {
        return;
    };
    let started = Instant::now();
    let committed = async {
        if batch.abandoned {
            undo_savepoint(&mut batch.tx).await?;
        }
        batch.tx.commit_visible().await
    }
    .await;
    // Told before the key is released: the next batch finds what this one settled.
    for settled in std::mem::take(&mut batch.settled) {
        settled(committed.is_ok());
    }
    drop(slot);
    let result = match committed {
        Ok(pending) => pending.durable().await,
        Err(e) => Err(e),
    };
    let stats = CommitStats {
        operations: batch.waiters.len(),
        duration: started.elapsed(),
        ok: result.is_ok(),
    };
    let answer: Answer = result.map_err(|e| {
        tracing::warn!(error = %e, operations = stats.operations, "a batch commit failed");
        failed(&e)
    });
    // Observed before anyone is answered: whoever is answered finds the commit counted.
    if let Some(observe) = observer {
        observe(CommitEvent::Committed(stats));
    }
    for w in batch.waiters {
        let _ = w.send(answer.clone());
    }
}

/// One operation holding its key, inside its savepoint (or first in its batch).
/// [`Operation::commit`] queues it for the batch's commit and answers when that commit is
/// durable; dropping it rolls it back.
pub struct Operation {
    guard: Option<OwnedMutexGuard<Slot>>,
    shared: Arc<Shared>,
    /// How it is undone if it fails before it is queued.
    undo: Undo,
    /// When it began to hold the key.
    turn: Instant,
}

impl Operation {
    /// Opens the operation's savepoint if it has none (see [`GroupCommit::hold_deferred`]):
    /// from now on it fails alone. What it ran before stays with its batch whatever it does
    /// next.
    pub async fn protect(&mut self) -> Result<(), sqlx::Error> {
        if !matches!(self.undo, Undo::Unprotected { .. }) {
            return Ok(());
        }
        let unreleased = self
            .batch()
            .map(|b| std::mem::take(&mut b.unreleased))
            .unwrap_or(false);
        // One round trip: the queued operation before this one is made part of the batch as
        // this one's savepoint opens.
        let sql = if unreleased {
            "RELEASE SAVEPOINT unicas_op; SAVEPOINT unicas_op"
        } else {
            "SAVEPOINT unicas_op"
        };
        // Should it fail, the operation is left without a savepoint that it ran something
        // in: dropped, it fails its batch (rolling back to a savepoint that may be the one
        // before would undo another operation).
        sqlx::raw_sql(sql).execute(&mut **self.tx()).await?;
        self.undo = Undo::Savepoint;
        Ok(())
    }

    /// The transaction the operation's statements run in.
    pub fn tx(&mut self) -> &mut Transaction<'static, Any> {
        if let Undo::Unprotected { ran } = &mut self.undo {
            *ran = true;
        }
        match self.batch() {
            Some(batch) => &mut batch.tx,
            // `hold` opens the batch and only `commit` and `drop` take the guard.
            None => unreachable!("an operation holds an open batch"),
        }
    }

    /// The batch (transaction) the operation runs in: a number no other batch of this process
    /// has had, so that state an operation derives from its writes can be told apart from
    /// what another batch (which may yet fail to commit) wrote.
    pub fn batch_id(&self) -> Option<u64> {
        self.guard
            .as_ref()
            .and_then(|g| g.open.as_ref())
            .map(|b| b.seq)
    }

    fn batch(&mut self) -> Option<&mut Batch> {
        self.guard.as_mut().and_then(|g| g.open.as_mut())
    }

    /// Tells the observer how long the operation held the key, as it gives the key up.
    fn released(&self) {
        if let Some(o) = &self.shared.observer {
            o(CommitEvent::Released {
                held: self.turn.elapsed(),
            });
        }
    }

    /// Queues the operation for its batch's commit and waits until that commit is done:
    /// `Ok` means durable.
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.queue(false, None).await
    }

    /// As [`Operation::commit`] (or [`Operation::commit_followed`]), and `settled`, if given,
    /// is told whether the batch's commit succeeded as soon as that is known, before the next
    /// batch of the key begins. An operation dropped before it is queued is never told.
    pub async fn commit_then(
        self,
        followed: bool,
        settled: Option<Settled>,
    ) -> Result<(), sqlx::Error> {
        self.queue(followed, settled).await
    }

    /// As [`Operation::commit`], when the caller knows another operation of this key is on its
    /// way (work it queued for another task): the batch stays open for that one, as it does
    /// for an operation already waiting. If it does not come, [`GroupCommit::flush`] or
    /// [`FLUSH_AFTER`] commits the batch.
    pub async fn commit_followed(self) -> Result<(), sqlx::Error> {
        self.queue(true, None).await
    }

    async fn queue(mut self, followed: bool, settled: Option<Settled>) -> Result<(), sqlx::Error> {
        let Some(mut guard) = self.guard.take() else {
            return Err(to_error(Arc::from("the operation holds no batch")));
        };
        let (sender, mut answer) = oneshot::channel();
        let Some(batch) = guard.open.as_mut() else {
            return Err(to_error(Arc::from("the operation holds no batch")));
        };
        // Its savepoint stays open until the next operation or the commit releases it: one
        // round trip fewer for every operation but the first of a batch. (One without a
        // savepoint leaves the one before it open.)
        if self.undo == Undo::Savepoint {
            batch.unreleased = true;
        }
        batch.waiters.push(sender);
        batch.settled.extend(settled);
        let seq = batch.seq;
        let full = batch.waiters.len() >= MAX_BATCH || batch.opened.elapsed() >= MAX_BATCH_AGE;
        self.released();
        let shared = self.shared.clone();
        if full || (!followed && shared.waiting.load(Ordering::SeqCst) == 0) {
            // Commit in a task of its own: the batch is committed and everyone in it answered
            // even if this request goes away meanwhile.
            let _ = tokio::spawn(shared.flushing(guard)).await;
        } else {
            drop(guard);
        }
        loop {
            match tokio::time::timeout(shared.flush_after, &mut answer).await {
                Ok(Ok(result)) => return result.map_err(to_error),
                Ok(Err(_)) => return Err(to_error(Arc::from("the batch was dropped"))),
                Err(_) => {
                    // Nobody behind us committed our batch: commit whatever is open.
                    let shared = shared.clone();
                    let _ = tokio::spawn(async move {
                        let guard = shared.slot.clone().lock_owned().await;
                        if guard.open.as_ref().is_some_and(|b| b.seq <= seq) {
                            shared.flushing(guard).await;
                        }
                    })
                    .await;
                }
            }
        }
    }
}

impl Drop for Operation {
    fn drop(&mut self) {
        let Some(mut guard) = self.guard.take() else {
            return;
        };
        self.released();
        let Some(batch) = guard.open.as_mut() else {
            return;
        };
        if batch.waiters.is_empty() {
            // Nobody else is in the batch: drop it whole (its transaction rolls back).
            guard.open = None;
            return;
        }
        match self.undo {
            // Others are queued in it: the next holder (or the commit) rolls this one back.
            Undo::Batch | Undo::Savepoint => batch.abandoned = true,
            Undo::Unprotected { ran: false } => {}
            Undo::Unprotected { ran: true } => {
                // What it ran cannot be told apart from what the others did.
                let e = to_error(Arc::from(
                    "an operation of the batch failed where it could not be undone alone",
                ));
                fail_batch(&mut guard, &e);
                return;
            }
        }
        // Nobody waits to hold the key next: commit the others now rather than after
        // [`FLUSH_AFTER`].
        if self.shared.waiting.load(Ordering::SeqCst) == 0
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(self.shared.flushing(guard));
        }
    }
}
