//! `unicas-hub`: see `hub::cli`.
fn main() -> std::process::ExitCode {
    hub::cli::main()
}
