//! Running external commands (`ip`, `curl`, ...) with a time limit.

use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How a bounded command run went wrong (before looking at its exit status).
#[derive(Debug)]
pub(crate) enum RunFailure {
    Spawn(std::io::Error),
    TimedOut(Duration),
    Wait(std::io::Error),
}

/// Runs `command` to completion, feeding it `stdin`, killing it after `timeout`.
pub(crate) fn run_bounded(mut command: Command, stdin: Option<&[u8]>, timeout: Duration) -> Result<Output, RunFailure> {
    command
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().map_err(RunFailure::Spawn)?;
    let writer = match (stdin, child.stdin.take()) {
        (Some(input), Some(mut pipe)) => {
            let input = input.to_vec();
            // A broken pipe only means the command stopped reading; its status tells why.
            Some(thread::spawn(move || {
                let _ = pipe.write_all(&input);
            }))
        }
        _ => None,
    };
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = wait_bounded(&mut child, timeout);
    if let Some(writer) = writer {
        let _ = writer.join();
    }
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    Ok(Output { status: status?, stdout, stderr })
}

/// Waits for `child` at most `timeout`; kills and reaps it when the time is up.
pub(crate) fn wait_bounded(child: &mut Child, timeout: Duration) -> Result<ExitStatus, RunFailure> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) => {}
            Err(error) => return Err(RunFailure::Wait(error)),
        }
        let elapsed = started.elapsed();
        if elapsed >= timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(RunFailure::TimedOut(timeout));
        }
        thread::sleep(pause.min(timeout - elapsed));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut buffer = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut buffer);
        }
        buffer
    })
}

/// A command line as one readable string, for error messages.
pub(crate) fn describe(program: &str, args: &[&str]) -> String {
    std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ")
}
