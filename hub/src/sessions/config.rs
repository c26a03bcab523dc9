//! Configuration of sessions: `UNICAS_HUB_SESSION_*`, `UNICAS_HUB_MARIMO*`,
//! `UNICAS_HUB_EDITOR_MODE` and `UNICAS_HUB_INTERNAL_URL`.

use std::path::PathBuf;

use anyhow::bail;

use crate::config::{env, parse};
use crate::store::sessions::Sharing;

/// The marimo release the hub installs when it prepares a runtime itself.
pub const PINNED_MARIMO: &str = "0.25.2";

#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// `UNICAS_HUB_MARIMO`: a `marimo` executable; unset, the hub prepares a virtual
    /// environment with [`PINNED_MARIMO`] under its data directory on the first start.
    pub marimo: Option<PathBuf>,
    /// `UNICAS_HUB_PYTHON`: the interpreter that virtual environment is made with.
    pub python: String,
    /// `UNICAS_HUB_MARIMO_VERSION`: the release installed into it.
    pub marimo_version: String,
    /// `UNICAS_HUB_SESSION_MAX_PER_USER` (default 8) and `UNICAS_HUB_SESSION_MAX_TOTAL`
    /// (default 64): live sessions; `0` = unlimited.
    pub max_per_user: u64,
    pub max_total: u64,
    /// `UNICAS_HUB_SESSION_IDLE_TIMEOUT_SECONDS`: no heartbeat and no traffic for this long
    /// ends a session (default 1,800).
    pub idle_timeout_s: u64,
    /// `UNICAS_HUB_SESSION_MAX_LIFETIME_SECONDS`: the longest a session lives (default 12 h).
    pub max_lifetime_s: u64,
    /// `UNICAS_HUB_EDITOR_MODE`: `exclusive` (default) or `shared`.
    pub editor_mode: Sharing,
    /// `UNICAS_HUB_SESSION_SAVE_INTERVAL_MS`: how often a session's changes are saved
    /// (default 60,000; `0` = only at teardown).
    pub save_interval_ms: u64,
    /// `UNICAS_HUB_SESSION_SWEEP_MS`: how often sessions are swept (default 60,000).
    pub sweep_ms: u64,
    /// `UNICAS_HUB_SESSION_EXPIRE_MS`: a live session without a heartbeat for this long
    /// expires (default 300,000).
    pub expire_ms: u64,
    /// `UNICAS_HUB_SESSION_START_TIMEOUT_MS`: how long marimo may take to answer once started
    /// (default 60,000).
    pub start_timeout_ms: u64,
    /// `UNICAS_HUB_SESSION_RETENTION_MS`: terminal records are deleted after this (default
    /// 24 h).
    pub retention_ms: u64,
    /// `UNICAS_HUB_SESSION_CAPTURE_MAX_BYTES` (default 64 MiB) and
    /// `UNICAS_HUB_SESSION_CAPTURE_MAX_FILES` (default 10,000): what one save of a session
    /// reads from its directory; files beyond are left out and logged.
    pub capture_max_bytes: u64,
    pub capture_max_files: u64,
    /// `UNICAS_HUB_INTERNAL_URL`: where other hub processes reach this one (default
    /// `http://` and the address it listens on).
    pub internal_url: Option<String>,
    /// App pools (seed 003): `UNICAS_HUB_APP_MAX_VISITS_PER_SESSION` (visit slots per
    /// sandbox; the deprecated `UNICAS_HUB_APP_MAX_USERS_PER_SESSION` is its alias) and
    /// `UNICAS_HUB_APP_MAX_SESSIONS_PER_VERSION` (starting and ready sandboxes of a notebook's
    /// current version); unset: unlimited.
    pub app_max_visits: Option<u64>,
    pub app_max_sessions: Option<u64>,
    /// `UNICAS_HUB_SESSION_APP_IDLE_TIMEOUT_SECONDS`: an app sandbox with no slot in use retires
    /// this long after its last lease or grace deadline (default: the idle timeout).
    pub app_idle_timeout_s: u64,
    /// `UNICAS_HUB_APP_VISIT_LEASE_MS` (default 120,000): a visit's lease, renewed by heartbeats
    /// once half of it has passed; `UNICAS_HUB_APP_GRACE_MS` (default 15,000): how long a
    /// departed visit keeps its slot for a reconnect.
    pub app_visit_lease_ms: u64,
    pub app_grace_ms: u64,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            marimo: None,
            python: "python3".into(),
            marimo_version: PINNED_MARIMO.into(),
            max_per_user: 8,
            max_total: 64,
            idle_timeout_s: 1_800,
            max_lifetime_s: 12 * 3_600,
            editor_mode: Sharing::Exclusive,
            save_interval_ms: 60_000,
            sweep_ms: 60_000,
            expire_ms: 300_000,
            start_timeout_ms: 60_000,
            retention_ms: 24 * 3_600_000,
            capture_max_bytes: 64 << 20,
            capture_max_files: 10_000,
            internal_url: None,
            app_max_visits: None,
            app_max_sessions: None,
            app_idle_timeout_s: 1_800,
            app_visit_lease_ms: 120_000,
            app_grace_ms: 15_000,
        }
    }
}

/// A positive integer setting; unset is `None`.
fn positive(name: &str) -> anyhow::Result<Option<u64>> {
    match env(name) {
        None => Ok(None),
        Some(v) => match v.parse::<u64>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => bail!("{name}={v:?}: expected a positive integer"),
        },
    }
}

impl SessionConfig {
    /// Defaults, then the environment.
    pub fn from_env() -> anyhow::Result<Self> {
        let mut c = SessionConfig {
            marimo: env("UNICAS_HUB_MARIMO").map(PathBuf::from),
            internal_url: env("UNICAS_HUB_INTERNAL_URL")
                .map(|u| u.trim_end_matches('/').to_string()),
            ..SessionConfig::default()
        };
        parse("UNICAS_HUB_PYTHON", &mut c.python)?;
        parse("UNICAS_HUB_MARIMO_VERSION", &mut c.marimo_version)?;
        parse("UNICAS_HUB_SESSION_MAX_PER_USER", &mut c.max_per_user)?;
        parse("UNICAS_HUB_SESSION_MAX_TOTAL", &mut c.max_total)?;
        parse(
            "UNICAS_HUB_SESSION_IDLE_TIMEOUT_SECONDS",
            &mut c.idle_timeout_s,
        )?;
        parse(
            "UNICAS_HUB_SESSION_MAX_LIFETIME_SECONDS",
            &mut c.max_lifetime_s,
        )?;
        parse(
            "UNICAS_HUB_SESSION_SAVE_INTERVAL_MS",
            &mut c.save_interval_ms,
        )?;
        parse("UNICAS_HUB_SESSION_SWEEP_MS", &mut c.sweep_ms)?;
        parse("UNICAS_HUB_SESSION_EXPIRE_MS", &mut c.expire_ms)?;
        parse(
            "UNICAS_HUB_SESSION_START_TIMEOUT_MS",
            &mut c.start_timeout_ms,
        )?;
        parse("UNICAS_HUB_SESSION_RETENTION_MS", &mut c.retention_ms)?;
        parse(
            "UNICAS_HUB_SESSION_CAPTURE_MAX_BYTES",
            &mut c.capture_max_bytes,
        )?;
        parse(
            "UNICAS_HUB_SESSION_CAPTURE_MAX_FILES",
            &mut c.capture_max_files,
        )?;
        c.app_idle_timeout_s = c.idle_timeout_s;
        parse(
            "UNICAS_HUB_SESSION_APP_IDLE_TIMEOUT_SECONDS",
            &mut c.app_idle_timeout_s,
        )?;
        parse("UNICAS_HUB_APP_VISIT_LEASE_MS", &mut c.app_visit_lease_ms)?;
        parse("UNICAS_HUB_APP_GRACE_MS", &mut c.app_grace_ms)?;
        c.app_max_sessions = positive("UNICAS_HUB_APP_MAX_SESSIONS_PER_VERSION")?;
        c.app_max_visits = match (
            positive("UNICAS_HUB_APP_MAX_VISITS_PER_SESSION")?,
            positive("UNICAS_HUB_APP_MAX_USERS_PER_SESSION")?,
        ) {
            (Some(v), old) => {
                if old.is_some() {
                    tracing::warn!(
                        "UNICAS_HUB_APP_MAX_USERS_PER_SESSION is deprecated and ignored: UNICAS_HUB_APP_MAX_VISITS_PER_SESSION is set"
                    );
                }
                Some(v)
            }
            (None, Some(old)) => {
                tracing::warn!(
                    "UNICAS_HUB_APP_MAX_USERS_PER_SESSION is deprecated: name it UNICAS_HUB_APP_MAX_VISITS_PER_SESSION"
                );
                Some(old)
            }
            (None, None) => None,
        };
        if let Some(v) = env("UNICAS_HUB_EDITOR_MODE") {
            c.editor_mode = match Sharing::parse(&v) {
                Some(m) => m,
                None => bail!("UNICAS_HUB_EDITOR_MODE={v:?}: expected exclusive or shared"),
            };
        }
        c.validate()?;
        Ok(c)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if self.app_visit_lease_ms < 1000 || self.app_idle_timeout_s == 0 {
            bail!(
                "UNICAS_HUB_APP_VISIT_LEASE_MS must be at least 1000 and UNICAS_HUB_SESSION_APP_IDLE_TIMEOUT_SECONDS positive"
            );
        }
        if self.sweep_ms == 0 || self.expire_ms == 0 || self.start_timeout_ms == 0 {
            bail!("UNICAS_HUB_SESSION_SWEEP_MS, _EXPIRE_MS and _START_TIMEOUT_MS must be positive");
        }
        if self.idle_timeout_s == 0 || self.max_lifetime_s == 0 {
            bail!(
                "UNICAS_HUB_SESSION_IDLE_TIMEOUT_SECONDS and _MAX_LIFETIME_SECONDS must be positive"
            );
        }
        if !self
            .marimo_version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.')
        {
            bail!("UNICAS_HUB_MARIMO_VERSION must be a release number such as {PINNED_MARIMO}");
        }
        if let Some(u) = &self.internal_url
            && !u.starts_with("http://")
        {
            bail!("UNICAS_HUB_INTERNAL_URL must start with http://");
        }
        Ok(())
    }
}
