//! `svcplane`: one binary, subcommands. Wiring only: every decision lives in the crates.

mod announce;
mod cli;
mod config;
mod controller;
mod dns;
mod explain;
mod faults;
mod feeds;
mod lab;
mod memory;
mod modes;
mod ops;
mod proxy;
mod recent;
mod top;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_env("SVCPLANE_LOG")
        .unwrap_or_else(|_| "info,hickory_server=warn".into());
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_filter(filter),
        )
        .with(recent::RecentWarningsLayer)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Proxy(args) => proxy::run(&args),
        Command::Render(args) => proxy::render(&args),
        Command::Explain(args) => explain::run(&args),
        Command::Top(args) => top::run(&args),
        Command::Controller(args) => controller::run(&args),
        Command::Dns(args) => dns::run(&args),
        Command::Announce(args) => announce::run(&args),
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
