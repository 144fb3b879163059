use clap::Parser;
use std::process::ExitCode;
use switchyard::cli::{Cli, run};

/// Cargo.toml says why the proxy's allocator is jemalloc.
#[cfg(all(feature = "server", unix))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    run(Cli::parse())
}
