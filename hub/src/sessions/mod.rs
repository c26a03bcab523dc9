//! Sessions (seed 000 §4.8, §8): a notebook opened in a running marimo server, reached through
//! the hub's proxy at `/s/{sid}/`, whose changes are saved as revisions of the workspace.
//!
//! The record is in the hub's database ([`crate::store::sessions`]); the sandbox belongs to
//! the hub process that started it, which keeps its liveness in memory ([`Sessions`]) and is
//! the only one that saves from it or stops it; other processes forward to it. `lifecycle`
//! starts, saves, tears down, sweeps and recovers; `claims` holds the persistent editor of a
//! notebook; `capture` reads back what a session changed.

pub mod capture;
pub mod claims;
pub mod config;
pub mod lifecycle;
pub mod save;
pub mod sweep;
pub mod view;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::ids::{NotebookId, ProjectId, SessionId};
use crate::sandbox::runtime::Runtimes;
use crate::sandbox::{Sandbox, SandboxProvider, Workspace};
use crate::store::sessions::SessionMode;
use capture::Known;

/// The sessions whose sandboxes this hub process owns.
pub struct Sessions {
    /// This process among the hub's processes (recorded as a session's owner).
    pub instance: String,
    internal_url: OnceLock<String>,
    default_url: String,
    pub provider: Arc<dyn SandboxProvider>,
    pub runtimes: Runtimes,
    live: Mutex<HashMap<SessionId, Arc<LiveSession>>>,
}

/// A session whose sandbox this process owns.
pub struct LiveSession {
    pub id: SessionId,
    pub project: ProjectId,
    pub notebook: NotebookId,
    pub user: String,
    pub mode: SessionMode,
    /// Whether its changes are saved (edit sessions of notebooks that are not synced from
    /// Git).
    pub persist: bool,
    /// The notebook file marimo opened.
    pub entry: String,
    pub started_ms: i64,
    sandbox: OnceLock<Sandbox>,
    workspace: Mutex<Option<Workspace>>,
    /// The last heartbeat, proxied request or client WebSocket message.
    last_active_ms: AtomicI64,
    /// The last sign of life, including open WebSockets.
    last_seen_ms: AtomicI64,
    open_sockets: AtomicUsize,
    /// Set once its teardown began: no periodic save runs after.
    ending: AtomicBool,
    /// Why it ends (the first reason given; a retried teardown keeps it).
    ended_by: Mutex<Option<lifecycle::End>>,
    /// Held by the one teardown under way; `true` once one finished.
    pub(crate) teardown: tokio::sync::Mutex<bool>,
    /// Saves of this session run one at a time; `Known` is what the last one read.
    save: tokio::sync::Mutex<Known>,
}

impl LiveSession {
    pub fn sandbox(&self) -> Option<&Sandbox> {
        self.sandbox.get()
    }

    /// A request or message from the user.
    pub fn touch(&self, now_ms: i64) {
        self.last_active_ms.fetch_max(now_ms, Ordering::Relaxed);
        self.last_seen_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    pub fn last_active_ms(&self) -> i64 {
        self.last_active_ms.load(Ordering::Relaxed)
    }

    /// The last sign of life: now, while a WebSocket is open.
    pub fn last_seen_ms(&self, now_ms: i64) -> i64 {
        if self.open_sockets.load(Ordering::Relaxed) > 0 {
            now_ms
        } else {
            self.last_seen_ms.load(Ordering::Relaxed)
        }
    }

    /// Whether a client holds a WebSocket to it now (through the proxy).
    pub fn has_open_sockets(&self) -> bool {
        self.open_sockets.load(Ordering::Relaxed) > 0
    }

    /// Counts an open WebSocket for as long as the guard lives.
    pub fn socket_opened(self: &Arc<Self>) -> SocketGuard {
        self.open_sockets.fetch_add(1, Ordering::Relaxed);
        SocketGuard(self.clone())
    }

    pub fn is_ending(&self) -> bool {
        self.ending.load(Ordering::Relaxed)
    }

    /// Marks it ending for `why`, unless it already was; the reason that holds.
    pub fn begin_end(&self, why: lifecycle::End) -> lifecycle::End {
        self.ending.store(true, Ordering::Relaxed);
        *self
            .ended_by
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(why)
    }

    fn workspace(&self) -> std::sync::MutexGuard<'_, Option<Workspace>> {
        self.workspace.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_workspace(&self, ws: Workspace) {
        *self.workspace() = Some(ws);
    }

    /// Lets go of the workspace (and the provider's hold on it).
    pub fn take_workspace(&self) -> Option<Workspace> {
        self.workspace().take()
    }

    /// The workspace's files and marimo's `HOME`.
    pub fn dirs(&self) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
        self.workspace()
            .as_ref()
            .map(|w| (w.files.clone(), w.home.clone()))
    }
}

/// Decrements the open WebSocket count when dropped.
pub struct SocketGuard(Arc<LiveSession>);

impl Drop for SocketGuard {
    fn drop(&mut self) {
        self.0.open_sockets.fetch_sub(1, Ordering::Relaxed);
        self.0
            .last_seen_ms
            .fetch_max(crate::ids::now_ms(), Ordering::Relaxed);
    }
}

/// What a new [`LiveSession`] is made from.
pub struct NewLive {
    pub id: SessionId,
    pub project: ProjectId,
    pub notebook: NotebookId,
    pub user: String,
    pub mode: SessionMode,
    pub persist: bool,
    pub entry: String,
    pub now_ms: i64,
}

impl Sessions {
    pub fn new(
        provider: Arc<dyn SandboxProvider>,
        runtimes: Runtimes,
        internal_url: Option<String>,
        default_url: String,
    ) -> Self {
        let url = OnceLock::new();
        if let Some(u) = internal_url {
            let _ = url.set(u);
        }
        Sessions {
            instance: format!("hub-{}", ulid::Ulid::generate()),
            internal_url: url,
            default_url,
            provider,
            runtimes,
            live: Mutex::new(HashMap::new()),
        }
    }

    /// Where other hub processes reach this one.
    pub fn internal_url(&self) -> &str {
        self.internal_url
            .get()
            .map_or(&self.default_url, String::as_str)
    }

    /// Sets the internal URL from the address the hub listens on, unless one was configured.
    pub fn listening_on(&self, addr: std::net::SocketAddr) {
        let host = if addr.ip().is_unspecified() {
            std::net::IpAddr::from([127, 0, 0, 1])
        } else {
            addr.ip()
        };
        let _ = self.internal_url.set(format!(
            "http://{}",
            std::net::SocketAddr::new(host, addr.port())
        ));
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Arc<LiveSession>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, id: &SessionId) -> Option<Arc<LiveSession>> {
        self.map().get(id).cloned()
    }

    pub fn all(&self) -> Vec<Arc<LiveSession>> {
        self.map().values().cloned().collect()
    }

    pub fn insert(&self, n: NewLive) -> Arc<LiveSession> {
        let live = Arc::new(LiveSession {
            id: n.id.clone(),
            project: n.project,
            notebook: n.notebook,
            user: n.user,
            mode: n.mode,
            persist: n.persist,
            entry: n.entry,
            started_ms: n.now_ms,
            sandbox: OnceLock::new(),
            workspace: Mutex::new(None),
            last_active_ms: AtomicI64::new(n.now_ms),
            last_seen_ms: AtomicI64::new(n.now_ms),
            open_sockets: AtomicUsize::new(0),
            ending: AtomicBool::new(false),
            ended_by: Mutex::new(None),
            teardown: tokio::sync::Mutex::new(false),
            save: tokio::sync::Mutex::new(Known::new()),
        });
        self.map().insert(n.id, live.clone());
        live
    }

    pub fn remove(&self, id: &SessionId) -> Option<Arc<LiveSession>> {
        self.map().remove(id)
    }
}
