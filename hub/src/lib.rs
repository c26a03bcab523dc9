//! The notebook hub: catalog, projects, notebooks, versions and workspaces, stored as UniCAS
//! nodes through `cas-client` and retained by root refs.
//!
//! The hub is one App of the CAS with its own signing key; each project is one Space, so
//! identical content is stored once per project and usage is per project. It never reads the
//! CAS's tables or objects: everything goes through the data-plane API. Its own database holds
//! only mutable pointers and indexes ([`store`], the only module that speaks SQL).

#![forbid(unsafe_code)]

pub mod api;
pub mod app_pools;
pub mod auth;
pub mod catalog;
pub mod cli;
pub mod commit;
pub mod config;
#[cfg(feature = "embedded-cas")]
pub mod embedded;
pub mod error;
pub mod forks;
pub mod idempotency;
pub mod ids;
pub mod invitations;
pub mod keys;
pub mod lock;
pub mod maintenance;
pub mod metrics;
pub mod notebooks;
pub mod outbox;
pub mod project_trash;
pub mod projects;
pub mod proxy;
pub mod sandbox;
pub mod sessions;
pub mod spool;
pub mod store;
pub mod sync;
pub mod transfer;
pub mod trash;
pub mod versions;
pub mod web;
pub mod workspace;

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cas_client::{AppCasClient, RetryPolicy, SigningKey};
use tokio_util::sync::CancellationToken;

use crate::catalog::SnapshotCache;
use crate::config::{AuthMode, HubConfig};
use crate::error::{HubError, HubResult};
use crate::lock::Locks;
use crate::store::locks::LockBackend;
use crate::store::{Dialect, HubStore};

/// Named failpoints for crash tests (see `server_kit::failpoint`).
pub(crate) mod failpoint {
    use crate::error::{HubError, HubResult};

    pub async fn hit(name: &str) -> HubResult<()> {
        if server_kit::failpoint::hit(name).await {
            return Err(HubError::internal("failpoint", name));
        }
        Ok(())
    }
}

pub struct HubState {
    pub config: HubConfig,
    pub store: HubStore,
    pub locks: Locks,
    /// The content store; `None` for operator commands, which only touch the database.
    cas: Option<AppCasClient>,
    pub(crate) snapshots: SnapshotCache,
    pub spools: spool::Spools,
    /// The hosts the hub answers to.
    pub allowed_hosts: server_kit::web_guard::AllowedHosts,
    /// The sessions whose sandboxes this process owns.
    pub sessions: sessions::Sessions,
    pub(crate) proxy: proxy::ProxyState,
    pub metrics: metrics::HubMetrics,
    /// OpenID Connect providers' metadata and keys, for browser sign-in.
    pub(crate) oidc: server_kit::oidc::OidcClient,
}

/// A cheap handle to the hub.
#[derive(Clone)]
pub struct Hub(Arc<HubState>);

impl Deref for Hub {
    type Target = HubState;
    fn deref(&self) -> &HubState {
        &self.0
    }
}

impl Hub {
    /// Connects the database (applying migrations) and, with `cas_url`, builds a client of the
    /// CAS there signing with the hub's key. Without one, the hub does only local work
    /// (operator commands) and anything that needs the CAS answers 503.
    pub async fn open(config: HubConfig, cas_url: Option<&str>) -> anyhow::Result<Hub> {
        let store = HubStore::connect(&config).await?;
        store.migrate().await?;
        let backend = match store.dialect() {
            Dialect::Sqlite => LockBackend::files(config.lock_dir())
                .with_context(|| format!("cannot create {}", config.lock_dir().display()))?,
            Dialect::Postgres => LockBackend::postgres(store.url())
                .await
                .context("cannot connect the lock pool")?,
        };
        // Tickets and session cookies are signed with a key every process of the hub derives
        // from its signing key; a process without a content store serves no sessions.
        let (cas, proxy_secret) = match cas_url {
            Some(url) => {
                let app = config
                    .app
                    .parse()
                    .map_err(|e| anyhow::anyhow!("bad App id: {e}"))?;
                let pem =
                    keys::load_or_create(&config.signing_key_path(), config.signing_key.is_none())?;
                let key = SigningKey::from_pem(&pem, &config.kid, &config.issuer, &config.audience)
                    .map_err(|e| anyhow::anyhow!("the hub's signing key: {e}"))?;
                let secret = cas_format::Hash::digest(
                    [b"unicas-hub session tickets\0".as_slice(), pem.as_bytes()]
                        .concat()
                        .as_slice(),
                );
                let client = AppCasClient::new(url, app, Arc::new(key))
                    .map_err(|e| anyhow::anyhow!("{e}"))?
                    .with_retry(RetryPolicy::default())
                    .with_cache(64 << 20);
                (Some(client), secret.as_bytes().to_vec())
            }
            None => (None, rand::random::<[u8; 32]>().to_vec()),
        };
        let provider = Arc::new(sandbox::local::LocalProvider::new(
            &config.data_dir,
            Duration::from_millis(config.sessions.start_timeout_ms),
            // Five minutes past the hub's own idle timeout, so it never ends a session first.
            Duration::from_secs(config.sessions.idle_timeout_s + 300),
        ));
        let sessions = sessions::Sessions::new(
            provider,
            sandbox::runtime::Runtimes::new(&config.sessions, &config.data_dir),
            config.sessions.internal_url.clone(),
            format!("http://{}", config.listen),
        );
        Ok(Hub(Arc::new(HubState {
            spools: spool::Spools::new(&config),
            allowed_hosts: config.host_allow_list()?,
            config,
            store,
            locks: Locks::new(backend),
            cas,
            snapshots: SnapshotCache::new(64 << 20),
            sessions,
            proxy: proxy::ProxyState::new(&proxy_secret),
            metrics: metrics::HubMetrics::default(),
            oidc: server_kit::oidc::OidcClient::standalone(),
        })))
    }

    /// The client of the CAS, or 503 when this hub was opened without one.
    pub fn cas(&self) -> HubResult<&AppCasClient> {
        self.cas
            .as_ref()
            .ok_or_else(|| HubError::unavailable("this hub process has no content store"))
    }

    /// Uploads what `plan` holds in `space` with the hub's lease and parallelism.
    pub fn uploader<'a>(
        &'a self,
        space: &'a cas_format::SpaceId,
        plan: &'a cas_client::Plan,
    ) -> HubResult<cas_client::Uploader<'a>> {
        Ok(cas_client::Uploader::new(
            self.cas()?,
            space,
            plan,
            self.config.lease_ms,
            self.config.parallelism,
        ))
    }

    /// Names, for the new nodes of the planned `tree`, the nodes of the earlier tree `base`
    /// they replace, so that the content store may keep them as deltas (`deltaBase`). Only
    /// advice: a failure to read the earlier tree is logged and the save goes on.
    pub async fn suggest_bases(
        &self,
        space: &cas_format::SpaceId,
        plan: &mut cas_client::Plan,
        tree: cas_format::Hash,
        base: Option<cas_format::Hash>,
    ) {
        let (Some(base), Ok(cas)) = (base, self.cas()) else {
            return;
        };
        if let Err(e) = cas.suggest_bases(space, plan, tree, base).await {
            tracing::warn!(error = %e, %tree, %base, "no delta bases suggested");
        }
    }

    /// Makes the hub ready to serve: the local user (single-user mode), the first catalog
    /// snapshot, and whatever a crashed process left in the outbox.
    pub async fn start(&self) -> anyhow::Result<()> {
        if self.config.auth == AuthMode::None {
            self.create_user(&self.config.local_user, &self.config.local_user, None, true)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let mut wait = Duration::from_millis(200);
        for attempt in 0.. {
            match self.init_catalog().await {
                Ok(()) => break,
                Err(e)
                    if attempt < 20 && e.status == axum::http::StatusCode::SERVICE_UNAVAILABLE =>
                {
                    tracing::warn!(error = %e, "the content store is not answering yet");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(anyhow::anyhow!("cannot initialize the catalog: {e}")),
            }
        }
        let settled = self
            .recover()
            .await
            .map_err(|e| anyhow::anyhow!("recovery failed: {e}"))?;
        if settled > 0 {
            tracing::info!(settled, "settled outbox rows left by an earlier process");
        }
        self.resume_purges()
            .await
            .map_err(|e| anyhow::anyhow!("resuming purges failed: {e}"))?;
        // Sessions a stopped process left on this host: saved, stopped, expired.
        self.recover_orphans().await;
        Ok(())
    }

    /// Settles outbox rows of writers that are gone, every `recovery_interval_ms`.
    pub async fn background_recovery(&self, stop: CancellationToken) {
        let every = Duration::from_millis(self.config.recovery_interval_ms.max(1000));
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            if let Err(e) = self.recover().await {
                tracing::warn!(error = %e, "outbox recovery failed; will retry");
            }
        }
    }

    pub async fn close(&self) {
        self.locks.close().await;
        self.store.close().await;
    }
}

/// Serves the hub on `listener` until `shutdown` is cancelled.
pub async fn run_hub(
    hub: Hub,
    listener: tokio::net::TcpListener,
    session_listener: Option<tokio::net::TcpListener>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    hub.sessions.listening_on(listener.local_addr()?);
    let recovery = (hub.config.recovery_interval_ms > 0).then(|| {
        let h = hub.clone();
        let stop = shutdown.child_token();
        tokio::spawn(async move { h.background_recovery(stop).await })
    });
    let saves = {
        let (h, stop) = (hub.clone(), shutdown.child_token());
        tokio::spawn(async move { h.session_saves(stop).await })
    };
    let sweeps = {
        let (h, stop) = (hub.clone(), shutdown.child_token());
        tokio::spawn(async move { h.session_sweeps(stop).await })
    };
    let maintenance = {
        let (h, stop) = (hub.clone(), shutdown.child_token());
        tokio::spawn(async move { h.background_maintenance(stop).await })
    };
    let metrics = match hub.config.metrics_addr()? {
        server_kit::listen::MetricsListen::Own(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (metrics)"))?;
            tracing::info!(%addr, "metrics listening");
            let (app, stop) = (api::metrics_router(hub.clone()), shutdown.clone());
            Some(tokio::spawn(async move {
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move { stop.cancelled().await })
                    .await
            }))
        }
        _ => None,
    };
    let session_origin = session_listener.map(|l| {
        let (app, stop) = (api::session_router(hub.clone()), shutdown.clone());
        tokio::spawn(async move {
            axum::serve(server_kit::runtime::nodelay(l), app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await
        })
    });
    let app = api::router(hub.clone());
    let stop = shutdown.clone();
    let result = axum::serve(server_kit::runtime::nodelay(listener), app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await;
    shutdown.cancel();
    if let Some(t) = metrics {
        let _ = t.await;
    }
    if let Some(t) = session_origin {
        let _ = t.await;
    }
    if let Some(t) = recovery {
        let _ = t.await;
    }
    let _ = saves.await;
    let _ = sweeps.await;
    let _ = maintenance.await;
    // Save and stop every sandbox this process runs before it goes.
    hub.shutdown_sessions().await;
    hub.close().await;
    result.context("the hub's HTTP server failed")
}
