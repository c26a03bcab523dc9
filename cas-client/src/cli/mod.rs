//! The `unicas` command line. Commands print results on stdout and nothing else; a failure
//! prints one line `unicas: <reason>` on stderr, nothing on stdout, and exits non-zero
//! (1 for bad input or a failed check, 2 for a usage error).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use cas_format::{AppId, SpaceId};
use clap::{Args, Parser, Subcommand};

use crate::capability::SigningKey;

mod offline;
mod online;

/// UniCAS content-addressed storage: hash, encode, verify, and move node DAGs.
#[derive(Debug, Parser)]
#[command(name = "unicas", version, about)]
pub struct Cli {
    /// Print machine-readable JSON instead of plain lines.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(flatten)]
    pub connection: Connection,

    #[command(subcommand)]
    pub command: Command,
}

/// Where the service is and who speaks to it. Each option also comes from its `UNICAS_*`
/// variable.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// Base URL of the service.
    #[arg(
        long,
        global = true,
        env = "UNICAS_SERVER",
        default_value = "http://127.0.0.1:8080"
    )]
    pub server: String,
    /// The App.
    #[arg(long, global = true, env = "UNICAS_APP")]
    pub app: Option<AppId>,
    /// The Space.
    #[arg(long, global = true, env = "UNICAS_SPACE")]
    pub space: Option<SpaceId>,
    /// A capability to send as is (instead of a signing key).
    #[arg(
        long,
        global = true,
        env = "UNICAS_TOKEN",
        hide_env_values = true,
        conflicts_with = "signing_key"
    )]
    pub token: Option<String>,
    /// The App issuer's PKCS#8 PEM private key (Ed25519, P-256 or RSA); capabilities are minted
    /// with it, the algorithm following from the key.
    #[arg(
        long,
        global = true,
        env = "UNICAS_SIGNING_KEY",
        value_name = "PEM_FILE"
    )]
    pub signing_key: Option<PathBuf>,
    /// The `kid` of the signing key.
    #[arg(long, global = true, env = "UNICAS_KID")]
    pub kid: Option<String>,
    /// The issuer (`iss`) of minted capabilities.
    #[arg(long, global = true, env = "UNICAS_ISSUER")]
    pub issuer: Option<String>,
    /// The audience (`aud`) of minted capabilities.
    #[arg(long, global = true, env = "UNICAS_AUDIENCE", default_value = "unicas")]
    pub audience: String,
}

impl Connection {
    pub fn app(&self) -> anyhow::Result<AppId> {
        self.app
            .clone()
            .context("--app (or UNICAS_APP) is required")
    }

    pub fn space(&self) -> anyhow::Result<SpaceId> {
        self.space
            .clone()
            .context("--space (or UNICAS_SPACE) is required")
    }

    /// The signing key named by `--signing-key`, `--kid` and `--issuer`.
    pub fn signing_key(&self) -> anyhow::Result<SigningKey> {
        let path = self
            .signing_key
            .as_ref()
            .context("--signing-key (or UNICAS_SIGNING_KEY) is required")?;
        let pem = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let kid = self
            .kid
            .clone()
            .context("--kid (or UNICAS_KID) is required with --signing-key")?;
        let issuer = self
            .issuer
            .clone()
            .context("--issuer (or UNICAS_ISSUER) is required with --signing-key")?;
        Ok(SigningKey::from_pem(
            &pem,
            kid,
            issuer,
            self.audience.clone(),
        )?)
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the node hash of FILE (or stdin) as own content with the given ordered refs.
    Hash(offline::HashArgs),
    /// Convert SValues between their JSON form and canonical CBOR.
    #[command(subcommand)]
    Svalue(offline::SvalueCommand),
    /// Inspect archives offline.
    #[command(subcommand)]
    Archive(offline::ArchiveCommand),
    /// Build portable nodes offline.
    #[command(subcommand)]
    Node(offline::NodeCommand),
    /// Print a capability for --space minted with --signing-key (for curl and scripts).
    Token(offline::TokenArgs),
    /// Store a file (chunked when large); print its node hash.
    Put {
        file: PathBuf,
        #[command(flatten)]
        store: online::StoreOptions,
    },
    /// Write the file stored at HASH to stdout or to a file.
    Get {
        hash: cas_format::Hash,
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Show a node's metadata and state.
    Stat { hash: cas_format::Hash },
    /// Store and fetch directory trees.
    #[command(subcommand)]
    Tree(online::TreeCommand),
    /// Root references of the Space.
    #[command(subcommand)]
    Refs(online::RefsCommand),
    /// The Space's usage.
    Usage,
    /// Run one bounded GC pass over the Space.
    Gc {
        #[arg(long)]
        max_nodes: Option<u32>,
    },
    /// Write ROOTs and everything below them to an archive.
    Export {
        #[arg(required = true)]
        roots: Vec<cas_format::Hash>,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Verify an archive, store what the Space lacks, and optionally retain its roots.
    Import {
        file: PathBuf,
        /// Acquire one root ref per root once every node is stored.
        #[arg(long)]
        retain: bool,
        /// The request id of that root-ref update (required with --retain).
        #[arg(long)]
        request_id: Option<cas_format::RequestId>,
        #[command(flatten)]
        store: online::StoreOptions,
    },
}

/// Runs the command line and maps the outcome to an exit status.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // Not locked here: `get` streams to stdout from another thread.
    let mut stdout = std::io::stdout();
    match run(cli, &mut stdout) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the chain of causes joined, newlines flattened.
            let reason = format!("{e:#}").replace('\n', " ");
            let _ = writeln!(std::io::stderr(), "unicas: {reason}");
            ExitCode::FAILURE
        }
    }
}

async fn run_online(command: Command, c: &Connection, json: bool) -> anyhow::Result<Vec<u8>> {
    match command {
        Command::Put { file, store } => online::put(c, json, file, store).await,
        Command::Get { hash, output } => online::get(c, hash, output).await,
        Command::Stat { hash } => online::stat(c, json, hash).await,
        Command::Tree(cmd) => online::tree(c, json, cmd).await,
        Command::Refs(cmd) => online::refs(c, json, cmd).await,
        Command::Usage => online::usage(c, json).await,
        Command::Gc { max_nodes } => online::gc(c, json, max_nodes).await,
        Command::Export { roots, output } => online::export(c, json, roots, output).await,
        Command::Import {
            file,
            retain,
            request_id,
            store,
        } => online::import(c, json, file, retain, request_id, store).await,
        Command::Hash(_)
        | Command::Svalue(_)
        | Command::Archive(_)
        | Command::Node(_)
        | Command::Token(_) => {
            anyhow::bail!("not an online command")
        }
    }
}

/// Runs one command, writing its result to `out` only once it has fully succeeded.
pub fn run(cli: Cli, out: &mut dyn Write) -> anyhow::Result<()> {
    let output = match cli.command {
        Command::Hash(args) => offline::hash(args, cli.json)?,
        Command::Svalue(cmd) => offline::svalue(cmd, cli.json)?,
        Command::Archive(cmd) => offline::archive(cmd, cli.json)?,
        Command::Node(cmd) => offline::node(cmd)?,
        Command::Token(args) => offline::token(args, &cli.connection)?,
        online => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(4)
                .enable_all()
                .build()
                .context("cannot start the runtime")?;
            runtime.block_on(run_online(online, &cli.connection, cli.json))?
        }
    };
    out.write_all(&output)?;
    out.flush()?;
    Ok(())
}
