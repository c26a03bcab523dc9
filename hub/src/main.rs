//! `unicas-hub`: see `hub::cli`.

/// jemalloc instead of the system allocator: a server's requests allocate and free many small
/// buffers across threads (see ARCHITECTURE.md, "The allocator").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    hub::cli::main()
}
