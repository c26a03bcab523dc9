//! The UniCAS HTTP service: the data plane `/v1/cas/*`, capability auth, the metadata and
//! object storage ports, the lease state machine and garbage collection.
//!
//! `main` is thin: it parses configuration and calls [`serve_with_listener`], which tests call
//! too, on port 0.
#![forbid(unsafe_code)]

use std::num::NonZeroU32;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cas_format::AppId;
use governor::{DefaultKeyedRateLimiter, Quota};
use tokio_util::sync::CancellationToken;

pub mod admin;
mod adopt;
pub mod api;
pub mod auth;
mod base64_runs;
pub mod blob;
pub mod capability;
pub mod cli;
mod compressibility;
pub mod config;
pub mod delta;
mod encode;
pub mod error;
pub mod fsck;
pub mod gc;
mod lease;
mod lease_batch;
pub mod lease_memo;
mod materialize;
pub mod meta;
pub mod metrics;
pub mod pack;
mod pack_object;
pub mod read;
pub mod root_refs;
pub mod staging;
mod stored_bytes;
pub mod upload;

use crate::auth::Registry;
use crate::blob::BlobStore;
use crate::config::Config;
use crate::error::{ApiError, ApiResult};
use crate::meta::MetaStore;
use crate::metrics::Metrics;
use crate::upload::UploadSigner;

pub use server_kit::now_ms;
use server_kit::{failpoint, web_guard};

/// Everything a request handler needs.
pub struct ServiceState {
    pub config: Config,
    pub meta: MetaStore,
    pub blobs: BlobStore,
    pub registry: Registry,
    pub signer: UploadSigner,
    pub metrics: Arc<Metrics>,
    /// Bounds concurrent validations (memory and spool space).
    pub validations: tokio::sync::Semaphore,
    /// Bounds content held in memory to be encoded, or rebuilt through a delta chain.
    pub in_memory: tokio::sync::Semaphore,
    /// Outbound HTTP (OpenID Connect providers).
    pub http: reqwest::Client,
    pub oidc: server_kit::oidc::OidcClient,
    /// Root-ref updates waiting to be applied, by partition.
    pub root_ref_queues: root_refs::RootRefQueues,
    /// Ready nodes' leases as last seen, for renewals that need no store read.
    pub leases: lease_memo::LeaseMemo,
    /// Verified contents of delta bases.
    pub bases: delta::BaseCache,
    /// The hosts the admin plane answers to.
    pub allowed_hosts: web_guard::AllowedHosts,
    public_url: String,
    app_limiter: Option<DefaultKeyedRateLimiter<String>>,
}

/// What [`Service::ensure_app_key`] created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Registered {
    pub app: bool,
    pub key: bool,
}

/// A cheap handle to the service.
#[derive(Clone)]
pub struct Service(Arc<ServiceState>);

impl Deref for Service {
    type Target = ServiceState;
    fn deref(&self) -> &ServiceState {
        &self.0
    }
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Service {
    /// Connects the stores (applying pending migrations) and builds the service.
    pub async fn open(config: Config) -> anyhow::Result<Service> {
        let metrics = Arc::new(Metrics::default());
        let meta = MetaStore::connect_observed(&config, Some(metrics.commit_observer())).await?;
        meta.migrate().await?;
        let observed = metrics.clone();
        let blobs =
            BlobStore::open(&config)
                .await?
                .observed(Arc::new(move |operation, ok, took| {
                    observed.object_store(operation, ok, took)
                }));
        let key = meta
            .secret("upload-url")
            .await
            .context("cannot read the upload signing secret")?;
        let public_url = config.public_url()?;
        let signer = UploadSigner::new(key, public_url.clone());
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .context("cannot build the HTTP client")?;
        let registry = Registry::new(
            meta.clone(),
            Duration::from_millis(config.auth_cache_ms.max(1)),
        );
        let app_limiter = NonZeroU32::new(config.rate_limit_per_app.min(u32::MAX as u64) as u32)
            .map(|rate| {
                let burst = NonZeroU32::new(rate.get().saturating_mul(2)).unwrap_or(rate);
                DefaultKeyedRateLimiter::keyed(Quota::per_second(rate).allow_burst(burst))
            });
        let allowed_hosts = config.host_allow_list()?;
        let bases = delta::BaseCache::new(config.delta_cache_bytes);
        Ok(Service(Arc::new(ServiceState {
            allowed_hosts,
            validations: tokio::sync::Semaphore::new(config.max_concurrent_validations),
            in_memory: tokio::sync::Semaphore::new(config.max_concurrent_validations),
            config,
            meta,
            blobs,
            registry,
            signer,
            metrics,
            app_limiter,
            http: http.clone(),
            oidc: server_kit::oidc::OidcClient::new(http.clone()),
            root_ref_queues: root_refs::RootRefQueues::default(),
            leases: lease_memo::LeaseMemo::default(),
            bases,
            public_url,
        })))
    }

    /// Makes sure `app` exists with `issuer` and holds the active key `kid` (`alg`, the public
    /// key `public_pem`), creating what is missing: how a program that embeds the service (the
    /// hub) registers itself. Answers what it created; refuses an App whose issuer differs.
    pub async fn ensure_app_key(
        &self,
        app: &AppId,
        issuer: &str,
        kid: &str,
        alg: &str,
        public_pem: &str,
    ) -> anyhow::Result<Registered> {
        let algorithm = auth::parse_algorithm(alg)
            .ok_or_else(|| anyhow::anyhow!("{alg} is not EdDSA, ES256 or RS256"))?;
        auth::decoding_key(algorithm, public_pem).map_err(|e| anyhow::anyhow!(e))?;
        let now = now_ms();
        let mut created = Registered::default();
        match self.meta.get_app(app).await? {
            Some(record) if record.issuer != issuer => anyhow::bail!(
                "App {app} exists with the issuer {:?}, not {issuer:?}",
                record.issuer
            ),
            Some(_) => {}
            None => {
                self.meta.create_app(app, issuer, now).await?;
                created.app = true;
            }
        }
        let keys = self.meta.list_keys(Some(app)).await?;
        if !keys.iter().any(|k| k.kid == kid && k.revoked_at.is_none()) {
            self.meta.add_key(app, kid, alg, public_pem, now).await?;
            created.key = true;
        }
        if created.app || created.key {
            self.registry.invalidate();
        }
        Ok(created)
    }

    /// Where upload generations keep their bytes.
    pub fn staging(&self) -> staging::Staging<'_> {
        staging::Staging {
            blobs: &self.blobs,
            meta: &self.meta,
        }
    }

    /// The base URL clients reach this service at.
    pub fn public_url(&self) -> &str {
        &self.public_url
    }

    /// Per-App rate limiting, after authentication.
    pub fn limit_app(&self, app: &AppId) -> ApiResult<()> {
        let Some(limiter) = &self.app_limiter else {
            return Ok(());
        };
        match limiter.check_key(&app.as_str().to_string()) {
            Ok(()) => Ok(()),
            Err(not_until) => {
                let wait = not_until.wait_time_from(governor::clock::Clock::now(
                    &governor::clock::DefaultClock::default(),
                ));
                Err(ApiError::too_many(
                    "RATE_LIMITED",
                    "too many requests for this App",
                    wait.as_secs() + 1,
                ))
            }
        }
    }
}

/// Serves the service on `listener` until `shutdown` is cancelled; the background collector
/// stops with it.
pub async fn serve_with_listener(
    config: Config,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let addr = listener.local_addr().context("listener has no address")?;
    let svc = Service::open(config.with_bound_addr(addr)).await?;
    run_service(svc, listener, shutdown).await
}

/// Serves an opened service on `listener` until `shutdown` is cancelled.
pub async fn run_service(
    svc: Service,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let collector = (svc.config.gc_interval_ms > 0).then(|| {
        let svc = svc.clone();
        let stop = shutdown.child_token();
        let interval = Duration::from_millis(svc.config.gc_interval_ms);
        tokio::spawn(async move { svc.background_gc(interval, stop).await })
    });
    let metrics = match svc.config.metrics_addr()? {
        config::MetricsListen::Own(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (metrics)"))?;
            tracing::info!(%addr, "metrics listening");
            let stop = shutdown.child_token();
            let router = api::metrics_router(svc.clone());
            Some(tokio::spawn(async move {
                api::serve(router, listener, stop).await
            }))
        }
        _ => None,
    };
    let result = api::serve(api::router(svc.clone()), listener, shutdown.clone()).await;
    shutdown.cancel();
    if let Some(task) = metrics {
        let _ = task.await;
    }
    if let Some(task) = collector {
        let _ = task.await;
    }
    svc.meta.close().await;
    result.context("the HTTP server failed")
}
