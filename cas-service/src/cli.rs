//! `unicas-server`: serve, migrate, check the configuration, and operator commands that act
//! on the database directly.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use cas_format::{AppId, SpaceId};
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::auth::{decoding_key, parse_algorithm};
use crate::config::{Config, redact_url};
use crate::meta::MetaStore;
use crate::{Service, now_ms, run_service};

/// The UniCAS service.
#[derive(Debug, Parser)]
#[command(name = "unicas-server", version, about)]
pub struct Cli {
    /// TOML configuration file (also `UNICAS_CONFIG`); `UNICAS_*` variables override it.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply pending migrations and serve until SIGINT or SIGTERM.
    Serve,
    /// Apply pending migrations and exit.
    Migrate,
    /// Print the effective configuration (secrets redacted) and check that the stores answer.
    CheckConfig,
    /// Manage Apps, their issuers and keys.
    #[command(subcommand)]
    App(AppCommand),
    /// Check that metadata and objects agree; exit non-zero on any inconsistency.
    Fsck {
        #[arg(long)]
        app: AppId,
        #[arg(long)]
        space: Option<SpaceId>,
        /// Adopt orphan objects an upload's evidence proves; delete other orphans past their
        /// grace period.
        #[arg(long)]
        repair_orphans: bool,
        /// Skip reading objects to check their hashes.
        #[arg(long)]
        no_content: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Administrators of the admin plane.
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Run GC passes over one Space until a pass deletes nothing.
    Gc {
        #[arg(long)]
        app: AppId,
        #[arg(long)]
        space: SpaceId,
        /// Nodes examined per pass.
        #[arg(long, default_value_t = 1000)]
        max_nodes: u32,
    },
}

#[derive(Debug, Subcommand)]
enum AdminCommand {
    /// Print (as the last line) a one-time, short-lived URL that signs the local operator in.
    LoginLink,
    /// Create an administrator account that signs in with OpenID Connect by its email.
    AddAccount {
        #[arg(long)]
        email: String,
        #[arg(long)]
        name: Option<String>,
        /// Grant platform administration (every App, creating Apps).
        #[arg(long)]
        platform_admin: bool,
        /// Make the account a member of this App.
        #[arg(long)]
        app: Option<AppId>,
    },
    /// Block an account: it can no longer sign in, its sessions end.
    Block { email: String },
    /// Lift a block.
    Unblock { email: String },
}

#[derive(Debug, Subcommand)]
enum AppCommand {
    /// Register an App and the issuer (`iss`) its capabilities carry.
    Create {
        app: AppId,
        #[arg(long)]
        issuer: String,
    },
    /// Register a public key of the App's issuer.
    AddKey {
        app: AppId,
        #[arg(long)]
        kid: String,
        /// EdDSA, ES256 or RS256.
        #[arg(long)]
        alg: String,
        /// PEM file of the public key (SPKI).
        #[arg(long, value_name = "PEM_FILE")]
        public_key: PathBuf,
    },
    /// Revoke a key: capabilities signed with it are refused.
    RevokeKey {
        app: AppId,
        #[arg(long)]
        kid: String,
    },
    /// Deny every data-plane call of the App with 403 APP_SUSPENDED.
    Suspend { app: AppId },
    /// Lift a suspension.
    Resume { app: AppId },
    /// List Apps and their keys.
    List,
}

/// Runs the command line.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    server_kit::runtime::run_to_exit("unicas-server", run(cli))
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("UNICAS_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn say(line: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn open_meta(config: &Config) -> anyhow::Result<MetaStore> {
    let meta = MetaStore::connect(config).await?;
    meta.migrate().await?;
    Ok(meta)
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let config = Config::load(cli.config.as_deref())?;
    match cli.command {
        Command::Serve => serve(config).await,
        Command::Migrate => {
            open_meta(&config).await?;
            say("migrations applied");
            Ok(())
        }
        Command::CheckConfig => check_config(config).await,
        Command::Admin(cmd) => admin(config, cmd).await,
        Command::App(cmd) => app(config, cmd).await,
        Command::Fsck {
            app,
            space,
            repair_orphans,
            no_content,
            json,
        } => {
            let svc = Service::open(config).await?;
            let report = svc
                .fsck(&crate::fsck::FsckOptions {
                    app,
                    space,
                    repair_orphans,
                    verify_content: !no_content,
                })
                .await?;
            if json {
                say(serde_json::to_string(&report)?);
            } else {
                for f in &report.findings {
                    let level = if f.inconsistent { "ERROR" } else { "note " };
                    say(format_args!("{level} {}: {}", f.kind, f.detail));
                }
                say(format_args!(
                    "{} nodes, {} objects checked; {} adopted, {} deleted; {}",
                    report.nodes_checked,
                    report.objects_listed,
                    report.orphans_adopted,
                    report.orphans_deleted,
                    if report.is_consistent() {
                        "consistent"
                    } else {
                        "INCONSISTENT"
                    }
                ));
            }
            if !report.is_consistent() {
                bail!("fsck found inconsistencies");
            }
            Ok(())
        }
        Command::Gc {
            app,
            space,
            max_nodes,
        } => {
            let svc = Service::open(config).await?;
            let (mut deleted, mut reclaimed, mut examined) = (0, 0, 0);
            for _ in 0..100_000 {
                let pass = svc
                    .gc_pass(&app, &space, max_nodes.clamp(1, 10_000))
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                examined += pass.examined;
                deleted += pass.deleted;
                reclaimed += pass.reclaimed_content_bytes;
                if pass.deleted == 0 {
                    break;
                }
            }
            say(serde_json::json!({
                "examined": examined, "deleted": deleted, "reclaimedContentBytes": reclaimed
            }));
            Ok(())
        }
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let addr = config.listen_addr()?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        signal.cancel();
    });
    let svc = Service::open(config.with_bound_addr(bound)).await?;
    // Scripts and tests read the address from this line.
    say(format_args!("listening on http://{bound}"));
    if svc.meta.count_accounts().await? == 0 {
        // First start: the way in for the local operator, as the last line.
        say(crate::admin::login_link(&svc).await?);
    }
    run_service(svc, listener, shutdown).await
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
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
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

async fn check_config(config: Config) -> anyhow::Result<()> {
    say(format_args!("listen        {}", config.listen));
    say(format_args!("public_url    {}", config.public_url()?));
    say(format_args!(
        "database_url  {}",
        redact_url(&config.database_url()?)
    ));
    say(format_args!("blob_store    {}", config.blob_store()?));
    say(format_args!("audience      {}", config.audience));
    say(format_args!(
        "leases        {}..{} ms; gc every {} ms",
        config.lease_min_ms, config.lease_max_ms, config.gc_interval_ms
    ));
    let meta = MetaStore::connect(&config).await?;
    if !meta.ping().await {
        bail!("the database does not answer");
    }
    let blobs = crate::blob::BlobStore::open(&config).await?;
    if !blobs.ping().await {
        bail!("the object store does not answer");
    }
    say("database and object store answer");
    Ok(())
}

async fn admin(config: Config, cmd: AdminCommand) -> anyhow::Result<()> {
    let now = now_ms();
    match cmd {
        AdminCommand::LoginLink => {
            let svc = Service::open(config).await?;
            say(crate::admin::login_link(&svc).await?);
        }
        AdminCommand::AddAccount {
            email,
            name,
            platform_admin,
            app,
        } => {
            let meta = open_meta(&config).await?;
            let email = email.trim().to_ascii_lowercase();
            if !email.contains('@') {
                bail!("--email must be an email address");
            }
            let account = match meta.account_by_email(&email).await? {
                Some(a) => a,
                None => {
                    meta.create_account(
                        &ulid::Ulid::generate().to_string(),
                        name.as_deref().unwrap_or(&email),
                        Some(&email),
                        platform_admin,
                        now,
                    )
                    .await?
                }
            };
            if let Some(app) = app {
                if meta.get_app(&app).await?.is_none() {
                    bail!("App {app} does not exist");
                }
                meta.add_member(&app, &account.id, now).await?;
            }
            say(format_args!("account {} ({email})", account.id));
        }
        AdminCommand::Block { email } => set_blocked(&config, &email, true, now).await?,
        AdminCommand::Unblock { email } => set_blocked(&config, &email, false, now).await?,
    }
    Ok(())
}

async fn set_blocked(config: &Config, email: &str, blocked: bool, now: i64) -> anyhow::Result<()> {
    let meta = open_meta(config).await?;
    let account = meta
        .account_by_email(email)
        .await?
        .with_context(|| format!("no account with email {email}"))?;
    meta.set_account_blocked(&account.id, blocked, now).await?;
    say(format_args!(
        "{} account {}",
        if blocked { "blocked" } else { "unblocked" },
        account.id
    ));
    Ok(())
}

async fn app(config: Config, cmd: AppCommand) -> anyhow::Result<()> {
    let meta = open_meta(&config).await?;
    let now = now_ms();
    match cmd {
        AppCommand::Create { app, issuer } => {
            if issuer.trim().is_empty() || issuer.len() > 1024 {
                bail!("the issuer must be 1..=1024 characters");
            }
            meta.create_app(&app, &issuer, now).await?;
            say(format_args!("created App {app} with issuer {issuer}"));
        }
        AppCommand::AddKey {
            app,
            kid,
            alg,
            public_key,
        } => {
            let Some(algorithm) = parse_algorithm(&alg) else {
                bail!("--alg must be EdDSA, ES256 or RS256");
            };
            if kid.is_empty() || kid.len() > 256 {
                bail!("--kid must be 1..=256 characters");
            }
            let pem = std::fs::read_to_string(&public_key)
                .with_context(|| format!("cannot read {}", public_key.display()))?;
            decoding_key(algorithm, &pem).map_err(|e| anyhow::anyhow!(e))?;
            meta.add_key(&app, &kid, &alg, &pem, now).await?;
            say(format_args!("added key {kid} ({alg}) to App {app}"));
        }
        AppCommand::RevokeKey { app, kid } => {
            meta.revoke_key(&app, &kid, now).await?;
            say(format_args!("revoked key {kid} of App {app}"));
        }
        AppCommand::Suspend { app } => {
            let changed = meta.set_suspended(&app, true, now).await?;
            say(if changed {
                format!("suspended App {app}")
            } else {
                format!("App {app} was already suspended")
            });
        }
        AppCommand::Resume { app } => {
            let changed = meta.set_suspended(&app, false, now).await?;
            say(if changed {
                format!("resumed App {app}")
            } else {
                format!("App {app} was not suspended")
            });
        }
        AppCommand::List => {
            let keys = meta.list_keys(None).await?;
            for a in meta.list_apps().await? {
                let status = if a.suspended { "suspended" } else { "active" };
                say(format_args!(
                    "{}\t{}\t{status}\trevision {}",
                    a.app_id, a.issuer, a.revision
                ));
                for k in keys.iter().filter(|k| k.app_id == a.app_id) {
                    let state = if k.revoked_at.is_some() {
                        "revoked"
                    } else {
                        "active"
                    };
                    say(format_args!("  key {}\t{}\t{state}", k.kid, k.alg));
                }
            }
        }
    }
    Ok(())
}
