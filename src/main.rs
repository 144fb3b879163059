use std::process::ExitCode;
use switchyard::cli::{parse_args, run};

/// Cargo.toml says why the proxy's allocator is jemalloc.
#[cfg(all(feature = "server", unix))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    match parse_args(std::env::args_os().collect()) {
        Ok(cli) => run(cli),
        Err(exit) => exit,
    }
}
