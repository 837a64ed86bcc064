//! A cgroup per lab node, for dataplanes that balance at the socket layer (eBPF mode
//! attaches its programs to a cgroup, and a socket is balanced by the programs of the
//! cgroup its creator was in).
//!
//! The probes of a lab are threads of the test process, so a node's cgroup must be able to
//! hold single threads: the node cgroups are *threaded* cgroups (cgroup v2) under a domain
//! of the test process's own, `<cgroup2 mount>/svcplane-tests-<pid>`. The process moves
//! into that domain while at least one lab with node cgroups lives, and back to where it
//! was when the last one goes; then the domain is removed. A thread joins a node's cgroup
//! by writing its thread id to `cgroup.threads` (see [`enter`]); threads made for one
//! probe end with it. Domains of test processes that died are swept on the next use.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// A cgroup step failed.
#[derive(Debug, thiserror::Error)]
#[error("cgroup {path}: {what}: {source}")]
pub struct CgroupError {
    pub path: PathBuf,
    pub what: &'static str,
    #[source]
    pub source: std::io::Error,
}

fn fail<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(std::io::Error) -> CgroupError + 'a {
    move |source| CgroupError { path: path.to_owned(), what, source }
}

/// The name of a test process's domain.
const DOMAIN_PREFIX: &str = "svcplane-tests-";

/// The test process's domain while labs use it.
#[derive(Debug)]
struct Domain {
    path: PathBuf,
    /// Where the process was before (the cgroup v2 path from /proc/self/cgroup).
    original: PathBuf,
    users: usize,
}

static DOMAIN: Mutex<Option<Domain>> = Mutex::new(None);

/// Where cgroup2 is mounted, from /proc/self/mountinfo (on hybrid systems it is not
/// /sys/fs/cgroup but e.g. /sys/fs/cgroup/unified).
pub fn cgroup2_mount() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        (after.split_whitespace().next()? == "cgroup2").then(|| before.split_whitespace().nth(4).map(PathBuf::from))?
    })
}

fn no_cgroup2() -> CgroupError {
    CgroupError {
        path: PathBuf::from("/proc/self/mountinfo"),
        what: "finding the cgroup2 mount",
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no cgroup2 file system is mounted"),
    }
}

fn current_cgroup(mount: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let relative = text.lines().find_map(|line| line.strip_prefix("0::"))?;
    Some(mount.join(relative.trim_start_matches('/')))
}

fn write(path: &Path, text: &str, what: &'static str) -> Result<(), CgroupError> {
    std::fs::write(path, text).map_err(fail(path, what))
}

/// Removes a cgroup directory, retrying for up to `patience` while the kernel still counts
/// a thread that just exited.
fn remove_dir_patiently(path: &Path, patience: Duration) -> Result<(), CgroupError> {
    let mut last = None;
    for _ in 0..patience.as_millis().div_ceil(20).max(1) {
        match std::fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => last = Some(error),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(CgroupError { path: path.to_owned(), what: "removing", source: last.expect("an error was seen") })
}

/// Removes the domains (and their node cgroups) of test processes that no longer run.
fn sweep_dead_domains(mount: &Path) {
    let Ok(entries) = std::fs::read_dir(mount) else { return };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(DOMAIN_PREFIX).and_then(|p| p.parse::<u32>().ok()) else { continue };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Ok(children) = std::fs::read_dir(entry.path()) {
            for child in children.filter_map(Result::ok).filter(|c| c.path().is_dir()) {
                let _ = std::fs::remove_dir(child.path());
            }
        }
        let _ = std::fs::remove_dir(entry.path());
    }
}

fn acquire_domain() -> Result<PathBuf, CgroupError> {
    let mut domain = DOMAIN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(domain) = domain.as_mut() {
        domain.users += 1;
        return Ok(domain.path.clone());
    }
    let mount = cgroup2_mount().ok_or_else(no_cgroup2)?;
    sweep_dead_domains(&mount);
    let original = current_cgroup(&mount).unwrap_or_else(|| mount.clone());
    let path = mount.join(format!("{DOMAIN_PREFIX}{}", std::process::id()));
    match std::fs::create_dir(&path) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(error) => return Err(fail(&path, "creating the test process's domain")(error)),
    }
    write(&path.join("cgroup.procs"), &std::process::id().to_string(), "moving the test process in")?;
    *domain = Some(Domain { path: path.clone(), original, users: 1 });
    Ok(path)
}

fn release_domain() {
    let mut guard = DOMAIN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(domain) = guard.as_mut() else { return };
    domain.users -= 1;
    if domain.users > 0 {
        return;
    }
    let domain = guard.take().expect("checked above");
    let procs = domain.original.join("cgroup.procs");
    if let Err(error) = write(&procs, &std::process::id().to_string(), "moving the test process back") {
        eprintln!("svcplane-testbed: {error}");
        return;
    }
    // Longer than a node's: no later sweep removes the domain of a run's last test process.
    // Loaded CI runs have left an empty domain behind now and then; a removal that gave up
    // while the kernel still counted an exited thread is the likeliest cause.
    if let Err(error) = remove_dir_patiently(&domain.path, Duration::from_secs(10)) {
        eprintln!("svcplane-testbed: {error}");
    }
}

/// A threaded cgroup per node of one lab; removed on drop.
#[derive(Debug)]
pub struct NodeCgroups {
    nodes: Vec<(u16, PathBuf)>,
    released: bool,
}

impl NodeCgroups {
    /// Creates `<domain>/<prefix>-n<N>` for each node.
    pub fn create(prefix: &str, nodes: impl IntoIterator<Item = u16>) -> Result<Self, CgroupError> {
        let domain = acquire_domain()?;
        let mut created = NodeCgroups { nodes: Vec::new(), released: false };
        for node in nodes {
            let path = domain.join(format!("{prefix}-n{node}"));
            match std::fs::create_dir(&path) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(error) => return Err(fail(&path, "creating a node's cgroup")(error)),
            }
            created.nodes.push((node, path.clone()));
            write(&path.join("cgroup.type"), "threaded", "making it threaded")?;
        }
        Ok(created)
    }

    /// The cgroup of `node`.
    pub fn path(&self, node: u16) -> Option<&Path> {
        self.nodes.iter().find(|(index, _)| *index == node).map(|(_, path)| path.as_path())
    }

    /// Removes the node cgroups (their threads have ended) and lets go of the domain.
    pub fn remove(&mut self) -> Result<(), CgroupError> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        let mut first_error = None;
        for (_, path) in &self.nodes {
            if let Err(error) = remove_dir_patiently(path, Duration::from_secs(1)) {
                first_error.get_or_insert(error);
            }
        }
        release_domain();
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for NodeCgroups {
    fn drop(&mut self) {
        if let Err(error) = self.remove() {
            eprintln!("svcplane-testbed: {error}");
        }
    }
}

/// Moves the calling thread (only it) into `cgroup`: sockets it creates from now on are
/// that cgroup's.
pub fn enter(cgroup: &Path) -> Result<(), CgroupError> {
    let tid = nix::unistd::gettid();
    write(&cgroup.join("cgroup.threads"), &tid.to_string(), "moving a probe thread in")
}
