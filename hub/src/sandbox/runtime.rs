//! The Python runtime sessions run on: a `marimo` executable, either the one
//! `UNICAS_HUB_MARIMO` names or one the hub installs into a virtual environment under its
//! data directory (`runtime/marimo-<version>`, from PyPI) on the first session start. One
//! preparation runs at a time; a failed one is remembered for a minute, so a burst of session
//! starts does not run pip a hundred times.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::process::Command;
use tokio::sync::Mutex;

use crate::sessions::config::SessionConfig;

/// How long a failed preparation answers for itself before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(60);
/// The longest a `pip install` may take.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// The longest a `--version` probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// A runtime ready to start sandboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    pub marimo: PathBuf,
    /// `major.minor`, e.g. `3.11`.
    pub python_version: String,
    pub marimo_version: String,
}

/// Why no runtime can be had, said so a user can act on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

enum State {
    Unknown,
    Ready(Arc<Runtime>),
    Failed(Unavailable, Instant),
}

/// The runtime of this hub process, prepared once.
pub struct Runtimes {
    config: SessionConfig,
    dir: PathBuf,
    state: Mutex<State>,
}

impl Runtimes {
    pub fn new(config: &SessionConfig, data_dir: &Path) -> Self {
        Runtimes {
            config: config.clone(),
            dir: data_dir.join("runtime"),
            state: Mutex::new(State::Unknown),
        }
    }

    /// A failure seen within the last minute, without waiting for a preparation in progress.
    pub fn recent_failure(&self) -> Option<Unavailable> {
        match &*self.state.try_lock().ok()? {
            State::Failed(e, at) if at.elapsed() < RETRY_AFTER => Some(e.clone()),
            _ => None,
        }
    }

    /// The runtime, preparing it if needed (only one caller prepares; the others wait).
    pub async fn get(&self) -> Result<Arc<Runtime>, Unavailable> {
        let mut state = self.state.lock().await;
        match &*state {
            State::Ready(r) => return Ok(r.clone()),
            State::Failed(e, at) if at.elapsed() < RETRY_AFTER => return Err(e.clone()),
            _ => {}
        }
        let prepared = match &self.config.marimo {
            Some(m) => probe(m).await,
            None => self.prepare_venv().await,
        };
        match prepared {
            Ok(r) => {
                tracing::info!(
                    marimo = %r.marimo.display(),
                    python = %r.python_version,
                    version = %r.marimo_version,
                    "session runtime ready"
                );
                let r = Arc::new(r);
                *state = State::Ready(r.clone());
                Ok(r)
            }
            Err(e) => {
                tracing::error!(error = %e, "no session runtime");
                *state = State::Failed(e.clone(), Instant::now());
                Err(e)
            }
        }
    }

    /// A virtual environment with the pinned marimo, made once (a `.ready` marker says the
    /// install finished; a directory without it is made again).
    async fn prepare_venv(&self) -> Result<Runtime, Unavailable> {
        let venv = self
            .dir
            .join(format!("marimo-{}", self.config.marimo_version));
        let marimo = venv.join("bin").join("marimo");
        let ready = venv.join(".ready");
        if ready.exists() {
            return probe(&marimo).await;
        }
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            Unavailable(format!(
                "the session runtime could not be prepared ({what}: {e}); install marimo and set UNICAS_HUB_MARIMO to its executable"
            ))
        };
        if venv.exists() {
            tokio::fs::remove_dir_all(&venv)
                .await
                .map_err(|e| fail("removing an unfinished environment", &e))?;
        }
        tokio::fs::create_dir_all(&self.dir)
            .await
            .map_err(|e| fail("creating the runtime directory", &e))?;
        tracing::info!(venv = %venv.display(), python = %self.config.python, "creating the session runtime's virtual environment");
        run(
            Command::new(&self.config.python)
                .arg("-m")
                .arg("venv")
                .arg(&venv),
            PROBE_TIMEOUT,
        )
        .await
        .map_err(|e| fail(&format!("{} -m venv", self.config.python), &e))?;
        let spec = format!("marimo=={}", self.config.marimo_version);
        tracing::info!(%spec, "installing marimo from PyPI for sessions (once)");
        run(
            Command::new(venv.join("bin").join("pip"))
                .args(["install", "--disable-pip-version-check", "--no-input", "-q"])
                .arg(&spec),
            INSTALL_TIMEOUT,
        )
        .await
        .map_err(|e| fail(&format!("pip install {spec}"), &e))?;
        let r = probe(&marimo).await?;
        tokio::fs::write(&ready, r.marimo_version.as_bytes())
            .await
            .map_err(|e| fail("marking the environment ready", &e))?;
        tracing::info!("marimo installed");
        Ok(r)
    }
}

/// The environment marimo runs with: nothing of the hub's but `PATH`, and its own `HOME`.
pub fn sandbox_env(cmd: &mut Command, home: &Path) {
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("LANG", "C.UTF-8")
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .env("PYTHONUNBUFFERED", "1");
}

impl Runtime {
    /// Renders the notebook `entry` of the workspace `cwd` to HTML at `out` (`marimo export
    /// html`, which runs it in a kernel of its own).
    pub async fn export_html(
        &self,
        cwd: &Path,
        home: &Path,
        entry: &str,
        out: &Path,
        timeout: Duration,
    ) -> Result<(), String> {
        let mut cmd = Command::new(&self.marimo);
        cmd.args(["export", "html", "--no-sandbox", "-o"])
            .arg(out)
            .arg(entry)
            .current_dir(cwd)
            .process_group(0);
        sandbox_env(&mut cmd, home);
        run(&mut cmd, timeout).await.map(|_| ())
    }
}

/// Runs `cmd` to completion within `timeout`; its stdout on success, else what it said.
async fn run(cmd: &mut Command, timeout: Duration) -> Result<String, String> {
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(timeout, cmd.output())
        .await
        .map_err(|_| format!("did not finish within {} s", timeout.as_secs()))?
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(format!(
            "{} {}",
            out.status,
            last.chars().take(300).collect::<String>()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Checks that `marimo` runs and finds the versions for the session record. The interpreter is
/// the `python` beside it (a virtual environment's), else `python3`.
pub async fn probe(marimo: &Path) -> Result<Runtime, Unavailable> {
    let unavailable = |e: String| {
        Unavailable(format!(
            "{} does not run as marimo ({e}); set UNICAS_HUB_MARIMO to a marimo executable",
            marimo.display()
        ))
    };
    let version = run(Command::new(marimo).arg("--version"), PROBE_TIMEOUT)
        .await
        .map_err(unavailable)?;
    let marimo_version = version
        .split_whitespace()
        .last()
        .filter(|v| v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'))
        .ok_or_else(|| unavailable(format!("it printed {version:?} as its version")))?
        .to_string();
    let python = marimo
        .parent()
        .map(|d| d.join("python"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("python3"));
    let python_version = run(Command::new(&python).arg("--version"), PROBE_TIMEOUT)
        .await
        .ok()
        .and_then(|v| {
            let v = v.strip_prefix("Python ")?.to_string();
            let mut parts = v.split('.');
            Some(format!("{}.{}", parts.next()?, parts.next()?))
        })
        .unwrap_or_else(|| "unknown".into());
    Ok(Runtime {
        marimo: marimo.to_path_buf(),
        python_version,
        marimo_version,
    })
}
