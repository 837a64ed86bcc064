//! Network namespaces: entering one for good from a thread, and a bare one of our own.

use std::fs::File;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::sched::{CloneFlags, setns};

use crate::error::ControlPlaneError;

/// Where `ip netns` keeps its named namespaces.
const NETNS_RUN_DIR: &str = "/var/run/netns";

pub(crate) fn namespace_path(namespace: &str) -> PathBuf {
    PathBuf::from(NETNS_RUN_DIR).join(namespace)
}

/// Opens a named namespace, to enter it later with [`enter`].
pub(crate) fn open(namespace: &str) -> Result<File, ControlPlaneError> {
    File::open(namespace_path(namespace))
        .map_err(|e| ControlPlaneError::Namespace { namespace: namespace.to_owned(), detail: e.to_string() })
}

/// Moves the calling thread into the namespace `file` refers to, for the rest of its life.
pub(crate) fn enter(file: &File) -> nix::Result<()> {
    setns(file, CloneFlags::CLONE_NEWNET)
}

/// Runs `ip` with `args`, failing on a non-zero exit.
pub(crate) fn ip_cmd(args: &[&str]) -> Result<(), ControlPlaneError> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| ControlPlaneError::Command { command: format!("ip {}", args.join(" ")), detail: e.to_string() })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(ControlPlaneError::Command {
            command: format!("ip {}", args.join(" ")),
            detail: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// A network namespace with only loopback up, removed on drop (its processes are the
/// caller's to stop first: a [`crate::ControlPlane`] must be dropped before it).
#[derive(Debug)]
pub struct BareNamespace {
    name: String,
}

impl BareNamespace {
    /// Creates `svcplane-cp-<pid>-<n>-<nanos>`: `n` counts this process's namespaces, the
    /// nanoseconds keep a reused pid from meeting a leftover's name. (A test once failed
    /// with "File exists" for a name made of the pid and the nanoseconds alone; such a
    /// failure is now retried under another name, twice at most.)
    /// Namespaces of this kind left by test processes that no longer run (killed before
    /// they could clean up) are removed first, with whatever still runs inside them.
    pub fn create() -> Result<Self, ControlPlaneError> {
        static CREATED: AtomicU32 = AtomicU32::new(0);
        sweep_leftovers();
        let mut attempt = 0;
        let name = loop {
            let n = CREATED.fetch_add(1, Ordering::Relaxed);
            let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
            let name = format!("svcplane-cp-{}-{n}-{nanos:x}", std::process::id());
            match ip_cmd(&["netns", "add", &name]) {
                Ok(()) => break name,
                // Another name on "File exists": the cause of the one seen is not known.
                Err(ControlPlaneError::Command { detail, .. }) if detail.contains("File exists") && attempt < 2 => {
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        };
        let namespace = Self { name };
        ip_cmd(&["-n", &namespace.name, "link", "set", "lo", "up"])?;
        Ok(namespace)
    }

    /// Adds `ip` (as a host address) to loopback, so a server can advertise it and clients
    /// inside the namespace reach it.
    pub fn add_loopback_address(&self, ip: std::net::IpAddr) -> Result<(), ControlPlaneError> {
        let length = if ip.is_ipv4() { 32 } else { 128 };
        ip_cmd(&["-n", &self.name, "addr", "add", &format!("{ip}/{length}"), "dev", "lo"])
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for BareNamespace {
    fn drop(&mut self) {
        if let Err(error) = ip_cmd(&["netns", "del", &self.name]) {
            eprintln!("svcplane-control-plane: removing {}: {error}", self.name);
        }
    }
}

/// Removes `svcplane-cp-<pid>-*` namespaces whose process is gone.
fn sweep_leftovers() {
    let stale: Vec<String> = svcplane_testbed::namespace::list_namespaces()
        .into_iter()
        .filter(|name| {
            let pid = name.strip_prefix("svcplane-cp-").and_then(|rest| rest.split('-').next());
            pid.and_then(|pid| pid.parse::<u32>().ok())
                .is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
        })
        .collect();
    if stale.is_empty() {
        return;
    }
    svcplane_testbed::namespace::kill_processes_in(&stale);
    for name in stale {
        let _ = ip_cmd(&["netns", "del", &name]);
    }
}
