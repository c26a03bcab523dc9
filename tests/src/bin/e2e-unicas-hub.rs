//! `unicas-hub` as the end-to-end tests run it (with failpoints compiled in).

server_kit::server_allocator!();

fn main() -> std::process::ExitCode {
    hub::cli::main()
}
