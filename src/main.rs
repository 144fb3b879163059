use clap::Parser;
use std::process::ExitCode;
use switchyard::cli::{Cli, run};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    run(Cli::parse())
}
