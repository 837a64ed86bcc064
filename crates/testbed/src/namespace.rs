//! Named network namespaces (`/var/run/netns/<name>`, as `ip netns` makes them): entering one
//! from a thread, finding the processes inside, deleting them.

use std::collections::HashMap;
use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::thread;

use nix::sched::{CloneFlags, setns};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Where `ip netns` keeps its named namespaces.
pub const NETNS_RUN_DIR: &str = "/var/run/netns";

/// A named network namespace could not be entered.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    /// `/var/run/netns/<name>` could not be opened (no such namespace?).
    #[error("opening network namespace {namespace:?}: {source}")]
    Open {
        namespace: String,
        #[source]
        source: std::io::Error,
    },
    /// `setns(2)` failed.
    #[error("entering network namespace {namespace:?}: {source}")]
    Enter {
        namespace: String,
        #[source]
        source: nix::errno::Errno,
    },
    /// The thread could not join the node's cgroup.
    #[error("joining the cgroup of namespace {namespace:?}: {source}")]
    Cgroup {
        namespace: String,
        #[source]
        source: crate::cgroup::CgroupError,
    },
}

/// The path of a named namespace.
pub fn namespace_path(namespace: &str) -> PathBuf {
    PathBuf::from(NETNS_RUN_DIR).join(namespace)
}

/// Runs `work` on a new thread that first joins the network namespace `namespace`, and
/// returns its result. Sockets made by `work` belong to that namespace for their whole life,
/// whichever thread uses them later. The calling thread never changes namespace.
///
/// A panic inside `work` is resumed on the calling thread.
pub fn run_in_namespace<T, F>(namespace: &str, work: F) -> Result<T, NamespaceError>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    run_in_namespace_within(namespace, None, work)
}

/// [`run_in_namespace`], the thread first joining `cgroup` (a node's cgroup, see
/// [`crate::cgroup`]) when one is given.
pub fn run_in_namespace_within<T, F>(namespace: &str, cgroup: Option<&Path>, work: F) -> Result<T, NamespaceError>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let file = File::open(namespace_path(namespace))
        .map_err(|source| NamespaceError::Open { namespace: namespace.to_owned(), source })?;
    thread::scope(|scope| {
        let worker = thread::Builder::new()
            .name(format!("netns-{namespace}"))
            .spawn_scoped(scope, move || {
                if let Some(cgroup) = cgroup {
                    crate::cgroup::enter(cgroup)
                        .map_err(|source| NamespaceError::Cgroup { namespace: namespace.to_owned(), source })?;
                }
                setns(&file, CloneFlags::CLONE_NEWNET)
                    .map_err(|source| NamespaceError::Enter { namespace: namespace.to_owned(), source })?;
                drop(file);
                Ok(work())
            })
            .expect("spawning a thread to enter a network namespace");
        match worker.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// The names of all named network namespaces.
pub fn list_namespaces() -> Vec<String> {
    let Ok(entries) = fs::read_dir(NETNS_RUN_DIR) else {
        return Vec::new();
    };
    let mut names: Vec<String> =
        entries.filter_map(Result::ok).filter_map(|entry| entry.file_name().into_string().ok()).collect();
    names.sort();
    names
}

/// Sends SIGKILL to every process whose network namespace is one of `namespaces` (never to
/// this process itself). Returns the pids signalled.
pub fn kill_processes_in(namespaces: &[String]) -> Vec<i32> {
    // A namespace is identified by the device and inode of its nsfs file.
    let mut wanted: HashMap<(u64, u64), &str> = HashMap::new();
    for name in namespaces {
        if let Ok(meta) = fs::metadata(namespace_path(name)) {
            wanted.insert((meta.dev(), meta.ino()), name);
        }
    }
    if wanted.is_empty() {
        return Vec::new();
    }
    let own = std::process::id();
    let mut killed = Vec::new();
    let Ok(proc_entries) = fs::read_dir("/proc") else {
        return killed;
    };
    for entry in proc_entries.filter_map(Result::ok) {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
            continue;
        };
        if pid == own {
            continue;
        }
        let Ok(meta) = fs::metadata(entry.path().join("ns/net")) else {
            continue;
        };
        if wanted.contains_key(&(meta.dev(), meta.ino())) {
            let Ok(raw) = i32::try_from(pid) else {
                continue;
            };
            if kill(Pid::from_raw(raw), Signal::SIGKILL).is_ok() {
                killed.push(raw);
            }
        }
    }
    killed
}

/// An empty network namespace for one test (`ip netns add`), deleted on drop: for tests
/// that need a kernel of their own but no lab (no nodes, links or addresses).
#[derive(Debug)]
pub struct ScratchNamespace {
    name: String,
}

impl ScratchNamespace {
    /// `svcp-<purpose>-<pid>`; panics when it cannot be made (tests run as root).
    pub fn create(purpose: &str) -> Self {
        let name = format!("svcp-{purpose}-{}", std::process::id());
        let status =
            std::process::Command::new("ip").args(["netns", "add", &name]).status().expect("running ip netns add");
        assert!(status.success(), "ip netns add {name}: {status}");
        ScratchNamespace { name }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `work` on a thread inside the namespace (see [`run_in_namespace`]).
    pub fn run<T: Send>(&self, work: impl FnOnce() -> T + Send) -> T {
        run_in_namespace(&self.name, work).expect("entering the test's namespace")
    }

    /// Runs `program` with `args` inside the namespace and returns its standard output;
    /// panics, with its standard error, when it fails.
    pub fn output(&self, program: &str, args: &[&str]) -> String {
        let output = std::process::Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .output()
            .unwrap_or_else(|error| panic!("running {program}: {error}"));
        assert!(output.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

impl Drop for ScratchNamespace {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}
