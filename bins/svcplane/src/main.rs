//! `svcplane`: one binary, subcommands. Wiring only: every decision lives in the crates.

mod cli;
mod controller;
mod dns;
mod explain;
mod feeds;
mod lab;
mod modes;
mod ops;
mod proxy;
mod top;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SVCPLANE_LOG")
                .unwrap_or_else(|_| "info,hickory_server=warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Proxy(args) => proxy::run(&args),
        Command::Render(args) => proxy::render(&args),
        Command::Explain(args) => explain::run(&args),
        Command::Top(args) => top::run(&args),
        Command::Controller(args) => controller::run(&args),
        Command::Dns(args) => dns::run(&args),
        Command::Cleanup(args) => proxy::cleanup(&args),
        Command::Lab(args) => lab::run(&args),
        Command::Echo(args) => lab::echo(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("svcplane: {error:#}");
            ExitCode::from(1)
        }
    }
}
