//! `unicas-hub` as the end-to-end tests run it (with failpoints compiled in).
fn main() -> std::process::ExitCode {
    hub::cli::main()
}
