//! Configuration of the hub: `UNICAS_HUB_*` environment variables over defaults. The embedded
//! CAS service reads its own configuration (`UNICAS_*`, see `docs/configuration.md`) exactly as
//! `unicas-server` does, so its listener and public URL stay its own.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};

/// How callers of the hub API are identified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// Single-user: every request acts as the local user.
    None,
    /// Personal access tokens (`Authorization: Bearer uhub_pat_…`).
    Token,
}

/// The role a user has on a project without being a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DefaultRole {
    None,
    Viewer,
    Editor,
}

#[derive(Debug, Clone)]
pub struct HubConfig {
    /// `UNICAS_HUB_LISTEN`, default `127.0.0.1:8090`.
    pub listen: String,
    /// `UNICAS_HUB_CAS_URL`: a separate CAS service; unset, the hub embeds one.
    pub cas_url: Option<String>,
    /// `UNICAS_HUB_DATA_DIR`, default `UNICAS_DATA_DIR` (itself `./data`): the hub database, its
    /// signing key, workspace locks and spool files.
    pub data_dir: PathBuf,
    /// `UNICAS_HUB_DATABASE_URL`: default `sqlite://<data_dir>/hub.sqlite`. On Postgres, a
    /// database of its own (not the service's).
    pub database_url: Option<String>,
    /// `UNICAS_HUB_AUTH`: `token` (default) or `none`.
    pub auth: AuthMode,
    /// `UNICAS_HUB_USER`: the user of the single-user mode, default `local`.
    pub local_user: String,
    /// `UNICAS_HUB_DEFAULT_ROLE`: `none` (default), `viewer` or `editor`.
    pub default_role: DefaultRole,
    /// `UNICAS_HUB_APP`: the hub's App in the CAS, default `hub`.
    pub app: String,
    /// `UNICAS_HUB_ISSUER`, default `urn:unicas:hub`.
    pub issuer: String,
    /// `UNICAS_HUB_KID`, default `hub-1`.
    pub kid: String,
    /// `UNICAS_HUB_SIGNING_KEY`: PKCS#8 PEM private key; default `<data_dir>/hub-signing-key.pem`,
    /// an Ed25519 key created on first start.
    pub signing_key: Option<PathBuf>,
    /// `UNICAS_HUB_AUDIENCE`, default `UNICAS_AUDIENCE` or `unicas`.
    pub audience: String,
    /// `UNICAS_HUB_MAX_VERSIONS`: kept versions per notebook (`0` = keep all, the default).
    pub max_versions: u64,
    /// `UNICAS_HUB_WORKSPACE_WAIT_MS`: how long a writer waits for a workspace before 503.
    pub workspace_wait_ms: u64,
    /// `UNICAS_HUB_SYNC_MAX_BYTES`: largest push-sync body, default 512 MiB.
    pub sync_max_bytes: u64,
    /// `UNICAS_HUB_UPLOAD_MAX_BYTES`: largest staged file upload, default 512 MiB.
    pub upload_max_bytes: u64,
    /// `UNICAS_HUB_JSON_MAX_BYTES`: largest JSON body (inline file content), default 64 MiB.
    pub json_max_bytes: u64,
    /// `UNICAS_HUB_LEASE_MS`: how long the hub leases what it stores until a root ref holds it.
    pub lease_ms: u64,
    /// `UNICAS_HUB_PARALLELISM`: concurrent CAS calls of one operation.
    pub parallelism: usize,
    /// `UNICAS_HUB_RECOVERY_INTERVAL_MS`: how often outbox rows left by a dead writer are
    /// settled (`0` = only at start).
    pub recovery_interval_ms: u64,
    /// `UNICAS_HUB_MAX_PROJECTS`: projects of the deployment (at most 16,384).
    pub max_projects: u64,
    /// `UNICAS_HUB_MAX_PROJECTS_PER_USER`: projects one user may own (super admins excepted;
    /// `0` = no limit).
    pub max_projects_per_user: u64,
    /// `UNICAS_HUB_MAX_NOTEBOOKS_PER_PROJECT`: notebooks of one project, live or in the trash.
    pub max_notebooks_per_project: u64,
    /// `UNICAS_HUB_PROJECT_MAX_BYTES`: the encoded metadata of one project and its notebooks'
    /// entries (below the CAS's node limit).
    pub project_max_bytes: u64,
    /// `UNICAS_HUB_MAX_CONCURRENT_SPOOLS`: pushes, imports and staged uploads spooled at once;
    /// beyond, 503 `busy` with `Retry-After`.
    pub max_concurrent_spools: usize,
    /// `UNICAS_HUB_MIN_FREE_BYTES`: below this many free bytes on the data directory's disk,
    /// requests that spool answer 507 instead of filling it (`0` = no floor).
    pub min_free_bytes: u64,
    /// `UNICAS_HUB_ALLOWED_HOSTS`: host names (optionally `host:port`) the hub answers to,
    /// comma-separated, `*` for any; unset: the loopback names when it listens on loopback,
    /// else any.
    pub allowed_hosts: String,
    /// `UNICAS_HUB_METRICS_LISTEN`: where `/metrics` is served: empty (default) beside the
    /// API, `off` nowhere, `host:port` on a listener of its own.
    pub metrics_listen: String,
    /// `UNICAS_HUB_PUBLIC_URL`: the origin browsers reach the hub at, when a proxy in front
    /// rewrites `Host` (accepted as the hub's own origin for changes).
    pub public_url: Option<String>,
    /// `UNICAS_HUB_SESSION_LISTEN`: where sessions are served to browsers, on an origin of
    /// their own (empty, the default: under `/s/` of the hub's own origin). Notebook output is
    /// script its author wrote; on its own origin it cannot act as the hub user viewing it.
    pub session_listen: String,
    /// `UNICAS_HUB_SESSION_URL`: the origin browsers reach that listener at (default
    /// `http://<its address>`); best a host of the hub's own site (`sessions.hub.example`),
    /// so the editor works inside the web UI's frame.
    pub session_url: Option<String>,
    /// Sessions: `UNICAS_HUB_SESSION_*`, `UNICAS_HUB_MARIMO*`, `UNICAS_HUB_EDITOR_MODE`.
    pub sessions: crate::sessions::config::SessionConfig,
    /// What the maintenance pass keeps and for how long: `UNICAS_HUB_*_RETENTION`,
    /// `UNICAS_HUB_MAINTENANCE_INTERVAL`.
    pub retention: crate::maintenance::RetentionConfig,
    /// Browser sign-in: `UNICAS_HUB_OIDC_PROVIDERS`, `UNICAS_HUB_WEB_SESSION_*`,
    /// `UNICAS_HUB_LOGIN_LINK_TTL`.
    pub web: crate::web::WebConfig,
}

pub(crate) fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

pub(crate) fn parse<T: std::str::FromStr>(name: &str, slot: &mut T) -> anyhow::Result<()>
where
    T::Err: std::fmt::Display,
{
    if let Some(v) = env(name) {
        *slot = v
            .parse()
            .map_err(|e| anyhow::anyhow!("{name}={v:?}: {e}"))?;
    }
    Ok(())
}

impl HubConfig {
    /// The defaults, storing under `data_dir`, with no environment read.
    pub fn defaults(data_dir: PathBuf) -> Self {
        HubConfig {
            listen: "127.0.0.1:8090".into(),
            cas_url: None,
            data_dir,
            database_url: None,
            auth: AuthMode::Token,
            local_user: "local".into(),
            default_role: DefaultRole::None,
            app: "hub".into(),
            issuer: "urn:unicas:hub".into(),
            kid: "hub-1".into(),
            signing_key: None,
            audience: "unicas".into(),
            max_versions: 0,
            workspace_wait_ms: 10_000,
            sync_max_bytes: 512 << 20,
            upload_max_bytes: 512 << 20,
            json_max_bytes: 64 << 20,
            lease_ms: 3_600_000,
            parallelism: 16,
            recovery_interval_ms: 30_000,
            max_projects: 10_000,
            max_projects_per_user: 100,
            max_notebooks_per_project: 1_000,
            project_max_bytes: 16 << 20,
            max_concurrent_spools: 4,
            min_free_bytes: 512 << 20,
            allowed_hosts: String::new(),
            metrics_listen: String::new(),
            public_url: None,
            session_listen: String::new(),
            session_url: None,
            sessions: crate::sessions::config::SessionConfig::default(),
            retention: crate::maintenance::RetentionConfig::default(),
            web: crate::web::WebConfig::default(),
        }
    }

    /// Defaults, then the environment.
    pub fn from_env() -> anyhow::Result<Self> {
        let data_dir = env("UNICAS_HUB_DATA_DIR")
            .or_else(|| env("UNICAS_DATA_DIR"))
            .map_or_else(|| PathBuf::from("./data"), PathBuf::from);
        let mut c = HubConfig::defaults(data_dir);
        c.cas_url = env("UNICAS_HUB_CAS_URL").map(|u| u.trim_end_matches('/').to_string());
        c.database_url = env("UNICAS_HUB_DATABASE_URL");
        c.signing_key = env("UNICAS_HUB_SIGNING_KEY").map(PathBuf::from);
        parse("UNICAS_AUDIENCE", &mut c.audience)?;
        c.public_url = env("UNICAS_HUB_PUBLIC_URL").map(|u| u.trim_end_matches('/').to_string());
        c.session_url = env("UNICAS_HUB_SESSION_URL").map(|u| u.trim_end_matches('/').to_string());
        parse("UNICAS_HUB_SESSION_LISTEN", &mut c.session_listen)?;
        c.sessions = crate::sessions::config::SessionConfig::from_env()?;
        c.retention = crate::maintenance::RetentionConfig::from_env()?;
        c.web = crate::web::WebConfig::from_env()?;
        parse("UNICAS_HUB_LISTEN", &mut c.listen)?;
        parse("UNICAS_HUB_USER", &mut c.local_user)?;
        parse("UNICAS_HUB_APP", &mut c.app)?;
        parse("UNICAS_HUB_ISSUER", &mut c.issuer)?;
        parse("UNICAS_HUB_KID", &mut c.kid)?;
        parse("UNICAS_HUB_AUDIENCE", &mut c.audience)?;
        parse("UNICAS_HUB_MAX_VERSIONS", &mut c.max_versions)?;
        parse("UNICAS_HUB_WORKSPACE_WAIT_MS", &mut c.workspace_wait_ms)?;
        parse("UNICAS_HUB_SYNC_MAX_BYTES", &mut c.sync_max_bytes)?;
        parse("UNICAS_HUB_UPLOAD_MAX_BYTES", &mut c.upload_max_bytes)?;
        parse("UNICAS_HUB_JSON_MAX_BYTES", &mut c.json_max_bytes)?;
        parse("UNICAS_HUB_LEASE_MS", &mut c.lease_ms)?;
        parse("UNICAS_HUB_PARALLELISM", &mut c.parallelism)?;
        parse(
            "UNICAS_HUB_RECOVERY_INTERVAL_MS",
            &mut c.recovery_interval_ms,
        )?;
        parse("UNICAS_HUB_MAX_PROJECTS", &mut c.max_projects)?;
        parse(
            "UNICAS_HUB_MAX_PROJECTS_PER_USER",
            &mut c.max_projects_per_user,
        )?;
        parse(
            "UNICAS_HUB_MAX_NOTEBOOKS_PER_PROJECT",
            &mut c.max_notebooks_per_project,
        )?;
        parse("UNICAS_HUB_PROJECT_MAX_BYTES", &mut c.project_max_bytes)?;
        parse(
            "UNICAS_HUB_MAX_CONCURRENT_SPOOLS",
            &mut c.max_concurrent_spools,
        )?;
        parse("UNICAS_HUB_MIN_FREE_BYTES", &mut c.min_free_bytes)?;
        parse("UNICAS_HUB_ALLOWED_HOSTS", &mut c.allowed_hosts)?;
        parse("UNICAS_HUB_METRICS_LISTEN", &mut c.metrics_listen)?;
        if let Some(v) = env("UNICAS_HUB_AUTH") {
            c.auth = match v.as_str() {
                "none" => AuthMode::None,
                "token" => AuthMode::Token,
                _ => bail!("UNICAS_HUB_AUTH={v:?}: expected none or token"),
            };
        }
        if let Some(v) = env("UNICAS_HUB_DEFAULT_ROLE") {
            c.default_role = match v.as_str() {
                "none" => DefaultRole::None,
                "viewer" => DefaultRole::Viewer,
                "editor" => DefaultRole::Editor,
                _ => bail!("UNICAS_HUB_DEFAULT_ROLE={v:?}: expected none, viewer or editor"),
            };
        }
        c.validate()?;
        Ok(c)
    }

    /// Refuses settings the hub cannot run with.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.listen_addr()?;
        self.database_url()?;
        if let Some(u) = &self.cas_url
            && !(u.starts_with("http://") || u.starts_with("https://"))
        {
            bail!("UNICAS_HUB_CAS_URL must start with http:// or https://");
        }
        if self.app.parse::<cas_format::AppId>().is_err() {
            bail!("UNICAS_HUB_APP={:?} is not a valid App id", self.app);
        }
        if self.local_user.is_empty() || self.local_user.len() > 128 {
            bail!("UNICAS_HUB_USER must be 1..=128 characters");
        }
        if self.parallelism == 0 || self.parallelism > 256 {
            bail!("UNICAS_HUB_PARALLELISM must be 1..=256");
        }
        if self.lease_ms < 60_000 {
            bail!("UNICAS_HUB_LEASE_MS must be at least 60000");
        }
        if self.max_projects == 0 || self.max_projects > crate::catalog::MAX_CATALOG_PROJECTS as u64
        {
            bail!(
                "UNICAS_HUB_MAX_PROJECTS must be 1..={}",
                crate::catalog::MAX_CATALOG_PROJECTS
            );
        }
        if self.max_notebooks_per_project == 0 || self.project_max_bytes < 64 << 10 {
            bail!(
                "UNICAS_HUB_MAX_NOTEBOOKS_PER_PROJECT must be positive and UNICAS_HUB_PROJECT_MAX_BYTES at least 65536"
            );
        }
        if self.max_concurrent_spools == 0 {
            bail!("UNICAS_HUB_MAX_CONCURRENT_SPOOLS must be positive");
        }
        if let Some(u) = &self.public_url
            && !(u.starts_with("http://") || u.starts_with("https://"))
        {
            bail!("UNICAS_HUB_PUBLIC_URL must start with http:// or https://");
        }
        if let Some(u) = &self.session_url
            && (!(u.starts_with("http://") || u.starts_with("https://"))
                || self.session_listen.is_empty())
        {
            bail!(
                "UNICAS_HUB_SESSION_URL must start with http:// or https://, and needs UNICAS_HUB_SESSION_LISTEN"
            );
        }
        for (name, url) in [
            ("UNICAS_HUB_PUBLIC_URL", &self.public_url),
            ("UNICAS_HUB_SESSION_URL", &self.session_url),
        ] {
            if let Some(u) = url
                && !u.bytes().all(|b| {
                    b.is_ascii_alphanumeric()
                        || matches!(b, b'.' | b':' | b'/' | b'-' | b'[' | b']')
                })
            {
                bail!("{name} must be an origin such as https://hub.example, not {u:?}");
            }
        }
        self.session_addr()?;
        self.host_allow_list()?;
        self.metrics_addr()?;
        self.sessions.validate()?;
        Ok(())
    }

    /// The hosts the hub answers to.
    pub fn host_allow_list(&self) -> anyhow::Result<server_kit::web_guard::AllowedHosts> {
        server_kit::web_guard::AllowedHosts::parse(&self.allowed_hosts, self.listen_addr()?)
            .context("UNICAS_HUB_ALLOWED_HOSTS")
    }

    /// Where `/metrics` is served.
    pub fn metrics_addr(&self) -> anyhow::Result<server_kit::listen::MetricsListen> {
        server_kit::listen::MetricsListen::parse("UNICAS_HUB_METRICS_LISTEN", &self.metrics_listen)
    }

    /// The listener of sessions on their own origin, if configured.
    pub fn session_addr(&self) -> anyhow::Result<Option<SocketAddr>> {
        if self.session_listen.is_empty() {
            return Ok(None);
        }
        self.session_listen.parse().map(Some).with_context(|| {
            format!(
                "UNICAS_HUB_SESSION_LISTEN {:?} is not host:port",
                self.session_listen
            )
        })
    }

    /// The origin sessions are opened at: their own, else the hub's public URL (`None`: the
    /// origin the request came to).
    pub fn session_base(&self) -> Option<&str> {
        self.session_url.as_deref().or(self.public_url.as_deref())
    }

    pub fn listen_addr(&self) -> anyhow::Result<SocketAddr> {
        self.listen
            .parse()
            .with_context(|| format!("UNICAS_HUB_LISTEN {:?} is not host:port", self.listen))
    }

    pub fn database_url(&self) -> anyhow::Result<String> {
        let url = match &self.database_url {
            Some(u) => u.clone(),
            None => format!(
                "sqlite://{}?mode=rwc",
                self.data_dir.join("hub.sqlite").display()
            ),
        };
        if !(url.starts_with("sqlite:")
            || url.starts_with("postgres://")
            || url.starts_with("postgresql://"))
        {
            bail!("UNICAS_HUB_DATABASE_URL must start with sqlite: or postgres://");
        }
        Ok(url)
    }

    pub fn signing_key_path(&self) -> PathBuf {
        self.signing_key
            .clone()
            .unwrap_or_else(|| self.data_dir.join("hub-signing-key.pem"))
    }

    /// Where workspace lock files live (SQLite deployments).
    pub fn lock_dir(&self) -> PathBuf {
        self.data_dir.join("hub-locks")
    }

    /// Where request bodies are spooled while they are stored.
    pub fn spool_dir(&self) -> PathBuf {
        self.data_dir.join("hub-spool")
    }
}
