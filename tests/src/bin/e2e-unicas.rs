//! `unicas` as the end-to-end tests run it.
fn main() -> std::process::ExitCode {
    cas_client::cli::main()
}
