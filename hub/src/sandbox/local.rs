//! The local sandbox provider: marimo as a process group of the hub's host.
//!
//! Each session has a directory `<data>/sessions/<sid>/` holding `lock` (locked with `flock`
//! for as long as a hub process owns the sandbox: the kernel lets go when that process dies,
//! however it dies), `sandbox.json` (the process group, for whoever adopts it), `files/` (the
//! notebook's workspace, marimo's working directory), `home/` (its `HOME`) and `marimo.log`.
//! marimo listens on a loopback port with a secret read from its stdin; only the hub's proxy
//! knows the secret.
//!
//! This provider isolates sessions from the network, not from each other: notebook code runs
//! as the hub's user. Deploy it for people who may run code on the hub's host.

use std::collections::HashSet;
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Health, Orphan, Sandbox, SandboxError, SandboxProvider, StartSpec, Workspace};
use crate::ids::{self, SessionId};
use crate::store::sessions::SessionMode;

/// How long marimo gets to exit after SIGTERM before its group is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// What `sandbox.json` records.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    session: String,
    sandbox_id: String,
    pid: i32,
    port: u16,
}

/// The `flock` that says a live hub process owns a session directory.
struct Held(#[allow(dead_code)] File);

pub struct LocalProvider {
    root: PathBuf,
    start_timeout: Duration,
    /// marimo shuts itself down after this long without a connected editor: a backstop for a
    /// sandbox whose hub died and was never started again.
    idle_shutdown: Duration,
    /// Children this process started that have exited (reaped by their waiter).
    exited: Arc<Mutex<HashSet<i32>>>,
}

impl LocalProvider {
    pub fn new(data_dir: &Path, start_timeout: Duration, idle_shutdown: Duration) -> Self {
        LocalProvider {
            root: data_dir.join("sessions"),
            start_timeout,
            idle_shutdown,
            exited: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    fn dir(&self, session: &SessionId) -> PathBuf {
        self.root.join(session.as_str())
    }

    fn has_exited(&self, pid: i32) -> bool {
        self.exited
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&pid)
    }
}

/// Takes the directory's lock without waiting; `None` if a live process holds it.
fn try_hold(dir: &Path) -> std::io::Result<Option<Held>> {
    hold_lock(dir, true)
}

/// Holds the lock file of `dir` if it exists and nobody holds it: what a scan for orphans
/// takes. A directory without one is being created or being removed by its owner, which
/// holds the lock until it is gone; creating the file there would take a fresh lock beside
/// the owner's and keep the directory from going.
fn try_hold_existing(dir: &Path) -> std::io::Result<Option<Held>> {
    match hold_lock(dir, false) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        other => other,
    }
}

fn hold_lock(dir: &Path, create: bool) -> std::io::Result<Option<Held>> {
    let f = std::fs::OpenOptions::new()
        .create(create)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(Held(f))),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn io(what: &str) -> impl Fn(std::io::Error) -> SandboxError + '_ {
    move |e| SandboxError::Io(format!("{what}: {e}"))
}

/// Whether `pid` is a marimo process of `session` (so a recycled pid is never signalled).
fn is_our_marimo(pid: i32, session: &SessionId) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let text = String::from_utf8_lossy(&cmdline);
    text.contains("marimo") && text.contains(session.as_str())
}

/// Whether `pid` runs (a zombie does not).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

fn signal_group(pid: i32, signal: rustix::process::Signal) {
    if let Some(p) = rustix::process::Pid::from_raw(pid) {
        // The group may be gone already; nothing else to do then.
        let _ = rustix::process::kill_process_group(p, signal);
    }
}

/// A free loopback port (marimo binds it a moment later; a lost race is a failed start).
fn free_port() -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(l.local_addr()?.port())
}

/// Whether marimo answers its health check at `base`.
async fn answers(addr: SocketAddr, base: &str) -> bool {
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let req = format!("GET {base}/health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut head = [0u8; 16];
        let n = s.read(&mut head).await.ok()?;
        Some(head[..n].starts_with(b"HTTP/1.1 200") || head[..n].starts_with(b"HTTP/1.0 200"))
    };
    tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// The last lines of marimo's log, for a failed start.
fn log_tail(dir: &Path) -> String {
    let log = std::fs::read(dir.join("marimo.log")).unwrap_or_default();
    let text = String::from_utf8_lossy(&log[log.len().saturating_sub(2048)..]);
    text.lines()
        .rev()
        .filter(|l| !l.trim().is_empty())
        .take(3)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join(" | ")
}

impl LocalProvider {
    async fn start_once(&self, spec: &StartSpec) -> Result<Sandbox, SandboxError> {
        let dir = self.dir(&spec.session);
        let port = free_port().map_err(io("finding a free port"))?;
        let secret = ids::secret();
        let log = File::create(dir.join("marimo.log")).map_err(io("creating marimo.log"))?;
        let mut cmd = tokio::process::Command::new(&spec.runtime.marimo);
        cmd.arg(match spec.mode {
            SessionMode::Edit => "edit",
            SessionMode::App => "run",
        });
        cmd.arg(&spec.entry)
            .args(["--headless", "--host", "127.0.0.1", "--port"])
            .arg(port.to_string())
            .args(["--token-password-file", "-", "--base-url"])
            .arg(&spec.base_url)
            .arg("--no-sandbox");
        if spec.mode == SessionMode::Edit {
            // `marimo run` has neither.
            cmd.arg("--skip-update-check")
                .arg("--timeout")
                .arg(format!("{:.2}", self.idle_shutdown.as_secs_f64() / 60.0));
        }
        super::runtime::sandbox_env(&mut cmd, &dir.join("home"));
        cmd.current_dir(dir.join("files"))
            .stdin(std::process::Stdio::piped())
            .stdout(log.try_clone().map_err(io("opening marimo.log"))?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(false);
        let mut child = cmd.spawn().map_err(|e| {
            SandboxError::Runtime(format!("cannot run {}: {e}", spec.runtime.marimo.display()))
        })?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| SandboxError::Start("marimo exited at once".into()))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(secret.as_bytes())
                .await
                .map_err(io("handing marimo its secret"))?;
        }
        let sandbox_id = ids::sandbox_id();
        let record = Record {
            session: spec.session.to_string(),
            sandbox_id: sandbox_id.clone(),
            pid,
            port,
        };
        std::fs::write(
            dir.join("sandbox.json"),
            serde_json::to_vec(&record).unwrap_or_default(),
        )
        .map_err(io("writing sandbox.json"))?;
        let exited = self.exited.clone();
        tokio::spawn(async move {
            let _ = child.wait().await;
            exited.lock().unwrap_or_else(|p| p.into_inner()).insert(pid);
        });
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let deadline = Instant::now() + self.start_timeout;
        loop {
            if self.has_exited(pid) {
                return Err(SandboxError::Start(format!(
                    "marimo exited while starting: {}",
                    log_tail(&dir)
                )));
            }
            if answers(addr, &spec.base_url).await {
                break;
            }
            if Instant::now() > deadline {
                self.stop(&spec.session, Some(pid)).await;
                return Err(SandboxError::Start(format!(
                    "marimo did not answer within {} s",
                    self.start_timeout.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(Sandbox {
            id: sandbox_id,
            session: spec.session.clone(),
            addr,
            secret,
            pid,
        })
    }
}

impl SandboxProvider for LocalProvider {
    fn workspace(&self, session: &SessionId) -> BoxFuture<'_, Result<Workspace, SandboxError>> {
        let dir = self.dir(session);
        let session = session.clone();
        async move {
            std::fs::create_dir_all(&self.root).map_err(io("creating the sessions directory"))?;
            std::fs::create_dir(&dir).map_err(io("creating the session's directory"))?;
            let held = try_hold(&dir)
                .map_err(io("locking the session's directory"))?
                .ok_or_else(|| SandboxError::Io("the session's directory is held".into()))?;
            for sub in ["files", "home"] {
                std::fs::create_dir(dir.join(sub))
                    .map_err(io("creating the session's directory"))?;
            }
            Ok(Workspace {
                session,
                files: dir.join("files"),
                home: dir.join("home"),
                hold: Box::new(held),
            })
        }
        .boxed()
    }

    fn start<'a>(
        &'a self,
        spec: &'a StartSpec,
        _workspace: &'a Workspace,
    ) -> BoxFuture<'a, Result<Sandbox, SandboxError>> {
        async move {
            // A port taken between choosing and binding it is the one failure worth a retry.
            match self.start_once(spec).await {
                Err(SandboxError::Start(e)) if e.contains("address already in use") => {
                    self.start_once(spec).await
                }
                other => other,
            }
        }
        .boxed()
    }

    fn probe<'a>(&'a self, sandbox: &'a Sandbox) -> BoxFuture<'a, Health> {
        async move {
            if self.has_exited(sandbox.pid) || !alive(sandbox.pid) {
                Health::Exited
            } else {
                Health::Running
            }
        }
        .boxed()
    }

    fn stop<'a>(&'a self, session: &'a SessionId, pid: Option<i32>) -> BoxFuture<'a, ()> {
        async move {
            let Some(pid) = pid else { return };
            if self.has_exited(pid) {
                // Our child, the group's leader, is gone; what is left of its group (the
                // kernel) goes with one signal.
                signal_group(pid, rustix::process::Signal::KILL);
                return;
            }
            if !is_our_marimo(pid, session) {
                // Not (or no longer) this session's marimo: never signal someone else's group.
                return;
            }
            signal_group(pid, rustix::process::Signal::TERM);
            let deadline = Instant::now() + STOP_GRACE;
            while Instant::now() < deadline && !self.has_exited(pid) && alive(pid) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            signal_group(pid, rustix::process::Signal::KILL);
        }
        .boxed()
    }

    fn discard(&self, session: &SessionId) -> BoxFuture<'_, Result<(), SandboxError>> {
        let dir = self.dir(session);
        async move {
            match tokio::fs::remove_dir_all(&dir).await {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(SandboxError::Io(format!("removing {}: {e}", dir.display()))),
            }
        }
        .boxed()
    }

    fn orphans(&self) -> BoxFuture<'_, Vec<Orphan>> {
        async move {
            let Ok(entries) = std::fs::read_dir(&self.root) else {
                return Vec::new();
            };
            let mut out = Vec::new();
            for e in entries.flatten() {
                let Some(session) = e
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<SessionId>().ok())
                else {
                    continue;
                };
                let dir = e.path();
                let held = match try_hold_existing(&dir) {
                    Ok(Some(h)) => h,
                    Ok(None) => continue,
                    Err(err) => {
                        tracing::warn!(session = %session, error = %err, "cannot inspect a session directory");
                        continue;
                    }
                };
                let pid = std::fs::read(dir.join("sandbox.json"))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
                    .filter(|r| r.session == session.as_str())
                    .map(|r| r.pid)
                    .filter(|pid| is_our_marimo(*pid, &session));
                out.push(Orphan {
                    files: dir.join("files"),
                    home: dir.join("home"),
                    session,
                    pid,
                    hold: Box::new(held),
                });
            }
            out
        }
        .boxed()
    }
}
