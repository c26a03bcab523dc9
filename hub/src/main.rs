//! `unicas-hub`: see `hub::cli`.

server_kit::server_allocator!();

fn main() -> std::process::ExitCode {
    hub::cli::main()
}
