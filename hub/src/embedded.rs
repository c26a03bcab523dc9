//! The CAS service embedded in `unicas-hub serve` (the one-command default): started on its own
//! listener with its own configuration (`UNICAS_*`, as `unicas-server` reads it), with the
//! hub's App and signing key registered through the service's public API.

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::config::HubConfig;
use crate::keys;

/// Starts the embedded CAS until `stop`; answers its public URL, its task and the lines
/// `serve` prints about it.
pub async fn start(
    config: &HubConfig,
    stop: CancellationToken,
) -> anyhow::Result<(
    String,
    tokio::task::JoinHandle<anyhow::Result<()>>,
    Vec<String>,
)> {
    let cas_config = cas_service::config::Config::load(None)?;
    let addr = cas_config.listen_addr()?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} (the embedded CAS)"))?;
    let bound = listener.local_addr()?;
    let svc = cas_service::Service::open(cas_config.with_bound_addr(bound)).await?;
    let app: cas_format::AppId = config
        .app
        .parse()
        .map_err(|e| anyhow::anyhow!("bad App id: {e}"))?;
    let pem = keys::load_or_create(&config.signing_key_path(), config.signing_key.is_none())?;
    let public = keys::ed25519_public_pem(&pem)?;
    let created = svc
        .ensure_app_key(&app, &config.issuer, &config.kid, "EdDSA", &public)
        .await
        .context("registering the hub's App in the embedded CAS")?;
    if created.app {
        tracing::info!(app = %app, "created the hub's App in the CAS");
    }
    if created.key {
        tracing::info!(kid = %config.kid, "registered the hub's key in the CAS");
    }
    let mut lines = vec![
        format!("cas listening on http://{bound}"),
        format!("admin UI at {}/admin/ui/", svc.public_url()),
    ];
    if svc.meta.count_accounts().await? == 0 {
        lines.push(format!(
            "admin login link: {}",
            cas_service::admin::login_link(&svc).await?
        ));
    }
    let url = svc.public_url().to_string();
    let task = tokio::spawn(async move { cas_service::run_service(svc, listener, stop).await });
    Ok((url, task, lines))
}
