//! A stand-alone echo server for the testbed's own tests, with the same command line as the
//! hidden `svcplane echo` subcommand, so [`svcplane_testbed::Lab::start_echo`] can run
//! either: `svcplane-testbed-echo echo --name <name> --port <port> [--deadline-secs <s>]`.
//!
//! Stops by itself after the deadline (default 15 minutes) in case nobody kills it.

use std::process::ExitCode;
use std::time::Duration;

use svcplane_testbed::{serve_echo, wildcard_addrs};

const DEFAULT_DEADLINE: Duration = Duration::from_secs(15 * 60);

fn main() -> ExitCode {
    match parse(std::env::args().skip(1)) {
        Ok((name, port, deadline)) => match serve_echo(&name, &wildcard_addrs(port), Some(deadline)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("svcplane-testbed-echo: {error}");
                ExitCode::FAILURE
            }
        },
        Err(message) => {
            eprintln!(
                "svcplane-testbed-echo: {message}\n\
                 usage: svcplane-testbed-echo echo --name <name> --port <port> [--deadline-secs <s>]"
            );
            ExitCode::from(2)
        }
    }
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<(String, u16, Duration), String> {
    let mut name = None;
    let mut port = None;
    let mut deadline = DEFAULT_DEADLINE;
    let mut first = true;
    while let Some(arg) = args.next() {
        if first && arg == "echo" {
            first = false;
            continue;
        }
        first = false;
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--name" => name = Some(value()?),
            "--port" => {
                let text = value()?;
                port = Some(text.parse().map_err(|_| format!("bad port {text:?}"))?);
            }
            "--deadline-secs" => {
                let text = value()?;
                let secs: u64 = text.parse().map_err(|_| format!("bad deadline {text:?}"))?;
                deadline = Duration::from_secs(secs);
            }
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    Ok((name.ok_or("--name is required")?, port.ok_or("--port is required")?, deadline))
}
