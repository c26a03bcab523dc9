//! The `unicas` command line. Commands print results on stdout and nothing else; a failure
//! prints one line `unicas: <reason>` on stderr, nothing on stdout, and exits non-zero
//! (1 for bad input or a failed check, 2 for a usage error).

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod offline;

/// UniCAS content-addressed storage: hash, encode, verify, and move node DAGs.
#[derive(Debug, Parser)]
#[command(name = "unicas", version, about)]
pub struct Cli {
    /// Print machine-readable JSON instead of plain lines.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
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
}

/// Runs the command line and maps the outcome to an exit status.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut stdout = std::io::stdout().lock();
    match run(cli, &mut stdout) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            drop(stdout);
            // One line: the chain of causes joined, newlines flattened.
            let reason = format!("{e:#}").replace('\n', " ");
            let _ = writeln!(std::io::stderr(), "unicas: {reason}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one command, writing its result to `out` only once it has fully succeeded.
pub fn run(cli: Cli, out: &mut dyn Write) -> anyhow::Result<()> {
    let output = match cli.command {
        Command::Hash(args) => offline::hash(args, cli.json)?,
        Command::Svalue(cmd) => offline::svalue(cmd, cli.json)?,
        Command::Archive(cmd) => offline::archive(cmd, cli.json)?,
    };
    out.write_all(&output)?;
    out.flush()?;
    Ok(())
}
