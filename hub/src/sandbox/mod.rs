//! Sandboxes: where a session's marimo server runs. [`SandboxProvider`] is the port (prepare a
//! workspace, start, probe, stop, discard, list what is left over); [`local::LocalProvider`]
//! runs marimo as a process group of the hub's host, in a directory of its own under the data
//! directory. The runtime it runs is prepared by [`runtime::Runtimes`].
//!
//! A sandbox is reached only through the hub's proxy (`crate::proxy`): it listens on a
//! loopback port and requires a per-sandbox secret that only the hub knows.

pub mod local;
pub mod runtime;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::ids::SessionId;
use crate::store::sessions::SessionMode;
use runtime::Runtime;

/// Why a sandbox could not be started or reached.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SandboxError {
    /// The runtime is missing or broken (`runtime_unavailable`).
    #[error("{0}")]
    Runtime(String),
    /// It did not start or answer.
    #[error("{0}")]
    Start(String),
    #[error("{0}")]
    Io(String),
}

/// A directory a sandbox will run in, held for this process.
#[derive(Debug)]
pub struct Workspace {
    pub session: SessionId,
    /// Where the notebook's files go; what the session changes is read back from here.
    pub files: PathBuf,
    /// marimo's `HOME`.
    pub home: PathBuf,
    /// Provider state that must live as long as the sandbox (the local provider's lock).
    pub hold: Box<dyn std::any::Any + Send + Sync>,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct StartSpec {
    pub session: SessionId,
    pub mode: SessionMode,
    /// The notebook file, relative to the workspace.
    pub entry: String,
    /// The path prefix marimo serves under (`/s/{sid}`), so its pages link through the proxy.
    pub base_url: String,
    pub runtime: Arc<Runtime>,
}

/// A running sandbox.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// `sb-…`, as the session record shows it.
    pub id: String,
    pub session: SessionId,
    /// Where it listens (loopback).
    pub addr: SocketAddr,
    /// What the proxy sends as `Authorization: Bearer` (never leaves the hub).
    pub secret: String,
    /// The provider's handle on its processes (the local provider: the process group).
    pub pid: i32,
}

/// A sandbox left by a hub process that is gone, adopted by this one.
#[derive(Debug)]
pub struct Orphan {
    pub session: SessionId,
    pub files: PathBuf,
    pub home: PathBuf,
    pub pid: Option<i32>,
    pub hold: Box<dyn std::any::Any + Send + Sync>,
}

/// Whether a sandbox still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Running,
    Exited,
}

/// Where sessions run. Every method is safe to call again after a failure.
pub trait SandboxProvider: Send + Sync {
    /// Creates and holds an empty workspace for `session`.
    fn workspace(&self, session: &SessionId) -> BoxFuture<'_, Result<Workspace, SandboxError>>;

    /// Starts marimo on the workspace of `spec.session` and waits until it answers.
    fn start<'a>(
        &'a self,
        spec: &'a StartSpec,
        workspace: &'a Workspace,
    ) -> BoxFuture<'a, Result<Sandbox, SandboxError>>;

    /// Whether it still runs.
    fn probe<'a>(&'a self, sandbox: &'a Sandbox) -> BoxFuture<'a, Health>;

    /// Stops every process of the sandbox (its files stay, for the last save).
    fn stop<'a>(&'a self, session: &'a SessionId, pid: Option<i32>) -> BoxFuture<'a, ()>;

    /// Deletes the workspace and lets go of it.
    fn discard(&self, workspace_of: &SessionId) -> BoxFuture<'_, Result<(), SandboxError>>;

    /// Workspaces no live hub process holds (their owner died), adopted by this process.
    fn orphans(&self) -> BoxFuture<'_, Vec<Orphan>>;
}
