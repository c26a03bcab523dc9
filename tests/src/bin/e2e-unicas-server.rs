//! `unicas-server` as the end-to-end tests run it (with failpoints compiled in).

server_kit::server_allocator!();

fn main() -> std::process::ExitCode {
    cas_service::cli::main()
}
