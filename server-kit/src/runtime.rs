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

/// `listener` with `TCP_NODELAY` on every connection it accepts. Without it a small answer
/// written in two parts waits for the peer's delayed ACK (about 40 ms): ruinous for clients
/// that make many small requests one after another, and for a proxy.
pub fn nodelay(
    listener: tokio::net::TcpListener,
) -> axum::serve::TapIo<tokio::net::TcpListener, fn(&mut tokio::net::TcpStream)> {
    use axum::serve::ListenerExt;
    fn set(tcp: &mut tokio::net::TcpStream) {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY");
        }
    }
    listener.tap_io(set as fn(&mut tokio::net::TcpStream))
}
