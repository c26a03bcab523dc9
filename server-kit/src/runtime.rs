//! Running a command of a server program to its exit code.

use std::process::ExitCode;

/// Runs `command` on a multi-threaded runtime; prints an error as one line on stderr, prefixed
/// with `program`, and answers the exit code.
pub fn run_to_exit(
    program: &str,
    command: impl std::future::Future<Output = anyhow::Result<()>>,
) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{program}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}
