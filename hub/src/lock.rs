//! Holding a workspace (or the catalog) against every other writer, in this process and in
//! others, for a bounded wait; and the one way writers use it: hold, settle what a writer
//! that is gone left under the key, do the work, release ([`Hub::with_notebook_lock`]).
//!
//! Writers of one process first queue on an in-process mutex per key, so the database sees at
//! most one waiter per key and process; then the key is taken in the database
//! ([`crate::store::locks`]). A writer that cannot take the key within the wait gets 503
//! `workspace_busy` and must write nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use axum::http::StatusCode;

use crate::Hub;
use crate::error::{HubError, HubResult};
use crate::ids::NotebookId;
use crate::store::locks::{HeldLock, LockBackend, LockError};

/// A lock key: the catalog, or one notebook's workspace.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockKey(String);

impl LockKey {
    pub fn catalog() -> LockKey {
        LockKey("catalog".into())
    }

    pub fn notebook(id: &NotebookId) -> LockKey {
        LockKey(format!("nb:{id}"))
    }

    /// A key as the outbox stored it.
    pub fn stored(s: String) -> LockKey {
        LockKey(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// What to call it in a message: the notebook id, or `catalog`.
    fn name(&self) -> &str {
        self.0.split_once(':').map_or(&self.0, |(_, k)| k)
    }
}

/// The key could not be taken within the wait.
#[derive(Debug, Clone, Copy)]
pub struct Busy {
    pub waited: Duration,
}

pub struct Locks {
    backend: LockBackend,
    local: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

/// A held key. Dropping it releases it; [`Guard::release`] does so promptly.
pub struct Guard {
    held: Option<HeldLock>,
    _local: tokio::sync::OwnedMutexGuard<()>,
}

impl Guard {
    pub async fn release(mut self) {
        if let Some(h) = self.held.take() {
            h.release().await;
        }
    }
}

impl Locks {
    pub fn new(backend: LockBackend) -> Locks {
        Locks {
            backend,
            local: Mutex::new(HashMap::new()),
        }
    }

    fn local(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.local.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = map.get(key).and_then(Weak::upgrade) {
            return m;
        }
        map.retain(|_, w| w.strong_count() > 0);
        let m = Arc::new(tokio::sync::Mutex::new(()));
        map.insert(key.to_string(), Arc::downgrade(&m));
        m
    }

    /// Takes `key`, waiting at most `wait`.
    pub async fn acquire(
        &self,
        key: &LockKey,
        wait: Duration,
    ) -> Result<Result<Guard, Busy>, LockError> {
        let start = Instant::now();
        let local = match tokio::time::timeout(wait, self.local(key.as_str()).lock_owned()).await {
            Ok(g) => g,
            Err(_) => return Ok(Err(Busy { waited: wait })),
        };
        let left = wait.saturating_sub(start.elapsed());
        match self.backend.take(key.as_str(), left).await? {
            Some(held) => Ok(Ok(Guard {
                held: Some(held),
                _local: local,
            })),
            None => Ok(Err(Busy {
                waited: start.elapsed(),
            })),
        }
    }

    pub async fn close(&self) {
        self.backend.close().await;
    }
}

impl Hub {
    /// Takes a lock key within the configured wait, or answers 503 `workspace_busy`.
    pub(crate) async fn lock(&self, key: &LockKey) -> HubResult<Guard> {
        let wait = Duration::from_millis(self.config.workspace_wait_ms);
        match self
            .locks
            .acquire(key, wait)
            .await
            .map_err(|e| HubError::internal("cannot take the workspace lock", e))?
        {
            Ok(g) => Ok(g),
            Err(busy) => {
                let reason = format!(
                    "another writer held {} for longer than {:.1} seconds; nothing was written, so the same request can be retried",
                    key.name(),
                    busy.waited.as_secs_f64()
                );
                Err(
                    HubError::new(StatusCode::SERVICE_UNAVAILABLE, "workspace_busy", &reason)
                        .with("name", key.name())
                        .with("reason", reason)
                        .with("timeout_seconds", wait.as_secs_f64()),
                )
            }
        }
    }

    /// Holds `key`, settles what a writer that is gone left under it, runs `work`, releases.
    pub(crate) async fn with_lock<T>(
        &self,
        key: &LockKey,
        work: impl AsyncFnOnce() -> HubResult<T>,
    ) -> HubResult<T> {
        let guard = self.lock(key).await?;
        let result = async {
            self.settle(key).await?;
            work().await
        }
        .await;
        guard.release().await;
        result
    }

    /// [`Self::with_lock`] on a notebook's workspace.
    pub(crate) async fn with_notebook_lock<T>(
        &self,
        notebook: &NotebookId,
        work: impl AsyncFnOnce() -> HubResult<T>,
    ) -> HubResult<T> {
        self.with_lock(&LockKey::notebook(notebook), work).await
    }
}
