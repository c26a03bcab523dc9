//! The notebook hub: catalog, projects, notebooks, versions and workspaces, stored as UniCAS
//! nodes through `cas-client` and retained by root refs.
//!
//! The hub is one App of the CAS with its own signing key; each project is one Space, so
//! identical content is stored once per project and usage is per project. It never reads the
//! CAS's tables or objects: everything goes through the data-plane API. Its own database holds
//! only mutable pointers and indexes (see `migrations/hub-*`).

#![forbid(unsafe_code)]

pub mod api;
pub mod auth;
pub mod catalog;
pub mod cli;
pub mod config;
pub mod db;
pub mod error;
pub mod ids;
pub mod keys;
pub mod lock;
pub mod notebooks;
pub mod outbox;
pub mod spool;
pub mod sync;
pub mod transfer;
pub mod workspace;

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cas_client::{AppCasClient, FixedToken, RetryPolicy, SigningKey};
use tokio_util::sync::CancellationToken;

use crate::catalog::SnapshotCache;
use crate::config::{AuthMode, HubConfig};
use crate::db::{Db, Dialect};
use crate::lock::Locks;

/// Named failpoints for crash tests (see `cas_service::failpoint`).
pub(crate) mod failpoint {
    use crate::error::{HubError, HubResult};

    pub async fn hit(name: &str) -> HubResult<()> {
        if cas_service::failpoint::hit(name).await {
            return Err(HubError::internal("failpoint", name));
        }
        Ok(())
    }
}

pub struct HubState {
    pub config: HubConfig,
    pub db: Db,
    pub locks: Locks,
    pub cas: AppCasClient,
    pub(crate) snapshots: SnapshotCache,
    pub spools: spool::Spools,
    /// The hosts the hub answers to.
    pub allowed_hosts: cas_service::web_guard::AllowedHosts,
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
    /// Connects the database (applying migrations) and builds a client of the CAS at `cas_url`
    /// signing with the hub's key. With `cas_url` `None`, the hub can only do local work
    /// (operator commands).
    pub async fn open(config: HubConfig, cas_url: Option<&str>) -> anyhow::Result<Hub> {
        let db = Db::connect(&config).await?;
        db.migrate().await?;
        let locks = match db.dialect {
            Dialect::Sqlite => Locks::files(config.lock_dir())
                .with_context(|| format!("cannot create {}", config.lock_dir().display()))?,
            Dialect::Postgres => Locks::postgres(db.url())
                .await
                .context("cannot connect the lock pool")?,
        };
        let app = config
            .app
            .parse()
            .map_err(|e| anyhow::anyhow!("bad App id: {e}"))?;
        let cas = match cas_url {
            Some(url) => {
                let pem =
                    keys::load_or_create(&config.signing_key_path(), config.signing_key.is_none())?;
                let key = SigningKey::from_pem(&pem, &config.kid, &config.issuer, &config.audience)
                    .map_err(|e| anyhow::anyhow!("the hub's signing key: {e}"))?;
                AppCasClient::new(url, app, Arc::new(key))
            }
            None => AppCasClient::new(
                "http://127.0.0.1:9",
                app,
                Arc::new(FixedToken(String::new())),
            ),
        }
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .with_retry(RetryPolicy::default())
        .with_cache(64 << 20);
        Ok(Hub(Arc::new(HubState {
            spools: spool::Spools::new(&config),
            allowed_hosts: config.host_allow_list()?,
            config,
            db,
            locks,
            cas,
            snapshots: SnapshotCache::new(64 << 20),
        })))
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
        self.db.close().await;
    }
}

/// Serves the hub on `listener` until `shutdown` is cancelled.
pub async fn run_hub(
    hub: Hub,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let recovery = (hub.config.recovery_interval_ms > 0).then(|| {
        let h = hub.clone();
        let stop = shutdown.child_token();
        tokio::spawn(async move { h.background_recovery(stop).await })
    });
    let app = api::router(hub.clone());
    let stop = shutdown.clone();
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await;
    shutdown.cancel();
    if let Some(t) = recovery {
        let _ = t.await;
    }
    hub.close().await;
    result.context("the hub's HTTP server failed")
}
