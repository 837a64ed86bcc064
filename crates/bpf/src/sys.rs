//! Small pieces of the system around BPF: the cgroup2 mount, bpffs, and the network
//! namespace cookie the programs compare against.
#![allow(unsafe_code)] // getsockopt(SO_NETNS_COOKIE) has no safe wrapper in libc or nix 0.31.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::BpfError;

/// `BPF_FS_MAGIC` from linux/magic.h.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// `SO_NETNS_COOKIE` (Linux 5.14), not in every libc crate version.
const SO_NETNS_COOKIE: libc::c_int = 71;

/// Where cgroup2 is mounted, from /proc/self/mountinfo (on hybrid systems it is not
/// /sys/fs/cgroup but e.g. /sys/fs/cgroup/unified).
pub fn cgroup2_mount() -> Result<PathBuf, BpfError> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|source| BpfError::Io { what: "reading /proc/self/mountinfo".into(), source })?;
    cgroup2_mount_in(&text).ok_or(BpfError::NoCgroup2)
}

fn cgroup2_mount_in(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let fs_type = after.split_whitespace().next()?;
        (fs_type == "cgroup2").then(|| before.split_whitespace().nth(4).map(PathBuf::from)).flatten()
    })
}

/// Whether `path` is on a bpffs.
pub fn is_bpffs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|s| s.filesystem_type().0 == BPF_FS_MAGIC)
}

/// Makes `root` a directory on a bpffs: kept if it already is one, created inside a bpffs
/// parent, else a bpffs is mounted there (as Cilium's agent does). Returns whether it
/// mounted one.
pub fn ensure_bpffs(root: &Path) -> Result<bool, BpfError> {
    std::fs::create_dir_all(root).map_err(|source| BpfError::BpfFs {
        path: root.to_owned(),
        what: "creating the directory",
        source,
    })?;
    if is_bpffs(root) {
        return Ok(false);
    }
    nix::mount::mount(Some("bpf"), root, Some("bpf"), nix::mount::MsFlags::empty(), None::<&str>).map_err(|errno| {
        BpfError::BpfFs {
            path: root.to_owned(),
            what: "mounting a bpffs (needs CAP_SYS_ADMIN; the kernel needs CONFIG_BPF_SYSCALL)",
            source: errno.into(),
        }
    })?;
    Ok(true)
}

/// Whether `root` is itself the mount point of a bpffs (not a directory inside one).
pub fn is_bpffs_mount_point(root: &Path) -> bool {
    let parent = root.parent().unwrap_or(Path::new("/"));
    is_bpffs(root) && !is_bpffs(parent)
}

/// The cookie of the calling thread's network namespace, as `bpf_get_netns_cookie` sees it.
pub fn current_netns_cookie() -> Result<u64, BpfError> {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0")
        .or_else(|_| std::net::UdpSocket::bind("[::1]:0"))
        .map_err(|source| BpfError::Io { what: "opening a socket to read the netns cookie".into(), source })?;
    let mut cookie: u64 = 0;
    let mut length = size_of::<u64>() as libc::socklen_t;
    // SAFETY: the fd is a live socket for the whole call; `cookie` and `length` are valid,
    // writable and sized as the kernel expects for SO_NETNS_COOKIE (a u64).
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &raw mut length,
        )
    };
    if rc != 0 {
        return Err(BpfError::Io {
            what: "getsockopt(SO_NETNS_COOKIE) (the kernel lacks it before 5.14)".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(cookie)
}

/// Every address of the calling thread's network namespace's interfaces.
pub fn local_addresses() -> Result<Vec<std::net::IpAddr>, BpfError> {
    let addresses = nix::ifaddrs::getifaddrs().map_err(|errno| BpfError::Io {
        what: "listing the node's addresses (getifaddrs)".into(),
        source: errno.into(),
    })?;
    let mut found: Vec<std::net::IpAddr> = addresses
        .filter_map(|ifaddr| {
            let address = ifaddr.address?;
            if let Some(v4) = address.as_sockaddr_in() {
                return Some(std::net::IpAddr::V4(v4.ip()));
            }
            address.as_sockaddr_in6().map(|v6| std::net::IpAddr::V6(v6.ip()))
        })
        .collect();
    found.sort();
    found.dedup();
    Ok(found)
}

/// The kernel memory (`memlock`, bytes) of every map pinned directly under `bpf_root`.
pub fn pinned_map_memory(bpf_root: &Path) -> Result<u64, BpfError> {
    use std::os::fd::{AsFd, AsRawFd};
    let entries = std::fs::read_dir(bpf_root)
        .map_err(|source| BpfError::Io { what: format!("listing {}", bpf_root.display()), source })?;
    let mut total = 0;
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            continue;
        }
        let Ok(map) = aya::maps::MapData::from_pin(&path) else { continue };
        let fd = map.fd().as_fd().as_raw_fd();
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
            .map_err(|source| BpfError::Io { what: format!("reading the fdinfo of {}", path.display()), source })?;
        total += info
            .lines()
            .find_map(|line| line.strip_prefix("memlock:"))
            .and_then(|value| value.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup2_mount_is_found_on_a_hybrid_system() {
        let mountinfo = "30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro\n\
                         41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount_in(mountinfo), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(cgroup2_mount_in("30 25 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n"), None);
    }
}
