//! Configuration: defaults, then an optional TOML file, then `UNICAS_*` environment variables.
//!
//! Every key of the TOML file has an environment variable of the same name in upper case with
//! the `UNICAS_` prefix (`lease_min_ms` → `UNICAS_LEASE_MIN_MS`). Limits and intervals take `0`
//! to mean "off" where noted. Secrets are never printed: `Debug` and `check-config` redact the
//! database URL's password.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;

/// Which origins may call the data plane from a browser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cors {
    AnyOrigin,
    Origins(Vec<String>),
    Off,
}

/// The service configuration. See `docs/configuration.md` for every key.
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on.
    pub listen: String,
    /// Directory for the embedded default (SQLite file, `blobs/`, spool files).
    pub data_dir: PathBuf,
    /// `sqlite://…` or `postgres://…`; default: `sqlite://<data_dir>/unicas.db`.
    pub database_url: Option<String>,
    /// `file:///abs/path` or `s3://bucket/prefix`; default: `file://<data_dir>/blobs`.
    pub blob_store: Option<String>,
    /// Base URL of this service as clients reach it (signed upload URLs start with it);
    /// default: `http://<listen>`.
    pub public_url: Option<String>,
    /// Origins whose browser pages may call the data plane: `*` (any; it is authorized by the
    /// bearer capability alone, never a cookie), a comma-separated list of origins, or empty
    /// (no cross-origin answers).
    pub cors_origins: String,
    /// The `aud` that Space capabilities must carry.
    pub audience: String,
    /// Shortest lease the service grants, whatever is asked.
    pub lease_min_ms: u64,
    /// Longest lease the service grants.
    pub lease_max_ms: u64,
    /// How long a signed upload URL stays valid.
    pub upload_url_ttl_ms: u64,
    /// How long an upload generation lives without progress before GC retires it.
    pub upload_ttl_ms: u64,
    /// Most active upload generations per Space (`0` = no limit).
    pub max_active_uploads: u64,
    /// Largest canonical node, in bytes.
    pub node_max_bytes: u64,
    /// Most refs of one node.
    pub node_max_refs: u32,
    /// Interval of the background collector (`0` = off).
    pub gc_interval_ms: u64,
    /// Nodes examined per background pass and Space.
    pub gc_batch: u32,
    /// A row marked for collection longer ago than this is finished by any pass (its marker
    /// crashed or lost its store).
    pub gc_stale_mark_ms: u64,
    /// Objects without a row younger than this are in their grace period (uploads being
    /// published); `fsck --repair-orphans` leaves them alone.
    pub orphan_grace_ms: u64,
    /// Requests per second per client address (`0` = off).
    pub rate_limit_per_ip: u64,
    /// Requests per second per App, after authentication (`0` = off).
    pub rate_limit_per_app: u64,
    /// Largest JSON request body, in bytes (`0` = no limit).
    pub json_body_limit: u64,
    /// How long the issuer registry is cached; it fails closed at twice this age.
    pub auth_cache_ms: u64,
    /// Allowed clock skew for token time bounds, in seconds.
    pub auth_leeway_s: u64,
    /// Store canonical objects of at least this many bytes compressed with zstd (`0` = off),
    /// when that saves at least an eighth.
    pub compress_min_bytes: u64,
    /// zstd level for compression at rest.
    pub compress_level: i32,
    /// Longest chain of delta bases a read may have to go through (`0`: no deltas at rest).
    pub delta_max_depth: u32,
    /// Largest node (and largest base) stored as a delta against the base a lease names.
    pub delta_max_bytes: u64,
    /// Bytes of delta bases' content kept in memory for reads and new deltas.
    pub delta_cache_bytes: u64,
    /// Nodes of at most this much content are packed together by GC passes (`0`: no packs).
    pub pack_max_node_bytes: u64,
    /// Nodes of at most this much content (and at most `pack_max_node_bytes`) are published
    /// with their bytes held in the database until they are packed, not written as objects of
    /// their own (`0`: every node is an object until packed).
    pub hold_max_bytes: u64,
    /// A pass packs a partition's loose small nodes once there are this many …
    pub pack_min_nodes: u64,
    /// … or once the oldest of them is this old.
    pub pack_delay_ms: u64,
    /// Content bytes per block of a pack (one zstd frame; a read of a packed node reads one).
    pub pack_block_bytes: u64,
    /// Content bytes per pack (a pack is built in memory).
    pub pack_max_bytes: u64,
    /// zstd level of pack blocks (packing runs in the background, so it can afford more).
    pub pack_level: i32,
    /// Packs smaller than this are merged with newer nodes, so versions written apart end up
    /// in one block.
    pub pack_merge_bytes: u64,
    /// A pack whose dead entries hold at least this percentage of it is rewritten.
    pub repack_dead_percent: u64,
    /// With an S3 store: uploads declared at most this large go through the service and cost
    /// one object write; larger ones go straight to S3 with a presigned URL.
    pub small_upload_bytes: u64,
    /// Custom S3 endpoint (e.g. a local S3-compatible server).
    pub s3_endpoint: Option<String>,
    /// Path-style S3 addressing.
    pub s3_path_style: bool,
    /// S3 region; default from `AWS_REGION`, else `us-east-1`.
    pub s3_region: Option<String>,
    /// Concurrent node validations (bounds memory and temporary disk use).
    pub max_concurrent_validations: usize,
    /// SQLite durability: `full` (default: every commit durable; the writer's commits are
    /// fsynced in the write-ahead log once the writer is free, `server_kit::wal_sync`) or
    /// `normal` (the log is fsynced only at checkpoints).
    pub sqlite_synchronous: String,
    /// Connections in the database pool.
    pub database_max_connections: u32,
    /// An admin session ends after this long without a request.
    pub admin_session_idle_ms: u64,
    /// An admin session ends this long after sign-in, whatever happens.
    pub admin_session_max_ms: u64,
    /// Lifetime of a one-time login link.
    pub admin_login_link_ttl_ms: u64,
    /// OpenID Connect providers admins sign in with (`UNICAS_OIDC_PROVIDERS`: a JSON array).
    pub oidc_providers: Vec<OidcProvider>,
    /// Longest lifetime (`exp − iat`) a Space capability may have, in seconds (`0` = no limit).
    pub max_capability_lifetime_s: u64,
    /// Where `/metrics` is served: empty (the default) on the main listener, `off` nowhere, or
    /// `host:port` on a listener of its own.
    pub metrics_listen: String,
    /// Host names (optionally `host:port`) the admin plane answers to, comma-separated; `*` is
    /// any. Empty: the loopback names when the service listens on loopback, else any.
    pub allowed_hosts: String,
    /// Below this many free bytes on the local disk (spool, filesystem store), writes answer
    /// 507 instead of filling it (`0` = no floor).
    pub min_free_bytes: u64,
}

pub use server_kit::listen::MetricsListen;

/// An OpenID Connect provider; its redirect URI is `<public_url>/admin/oidc/callback`, its
/// sign-in starts at `/admin/login/<name>`.
pub use server_kit::oidc::OidcProvider;

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:8080".into(),
            data_dir: PathBuf::from("./data"),
            database_url: None,
            blob_store: None,
            public_url: None,
            cors_origins: String::new(),
            audience: "unicas".into(),
            lease_min_ms: 60_000,
            lease_max_ms: 24 * 3600 * 1000,
            upload_url_ttl_ms: 15 * 60 * 1000,
            upload_ttl_ms: 60 * 60 * 1000,
            max_active_uploads: 10_000,
            node_max_bytes: 32 << 20,
            node_max_refs: 256,
            gc_interval_ms: 60_000,
            gc_batch: 1000,
            gc_stale_mark_ms: 60_000,
            orphan_grace_ms: 24 * 3600 * 1000,
            rate_limit_per_ip: 20_000,
            rate_limit_per_app: 50_000,
            json_body_limit: 1 << 20,
            auth_cache_ms: 30_000,
            auth_leeway_s: 30,
            compress_min_bytes: 64,
            compress_level: 3,
            delta_max_depth: 8,
            delta_max_bytes: 4 << 20,
            delta_cache_bytes: 64 << 20,
            pack_max_node_bytes: 64 << 10,
            hold_max_bytes: 64 << 10,
            pack_min_nodes: 64,
            pack_delay_ms: 60_000,
            pack_block_bytes: 256 << 10,
            pack_max_bytes: 8 << 20,
            pack_level: 19,
            pack_merge_bytes: 1 << 20,
            repack_dead_percent: 50,
            small_upload_bytes: 1 << 20,
            s3_endpoint: None,
            s3_path_style: false,
            s3_region: None,
            max_concurrent_validations: 8,
            sqlite_synchronous: "full".into(),
            database_max_connections: 16,
            admin_session_idle_ms: 30 * 60 * 1000,
            admin_session_max_ms: 12 * 3600 * 1000,
            admin_login_link_ttl_ms: 15 * 60 * 1000,
            oidc_providers: Vec::new(),
            max_capability_lifetime_s: 24 * 3600,
            metrics_listen: String::new(),
            allowed_hosts: String::new(),
            min_free_bytes: 256 << 20,
        }
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("data_dir", &self.data_dir)
            .field(
                "database_url",
                &self.database_url().map(|u| redact_url(&u)).ok(),
            )
            .field("blob_store", &self.blob_store().ok())
            .field("public_url", &self.public_url().ok())
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

pub use server_kit::sql::redact_url;

fn env(name: &str) -> Option<String> {
    std::env::var(format!("UNICAS_{name}"))
        .ok()
        .filter(|v| !v.is_empty())
}

fn parse_env<T: std::str::FromStr>(name: &str, slot: &mut T) -> anyhow::Result<()>
where
    T::Err: std::fmt::Display,
{
    if let Some(v) = env(name) {
        *slot = v
            .parse()
            .map_err(|e| anyhow::anyhow!("UNICAS_{name}={v:?}: {e}"))?;
    }
    Ok(())
}

fn parse_env_opt(name: &str, slot: &mut Option<String>) {
    if let Some(v) = env(name) {
        *slot = Some(v);
    }
}

impl Config {
    /// Defaults, then `file` (or `UNICAS_CONFIG`) if given, then the environment.
    pub fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        let file = file
            .map(Path::to_path_buf)
            .or_else(|| env("CONFIG").map(PathBuf::from));
        let mut c = match file {
            Some(path) => {
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read config file {}", path.display()))?;
                toml::from_str(&text)
                    .with_context(|| format!("invalid config file {}", path.display()))?
            }
            None => Config::default(),
        };
        c.apply_env()?;
        c.validate()?;
        Ok(c)
    }

    fn apply_env(&mut self) -> anyhow::Result<()> {
        parse_env("LISTEN", &mut self.listen)?;
        parse_env("DATA_DIR", &mut self.data_dir)?;
        parse_env_opt("DATABASE_URL", &mut self.database_url);
        parse_env_opt("BLOB_STORE", &mut self.blob_store);
        parse_env_opt("PUBLIC_URL", &mut self.public_url);
        parse_env("CORS_ORIGINS", &mut self.cors_origins)?;
        parse_env("AUDIENCE", &mut self.audience)?;
        parse_env("LEASE_MIN_MS", &mut self.lease_min_ms)?;
        parse_env("LEASE_MAX_MS", &mut self.lease_max_ms)?;
        parse_env("UPLOAD_URL_TTL_MS", &mut self.upload_url_ttl_ms)?;
        parse_env("UPLOAD_TTL_MS", &mut self.upload_ttl_ms)?;
        parse_env("MAX_ACTIVE_UPLOADS", &mut self.max_active_uploads)?;
        parse_env("NODE_MAX_BYTES", &mut self.node_max_bytes)?;
        parse_env("NODE_MAX_REFS", &mut self.node_max_refs)?;
        parse_env("GC_INTERVAL_MS", &mut self.gc_interval_ms)?;
        parse_env("GC_BATCH", &mut self.gc_batch)?;
        parse_env("GC_STALE_MARK_MS", &mut self.gc_stale_mark_ms)?;
        parse_env("ORPHAN_GRACE_MS", &mut self.orphan_grace_ms)?;
        parse_env("RATE_LIMIT_PER_IP", &mut self.rate_limit_per_ip)?;
        parse_env("RATE_LIMIT_PER_APP", &mut self.rate_limit_per_app)?;
        parse_env("JSON_BODY_LIMIT", &mut self.json_body_limit)?;
        parse_env("AUTH_CACHE_MS", &mut self.auth_cache_ms)?;
        parse_env("AUTH_LEEWAY_S", &mut self.auth_leeway_s)?;
        parse_env("COMPRESS_MIN_BYTES", &mut self.compress_min_bytes)?;
        parse_env("COMPRESS_LEVEL", &mut self.compress_level)?;
        parse_env("DELTA_MAX_DEPTH", &mut self.delta_max_depth)?;
        parse_env("DELTA_MAX_BYTES", &mut self.delta_max_bytes)?;
        parse_env("DELTA_CACHE_BYTES", &mut self.delta_cache_bytes)?;
        parse_env("PACK_MAX_NODE_BYTES", &mut self.pack_max_node_bytes)?;
        parse_env("HOLD_MAX_BYTES", &mut self.hold_max_bytes)?;
        parse_env("PACK_MIN_NODES", &mut self.pack_min_nodes)?;
        parse_env("PACK_DELAY_MS", &mut self.pack_delay_ms)?;
        parse_env("PACK_BLOCK_BYTES", &mut self.pack_block_bytes)?;
        parse_env("PACK_MAX_BYTES", &mut self.pack_max_bytes)?;
        parse_env("PACK_LEVEL", &mut self.pack_level)?;
        parse_env("PACK_MERGE_BYTES", &mut self.pack_merge_bytes)?;
        parse_env("REPACK_DEAD_PERCENT", &mut self.repack_dead_percent)?;
        parse_env("SMALL_UPLOAD_BYTES", &mut self.small_upload_bytes)?;
        parse_env_opt("S3_ENDPOINT", &mut self.s3_endpoint);
        parse_env("S3_PATH_STYLE", &mut self.s3_path_style)?;
        parse_env_opt("S3_REGION", &mut self.s3_region);
        parse_env(
            "MAX_CONCURRENT_VALIDATIONS",
            &mut self.max_concurrent_validations,
        )?;
        parse_env("SQLITE_SYNCHRONOUS", &mut self.sqlite_synchronous)?;
        parse_env(
            "DATABASE_MAX_CONNECTIONS",
            &mut self.database_max_connections,
        )?;
        parse_env("ADMIN_SESSION_IDLE_MS", &mut self.admin_session_idle_ms)?;
        parse_env("ADMIN_SESSION_MAX_MS", &mut self.admin_session_max_ms)?;
        parse_env("ADMIN_LOGIN_LINK_TTL_MS", &mut self.admin_login_link_ttl_ms)?;
        parse_env(
            "MAX_CAPABILITY_LIFETIME_S",
            &mut self.max_capability_lifetime_s,
        )?;
        parse_env("METRICS_LISTEN", &mut self.metrics_listen)?;
        parse_env("ALLOWED_HOSTS", &mut self.allowed_hosts)?;
        parse_env("MIN_FREE_BYTES", &mut self.min_free_bytes)?;
        if let Some(v) = env("OIDC_PROVIDERS") {
            self.oidc_providers = serde_json::from_str(&v).map_err(|e| {
                anyhow::anyhow!("UNICAS_OIDC_PROVIDERS is not a JSON array of providers: {e}")
            })?;
        }
        Ok(())
    }

    fn validate(&self) -> anyhow::Result<()> {
        self.listen_addr()?;
        if self.lease_min_ms == 0 || self.lease_min_ms > self.lease_max_ms {
            bail!("lease_min_ms must be at least 1 and at most lease_max_ms");
        }
        if self.node_max_bytes < 1024 {
            bail!("node_max_bytes must be at least 1024");
        }
        if self.upload_url_ttl_ms == 0 || self.upload_ttl_ms < self.upload_url_ttl_ms {
            bail!("upload_ttl_ms must be at least upload_url_ttl_ms, which must be positive");
        }
        if !matches!(self.sqlite_synchronous.as_str(), "full" | "normal") {
            bail!("sqlite_synchronous must be \"full\" or \"normal\"");
        }
        if self.max_concurrent_validations == 0 || self.database_max_connections == 0 {
            bail!("max_concurrent_validations and database_max_connections must be positive");
        }
        for p in &self.oidc_providers {
            if p.name.is_empty()
                || !p
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                bail!(
                    "OIDC provider name {:?} must be letters, digits, - or _",
                    p.name
                );
            }
            if !(p.issuer.starts_with("https://") || p.issuer.starts_with("http://")) {
                bail!("OIDC provider {} has no http(s) issuer URL", p.name);
            }
        }
        if !(1..=22).contains(&self.compress_level) {
            bail!("compress_level must be 1..=22");
        }
        if self.delta_max_depth > 64 {
            bail!("delta_max_depth must be at most 64");
        }
        if self.delta_max_bytes > 16 << 20 {
            bail!("delta_max_bytes must be at most 16 MiB (a delta is encoded in memory)");
        }
        if !(1..=22).contains(&self.pack_level) {
            bail!("pack_level must be 1..=22");
        }
        if self.pack_max_node_bytes > 1 << 20 {
            bail!("pack_max_node_bytes must be at most 1 MiB");
        }
        if !(4 << 10..=4 << 20).contains(&self.pack_block_bytes) {
            bail!("pack_block_bytes must be between 4 KiB and 4 MiB");
        }
        if !(self.pack_block_bytes..=64 << 20).contains(&self.pack_max_bytes) {
            bail!(
                "pack_max_bytes must be between pack_block_bytes and 64 MiB (a pack is built in memory)"
            );
        }
        if !(1..=100).contains(&self.repack_dead_percent) {
            bail!("repack_dead_percent must be 1..=100");
        }
        self.database_url()?;
        self.blob_store()?;
        self.public_url()?;
        self.cors()?;
        self.metrics_addr()?;
        Ok(())
    }

    /// The origins allowed to call the data plane from a browser (`cors_origins`).
    pub fn cors(&self) -> anyhow::Result<Cors> {
        let list = self.cors_origins.trim();
        if list == "*" {
            return Ok(Cors::AnyOrigin);
        }
        let mut origins = Vec::new();
        for origin in list.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            let scheme_ok = origin.starts_with("http://") || origin.starts_with("https://");
            let bare = origin.splitn(4, '/').nth(3).is_none() && !origin.ends_with('/');
            if !scheme_ok || !bare || !origin.is_ascii() || origin.contains(char::is_whitespace) {
                bail!("cors_origins: {origin:?} is not an origin (scheme://host[:port], no path)");
            }
            origins.push(origin.to_string());
        }
        Ok(if origins.is_empty() {
            Cors::Off
        } else {
            Cors::Origins(origins)
        })
    }

    /// Where `/metrics` is served.
    pub fn metrics_addr(&self) -> anyhow::Result<MetricsListen> {
        MetricsListen::parse("metrics_listen", &self.metrics_listen)
    }

    /// The Host allow-list of the admin plane.
    pub fn host_allow_list(&self) -> anyhow::Result<crate::web_guard::AllowedHosts> {
        crate::web_guard::AllowedHosts::parse(&self.allowed_hosts, self.listen_addr()?)
    }

    pub fn listen_addr(&self) -> anyhow::Result<SocketAddr> {
        self.listen
            .parse()
            .with_context(|| format!("listen address {:?} is not host:port", self.listen))
    }

    pub fn database_url(&self) -> anyhow::Result<String> {
        let url = match &self.database_url {
            Some(u) => u.clone(),
            None => format!(
                "sqlite://{}?mode=rwc",
                self.data_dir.join("unicas.db").display()
            ),
        };
        if !(url.starts_with("sqlite:")
            || url.starts_with("postgres://")
            || url.starts_with("postgresql://"))
        {
            bail!("database URL must start with sqlite: or postgres://");
        }
        Ok(url)
    }

    pub fn blob_store(&self) -> anyhow::Result<String> {
        let url = match &self.blob_store {
            Some(u) => u.clone(),
            None => {
                let dir = absolute(&self.data_dir.join("blobs"))?;
                format!("file://{}", dir.display())
            }
        };
        if !(url.starts_with("file://") || url.starts_with("s3://")) {
            bail!("blob store must be file:///path or s3://bucket/prefix");
        }
        Ok(url)
    }

    /// The base of signed upload URLs, without a trailing slash.
    pub fn public_url(&self) -> anyhow::Result<String> {
        let url = match &self.public_url {
            Some(u) => u.trim_end_matches('/').to_string(),
            None => format!("http://{}", self.listen),
        };
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            bail!("public_url must start with http:// or https://");
        }
        Ok(url)
    }

    /// The address actually bound may differ (port 0): derive the public URL from it unless one
    /// was configured.
    pub fn with_bound_addr(mut self, addr: SocketAddr) -> Self {
        self.listen = addr.to_string();
        self
    }

    /// Whether a lease of `requested` ms becomes, after clamping.
    pub fn clamp_lease(&self, requested: u64) -> u64 {
        requested.clamp(self.lease_min_ms, self.lease_max_ms)
    }
}

fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    Ok(std::env::current_dir()
        .context("cannot read the current directory")?
        .join(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_keys_are_checked() {
        let c: Config = toml::from_str("listen = \"0.0.0.0:9000\"\nlease_min_ms = 1000").unwrap();
        assert_eq!(c.listen, "0.0.0.0:9000");
        assert_eq!(c.lease_min_ms, 1000);
        assert!(toml::from_str::<Config>("lease_minimum = 3").is_err());
    }

    #[test]
    fn cors_origins_are_origins() {
        let cors = |v: &str| {
            Config {
                cors_origins: v.into(),
                ..Default::default()
            }
            .cors()
        };
        assert_eq!(
            Config::default().cors().unwrap(),
            Cors::Off,
            "off by default"
        );
        assert_eq!(cors("*").unwrap(), Cors::AnyOrigin);
        assert_eq!(cors(" ").unwrap(), Cors::Off);
        assert_eq!(
            cors("https://a.example, http://b.example:8080").unwrap(),
            Cors::Origins(vec![
                "https://a.example".into(),
                "http://b.example:8080".into()
            ])
        );
        for bad in [
            "a.example",
            "https://a.example/",
            "https://a.example/x",
            "ftp://a",
            "https://a b",
            "https://é",
        ] {
            assert!(cors(bad).is_err(), "{bad}");
        }
    }
}
