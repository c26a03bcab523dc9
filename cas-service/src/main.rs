//! `unicas-server`: see `cas_service::cli`.

server_kit::server_allocator!();

fn main() -> std::process::ExitCode {
    cas_service::cli::main()
}
