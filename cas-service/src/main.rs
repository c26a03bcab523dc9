//! `unicas-server`: see `cas_service::cli`.
fn main() -> std::process::ExitCode {
    cas_service::cli::main()
}
