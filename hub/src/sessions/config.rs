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
        }
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
