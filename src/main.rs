use clap::Parser;
use std::process::ExitCode;
use switchyard::cli::{Cli, run};

fn main() -> ExitCode {
    run(Cli::parse())
}
