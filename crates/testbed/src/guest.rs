//! Tests that need the guest kernel: kernel modules the host kernel lacks (`ip_vs`,
//! `sctp`, `dummy`, `ip_set`), reached by booting Debian's 6.1 kernel under qemu with
//! `scripts/in-guest` (see `docs/guest-kernel.md`).
//!
//! A guest-side test is `#[ignore = "needs the guest kernel (scripts/in-guest)"]` and
//! starts with [`guest_only`], so it does nothing on the host even when ignored tests are
//! run. A host-side test in the same test binary boots the guest once and runs a batch of
//! them there with [`run_tests_in_guest`]: the binary re-runs itself inside the guest with
//! `--exact --ignored` and the batch's names, and [`GuestRun::check_tests_passed`] checks
//! each one ran and passed. Where no guest can be booted the host-side test says why and
//! skips ([`can_boot_guest`]); with `CI` set (CI sets `CI=true`) or
//! `SVCPLANE_REQUIRE_GUEST=1` that skip is a failure.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::command::{RunFailure, wait_bounded};

/// Set (to `1`) in the guest's environment by `scripts/in-guest`.
pub const IN_GUEST: &str = "SVCPLANE_IN_GUEST";
/// With this set to `1`, a host that cannot boot the guest fails the test instead of
/// skipping it (as `CI` being set does).
pub const REQUIRE_GUEST: &str = "SVCPLANE_REQUIRE_GUEST";
/// The reason every guest-side test gives for being ignored on the host.
pub const IGNORE_REASON: &str = "needs the guest kernel (scripts/in-guest)";

/// How much longer than the harness's own time limit we wait for it before killing it
/// (killing the harness kills its qemu too).
const HARNESS_GRACE: Duration = Duration::from_secs(30);

/// Whether this process runs inside the guest.
pub fn in_guest() -> bool {
    std::env::var_os(IN_GUEST).is_some_and(|value| value == "1")
}

/// `scripts/in-guest` of this repository.
pub fn harness() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/in-guest")
}

/// Whether a test that cannot boot the guest must fail rather than skip: `CI` is set to
/// anything but `false` or `0`, or `SVCPLANE_REQUIRE_GUEST=1`, or `SVCPLANE_REQUIRE_ROOT=1`
/// (which `.ci/run` sets: a skipped real-kernel test is a failure there, guest or not).
pub fn guest_required() -> bool {
    let ci = std::env::var("CI").is_ok_and(|value| !value.is_empty() && value != "false" && value != "0");
    let set = |name: &str| std::env::var_os(name).is_some_and(|value| value == "1");
    ci || set(REQUIRE_GUEST) || set("SVCPLANE_REQUIRE_ROOT")
}

/// Why no guest can be booted here, if so.
pub fn why_no_guest() -> Option<String> {
    if in_guest() {
        return Some("already inside the guest (no guest in a guest)".to_owned());
    }
    if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        return Some("the guest kernel is an x86_64 Linux kernel booted by qemu-system-x86_64".to_owned());
    }
    if !nix::unistd::Uid::effective().is_root() {
        return Some(
            "needs root (qemu exports the host's / to the guest; the guest tests build namespaces)".to_owned(),
        );
    }
    let harness = harness();
    if !harness.exists() {
        return Some(format!("no harness at {}", harness.display()));
    }
    let on_path = |program: &str| {
        std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
    };
    if !on_path("qemu-system-x86_64") && !on_path("apt-get") {
        return Some("no qemu-system-x86_64 and no apt-get to install it".to_owned());
    }
    None
}

/// Whether `test`, a host-side test, can boot the guest here. If not, it says why on
/// stderr and returns false, so the test returns early as skipped; when
/// [`guest_required`], it panics instead, so CI never passes on a skipped guest test. In
/// the guest itself it always skips.
pub fn can_boot_guest(test: &str) -> bool {
    let Some(reason) = why_no_guest() else {
        return true;
    };
    if !in_guest() {
        assert!(
            !guest_required(),
            "{test}: cannot boot the guest kernel: {reason}; and CI, {REQUIRE_GUEST}=1 or SVCPLANE_REQUIRE_ROOT=1 is set"
        );
    }
    eprintln!("SKIPPED {test}: cannot boot the guest kernel: {reason}");
    false
}

/// For a guest-side test: true inside the guest. On the host it says that the test runs
/// only in the guest, and through which host-side test, and returns false.
pub fn guest_only(test: &str, run_by: &str) -> bool {
    if in_guest() {
        return true;
    }
    eprintln!("SKIPPED {test}: runs only inside the guest kernel; `{run_by}` runs it there");
    false
}

/// Loads kernel `modules` (with their dependencies) in one `modprobe -a`, inside the
/// guest. Autoloading would load them too, one `modprobe` process each, which is slow
/// under emulation and can land inside a test's time limit.
pub fn load_modules(modules: &[&str]) -> Result<(), String> {
    let mut command = Command::new("modprobe");
    command.arg("-a").args(modules);
    let output = crate::command::run_bounded(command, None, Duration::from_secs(60))
        .map_err(|failure| format!("modprobe -a {}: {failure:?}", modules.join(" ")))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "modprobe -a {}: {}: {}",
        modules.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}

/// What a run in the guest printed and returned.
#[derive(Debug)]
pub struct GuestRun {
    /// The harness's exit status: the command's, or 125 when the guest gave none.
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// Wall-clock time of the whole harness run.
    pub elapsed: Duration,
}

/// The guest could not be run at all.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    #[error("starting {harness}: {source}")]
    Spawn {
        harness: String,
        #[source]
        source: std::io::Error,
    },
    #[error("waiting for {harness}: {source}")]
    Wait {
        harness: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{harness} still ran {limit:?} after its own time limit; killed it (and its qemu)")]
    TimedOut { harness: String, limit: Duration },
}

/// Runs `command` as root in the guest through `scripts/in-guest --timeout`, in this
/// process's working directory. Each line it prints is passed on through `eprintln!` as it
/// arrives (so the test harness shows it for a failed test), and the harness's timing line
/// is written to stderr directly, so every run records its boot and total time.
pub fn run_in_guest<S: AsRef<OsStr>>(command: &[S], timeout: Duration) -> Result<GuestRun, GuestError> {
    let harness = harness();
    let name = harness.display().to_string();
    let mut child = Command::new(&harness)
        .arg("--timeout")
        .arg(timeout.as_secs().max(1).to_string())
        .arg("--")
        .args(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| GuestError::Spawn { harness: name.clone(), source })?;
    let started = Instant::now();
    let stdout = pass_on(child.stdout.take(), "guest");
    let stderr = pass_on(child.stderr.take(), "guest stderr");
    let status = wait_bounded(&mut child, timeout + HARNESS_GRACE);
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    let status = match status {
        Ok(status) => status,
        Err(RunFailure::TimedOut(limit)) => return Err(GuestError::TimedOut { harness: name, limit }),
        Err(RunFailure::Wait(source) | RunFailure::Spawn(source)) => {
            return Err(GuestError::Wait { harness: name, source });
        }
    };
    let run = GuestRun { status, stdout, stderr, elapsed: started.elapsed() };
    if let Some(timing) = run.timing() {
        let _ = writeln!(std::io::stderr(), "{timing}");
    }
    Ok(run)
}

/// Runs `tests` of `test_binary` (usually `std::env::current_exe()`) inside one guest:
/// `<binary> --exact --ignored --nocapture --test-threads 1 <tests...>`. One at a time,
/// because the guest's two emulated CPUs are slow and the tests' own time limits are made
/// for a real machine.
pub fn run_tests_in_guest(test_binary: &Path, tests: &[&str], timeout: Duration) -> Result<GuestRun, GuestError> {
    let mut command: Vec<&OsStr> = vec![
        test_binary.as_os_str(),
        OsStr::new("--exact"),
        OsStr::new("--ignored"),
        OsStr::new("--nocapture"),
        OsStr::new("--test-threads"),
        OsStr::new("1"),
    ];
    command.extend(tests.iter().map(OsStr::new));
    run_in_guest(&command, timeout)
}

impl GuestRun {
    /// The harness's line about boot, command and total time, if it printed one.
    pub fn timing(&self) -> Option<&str> {
        self.stderr.lines().rev().find(|line| line.starts_with("in-guest: kernel "))
    }

    /// Checks that the run succeeded and that libtest reported each of `tests` as run and
    /// passed (`test <name> ... ok`), so a filter that matched nothing cannot pass.
    pub fn check_tests_passed(&self, tests: &[&str]) -> Result<(), String> {
        let mut problems = Vec::new();
        if !self.status.success() {
            problems.push(format!("the guest run exited with {}", self.status));
        }
        for test in tests {
            let ok = format!("test {test} ... ok");
            if !self.stdout.lines().any(|line| line.trim_end() == ok) {
                let seen = self.stdout.lines().find(|line| line.starts_with(&format!("test {test} ... ")));
                problems.push(match seen {
                    Some(line) => format!("{test}: `{line}`{}", panic_of(&self.stderr, test)),
                    None => format!("{test}: did not run in the guest"),
                });
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(format!(
            "{}\n(timing: {})\n--- guest stdout (last 60 lines) ---\n{}\n--- guest stderr (last 60 lines) ---\n{}",
            problems.join("\n"),
            self.timing().unwrap_or("none"),
            last_lines(&self.stdout, 60),
            last_lines(&self.stderr, 60)
        ))
    }
}

/// The start of `test`'s panic message in the guest's stderr (the guest runs its tests
/// with `--nocapture`, so the message is there and not in the harness's summary), for the
/// failure to say why first: the last lines of a parallel run often belong to other tests.
fn panic_of(stderr: &str, test: &str) -> String {
    const LINES: usize = 12;
    let thread = format!("thread '{test}'");
    let lines: Vec<&str> = stderr.lines().collect();
    match lines.iter().position(|line| line.starts_with(&thread) && line.contains("panicked at")) {
        Some(at) => format!("\n{}", lines[at..lines.len().min(at + LINES)].join("\n")),
        None => String::new(),
    }
}

fn last_lines(text: &str, count: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(count)..].join("\n")
}

/// Passes `pipe`'s lines on through `eprintln!` as they arrive and returns all of it.
fn pass_on<R: Read + Send + 'static>(pipe: Option<R>, label: &'static str) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut all = String::new();
        let Some(pipe) = pipe else {
            return all;
        };
        let mut reader = BufReader::new(pipe);
        let mut line = Vec::new();
        while reader.read_until(b'\n', &mut line).is_ok_and(|read| read > 0) {
            let text = String::from_utf8_lossy(&line);
            eprint!("[{label}] {text}");
            all.push_str(&text);
            line.clear();
        }
        all
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::*;

    fn run(code: i32, stdout: &str) -> GuestRun {
        GuestRun {
            status: ExitStatus::from_raw(code << 8),
            stdout: stdout.to_owned(),
            stderr: "in-guest: kernel 6.1.0-56-amd64 (tcg, 2 cpus): boot 5.0 s, command 9.0 s, total 14.0 s\n"
                .to_owned(),
            elapsed: Duration::from_secs(14),
        }
    }

    #[test]
    fn a_batch_passes_only_when_every_named_test_reported_ok() {
        let out = "running 2 tests\ntest a ... ok\ntest b ... ok\n\ntest result: ok. 2 passed\n";
        assert_eq!(run(0, out).check_tests_passed(&["a", "b"]), Ok(()));
        let missing = run(0, "running 1 test\ntest a ... ok\n").check_tests_passed(&["a", "b"]).unwrap_err();
        assert!(missing.starts_with("b: did not run in the guest"), "{missing}");
        let failed = run(101, "test a ... FAILED\ntest b ... ok\n").check_tests_passed(&["a", "b"]).unwrap_err();
        assert!(failed.contains("exited with") && failed.contains("a: `test a ... FAILED`"), "{failed}");
    }

    #[test]
    fn a_failed_test_is_reported_with_the_start_of_its_panic_message() {
        let mut failed = run(101, "test a ... FAILED\ntest b ... ok\n");
        failed.stderr = format!(
            "ok: a row of b\nthread 'a' (173) panicked at tests/real.rs:8:9:\n1 of 2 rows failed\n- row x: why\n{}{}",
            "later output\n".repeat(100),
            failed.stderr
        );
        let report = failed.check_tests_passed(&["a", "b"]).unwrap_err();
        let (first, _) = report.split_once("(timing:").expect("the timing follows the problems");
        assert!(first.contains("panicked at tests/real.rs:8:9:\n1 of 2 rows failed\n- row x: why"), "{report}");
        assert!(!first.contains("ok: a row of b"), "{report}");
    }

    #[test]
    fn the_harness_timing_line_is_found_in_its_stderr() {
        assert_eq!(
            run(0, "").timing(),
            Some("in-guest: kernel 6.1.0-56-amd64 (tcg, 2 cpus): boot 5.0 s, command 9.0 s, total 14.0 s")
        );
    }
}
