//! `unicas-hub`: serve (embedding the CAS service unless `UNICAS_HUB_CAS_URL` names one),
//! migrate, and operator commands on the hub database.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::config::{AuthMode, HubConfig};
use crate::{Hub, keys, run_hub};

/// The UniCAS notebook hub.
#[derive(Debug, Parser)]
#[command(name = "unicas-hub", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply pending migrations and serve the hub (and, unless UNICAS_HUB_CAS_URL is set, the CAS
    /// service with its admin UI on its own listener) until SIGINT or SIGTERM.
    Serve,
    /// Apply pending hub migrations and exit.
    Migrate,
    /// Users of the hub.
    #[command(subcommand)]
    User(UserCommand),
    /// Personal access tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Catalog history: list kept snapshots, point the head back at one.
    #[command(subcommand)]
    Catalog(CatalogCommand),
    /// Run one maintenance pass now (retention of catalog snapshots, events, idempotency
    /// records; purges of projects whose time in the trash is over) and print what it did.
    Maintenance {
        /// The CAS service's URL (default: UNICAS_HUB_CAS_URL, else the embedded CAS of a
        /// running `unicas-hub serve`).
        #[arg(long)]
        cas_url: Option<String>,
    },
    /// Print the public key of the hub's signing key (to register it with a separate CAS:
    /// `unicas-server app add-key hub --kid hub-1 --alg EdDSA --public-key FILE`).
    PublicKey,
}

#[derive(Debug, Subcommand)]
enum UserCommand {
    /// Create a user.
    Create {
        id: String,
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        email: Option<String>,
        /// Admin on every project.
        #[arg(long)]
        super_admin: bool,
    },
    /// Print a one-time link that signs the user in to the web UI (valid for
    /// UNICAS_HUB_LOGIN_LINK_TTL, default 15 minutes).
    LoginLink { id: String },
    /// Refuse the user's tokens and end their browser sessions.
    Suspend { id: String },
    /// Lift a suspension.
    Resume { id: String },
}

#[derive(Debug, Subcommand)]
enum CatalogCommand {
    /// Kept catalog snapshots, newest first (one JSON object per line).
    List {
        /// Also those the retention pass released.
        #[arg(long)]
        all: bool,
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
    /// Point the catalog head back at a kept snapshot, as a new change with an event.
    Recover {
        snapshot: String,
        /// The CAS service's URL (default: UNICAS_HUB_CAS_URL, else the embedded CAS of a
        /// running `unicas-hub serve`).
        #[arg(long)]
        cas_url: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Create a personal access token for a user and print it (the only time it is shown).
    Create {
        #[arg(long)]
        user: String,
        #[arg(long, default_value = "cli")]
        name: String,
        #[arg(long)]
        expires_in_days: Option<u32>,
    },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("UNICAS_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    server_kit::runtime::run_to_exit("unicas-hub", run(cli))
}

fn say(line: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let config = HubConfig::from_env()?;
    match cli.command {
        Command::Serve => serve(config).await,
        Command::Migrate => {
            let hub = Hub::open(config, None).await?;
            hub.close().await;
            say("hub migrations applied");
            Ok(())
        }
        Command::PublicKey => {
            let pem =
                keys::load_or_create(&config.signing_key_path(), config.signing_key.is_none())?;
            print!("{}", keys::ed25519_public_pem(&pem)?);
            Ok(())
        }
        Command::User(cmd) => {
            let hub = Hub::open(config, None).await?;
            let r = user(&hub, cmd).await;
            hub.close().await;
            r
        }
        Command::Catalog(CatalogCommand::List { all, limit }) => {
            let hub = Hub::open(config, None).await?;
            let r = hub
                .catalog_snapshots(None, all, limit.clamp(1, 10_000))
                .await;
            hub.close().await;
            for s in r.map_err(|e| anyhow::anyhow!("{}", e.message))? {
                say(serde_json::to_string(&s)?);
            }
            Ok(())
        }
        Command::Catalog(CatalogCommand::Recover { snapshot, cas_url }) => {
            let url = cas_url_for(&config, cas_url)?;
            let hub = Hub::open(config, Some(&url)).await?;
            let r = hub.recover_catalog("operator", &snapshot).await;
            hub.close().await;
            let report = r.map_err(|e| anyhow::anyhow!("{}", e.message))?;
            say(serde_json::to_string(&report)?);
            Ok(())
        }
        Command::Maintenance { cas_url } => {
            let url = cas_url_for(&config, cas_url)?;
            let hub = Hub::open(config, Some(&url)).await?;
            let r = hub.maintenance_pass().await;
            hub.close().await;
            let report = r.map_err(|e| anyhow::anyhow!("{}", e.message))?;
            say(serde_json::to_string(&report)?);
            Ok(())
        }
        Command::Token(TokenCommand::Create {
            user,
            name,
            expires_in_days,
        }) => {
            let hub = Hub::open(config, None).await?;
            let r = hub
                .create_token(
                    &user,
                    &name,
                    expires_in_days.map(|d| i64::from(d) * 86_400_000),
                    None,
                )
                .await;
            hub.close().await;
            let (token, _) = r.map_err(|e| anyhow::anyhow!("{}", e.message))?;
            say(token);
            Ok(())
        }
    }
}

/// The CAS an operator command talks to: `--cas-url`, `UNICAS_HUB_CAS_URL`, else where the
/// embedded CAS of `unicas-hub serve` listens (it must be running).
fn cas_url_for(config: &HubConfig, given: Option<String>) -> anyhow::Result<String> {
    if let Some(u) = given.or_else(|| config.cas_url.clone()) {
        return Ok(u.trim_end_matches('/').to_string());
    }
    embedded_cas_url()
}

#[cfg(feature = "embedded-cas")]
fn embedded_cas_url() -> anyhow::Result<String> {
    let c = cas_service::config::Config::load(None)?;
    Ok(format!("http://{}", c.listen_addr()?))
}

#[cfg(not(feature = "embedded-cas"))]
fn embedded_cas_url() -> anyhow::Result<String> {
    anyhow::bail!(
        "this unicas-hub is built without the embedded CAS: pass --cas-url or set UNICAS_HUB_CAS_URL"
    )
}

async fn user(hub: &Hub, cmd: UserCommand) -> anyhow::Result<()> {
    let err = |e: crate::error::HubError| anyhow::anyhow!("{}", e.message);
    match cmd {
        UserCommand::Create {
            id,
            name,
            email,
            super_admin,
        } => {
            let name = name.unwrap_or_else(|| id.clone());
            if hub
                .create_user(&id, &name, email.as_deref(), super_admin)
                .await
                .map_err(err)?
            {
                say(format_args!("created user {id}"));
            } else {
                anyhow::bail!("user {id} already exists");
            }
        }
        UserCommand::LoginLink { id } => {
            say(hub.login_link(&id).await.map_err(err)?);
        }
        UserCommand::Suspend { id } => {
            if !hub.set_suspended(&id, true).await.map_err(err)? {
                anyhow::bail!("no user {id}");
            }
            say(format_args!("suspended user {id}"));
        }
        UserCommand::Resume { id } => {
            if !hub.set_suspended(&id, false).await.map_err(err)? {
                anyhow::bail!("no user {id}");
            }
            say(format_args!("resumed user {id}"));
        }
    }
    Ok(())
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}

async fn serve(mut config: HubConfig) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        signal.cancel();
    });
    let hub_addr = config.listen_addr()?;
    let hub_listener = tokio::net::TcpListener::bind(hub_addr)
        .await
        .with_context(|| format!("cannot listen on {hub_addr}"))?;
    let hub_bound = hub_listener.local_addr()?;
    // Links this process prints or redirects to name the port it really listens on.
    config.listen = hub_bound.to_string();
    let session_listener = match config.session_addr()? {
        Some(addr) => {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (sessions)"))?;
            let bound = l.local_addr()?;
            config
                .session_url
                .get_or_insert_with(|| format!("http://{bound}"));
            Some((l, bound))
        }
        None => None,
    };

    // The CAS: a separate service, or embedded with its own listener and public URL.
    let (cas_url, cas_task, lines) = match &config.cas_url {
        Some(url) => (url.clone(), None, Vec::new()),
        None => embedded_cas(&config, &shutdown).await?,
    };
    let hub = Hub::open(config.clone(), Some(&cas_url)).await?;
    hub.start().await?;
    // Printed before the hub says it listens: whoever waits for that line has the token too.
    if config.auth == AuthMode::Token
        && let Some(token) = first_admin_token(&hub)
            .await
            .map_err(|e| anyhow::anyhow!("{}", e.message))?
    {
        say(format_args!("admin token: {token}"));
    }
    if config.auth == AuthMode::Token
        && let Ok(link) = hub.login_link(FIRST_ADMIN).await
    {
        say(format_args!(
            "sign in to the web UI (once, within {} minutes): {link}",
            config.web.login_link_ttl_ms / 60_000
        ));
    }
    say(format_args!("hub listening on http://{hub_bound}"));
    if let Some((_, bound)) = &session_listener {
        say(format_args!("sessions listening on http://{bound}"));
    }
    for l in lines {
        say(l);
    }
    let result = run_hub(
        hub,
        hub_listener,
        session_listener.map(|(l, _)| l),
        shutdown.clone(),
    )
    .await;
    shutdown.cancel();
    if let Some(t) = cas_task {
        match t.await {
            Ok(r) => r?,
            Err(e) => anyhow::bail!("the embedded CAS failed: {e}"),
        }
    }
    result
}

/// The embedded CAS: its URL, its task, and the lines to print.
#[cfg(feature = "embedded-cas")]
async fn embedded_cas(
    config: &HubConfig,
    shutdown: &CancellationToken,
) -> anyhow::Result<(String, Option<CasTask>, Vec<String>)> {
    let (url, task, lines) = crate::embedded::start(config, shutdown.child_token()).await?;
    Ok((url, Some(task), lines))
}

#[cfg(not(feature = "embedded-cas"))]
async fn embedded_cas(
    _config: &HubConfig,
    _shutdown: &CancellationToken,
) -> anyhow::Result<(String, Option<CasTask>, Vec<String>)> {
    anyhow::bail!(
        "this unicas-hub is built without the embedded CAS (feature embedded-cas): set UNICAS_HUB_CAS_URL"
    )
}

/// The task of an embedded CAS service.
type CasTask = tokio::task::JoinHandle<anyhow::Result<()>>;

/// The super admin a hub makes on its first start.
const FIRST_ADMIN: &str = "admin";

/// On a hub without users, an administrator and a token for it; `None`
/// when users exist already.
async fn first_admin_token(hub: &Hub) -> crate::error::HubResult<Option<String>> {
    if hub.has_users().await? {
        return Ok(None);
    }
    hub.create_user(FIRST_ADMIN, "Administrator", None, true)
        .await?;
    let (token, _) = hub
        .create_token(FIRST_ADMIN, "first start", None, None)
        .await?;
    Ok(Some(token))
}
