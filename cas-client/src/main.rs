//! The `unicas` command-line tool.
fn main() -> std::process::ExitCode {
    cas_client::cli::main()
}
