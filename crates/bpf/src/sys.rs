//! Small pieces of the system around BPF: the cgroup2 mount, bpffs, and the network
//! namespace cookie the programs compare against.
// getsockopt(SO_NETNS_COOKIE) has no safe wrapper in libc or nix 0.31, and aya 0.14 has no
// batched map updates nor a public link update: they are raw calls here, and only here.
#![allow(unsafe_code)]

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::BpfError;

/// Where pinned links live under the bpf root.
pub(crate) const LINKS_DIR: &str = "links";

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

/// Whether any link is pinned under `bpf_root` (programs of some build are attached).
pub fn any_link_pinned(bpf_root: &Path) -> bool {
    std::fs::read_dir(bpf_root.join(LINKS_DIR)).is_ok_and(|mut entries| entries.next().is_some())
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

/// `BPF_MAP_UPDATE_BATCH` (linux/bpf.h `enum bpf_cmd`).
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// The `batch` member of `union bpf_attr` (linux/bpf.h), padded to the union's size for
/// this command.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Writes `keys[i] -> values[i]` into the map `map` in as few system calls as the kernel
/// allows (`BPF_MAP_UPDATE_BATCH`, Linux 5.6), instead of one per entry. On error, the
/// entries before the failing one are written; the error keeps the kernel's errno (E2BIG
/// or ENOSPC when the map is full).
pub fn update_batch<K: aya::Pod, V: aya::Pod>(
    map: &aya::maps::MapData,
    keys: &[K],
    values: &[V],
) -> std::io::Result<()> {
    use std::os::fd::{AsFd, AsRawFd};
    assert_eq!(keys.len(), values.len(), "one value per key");
    let fd = map.fd().as_fd().as_raw_fd();
    let mut done = 0;
    while done < keys.len() {
        let remaining = u32::try_from(keys.len() - done).unwrap_or(u32::MAX);
        let mut attr = BatchAttr {
            keys: keys[done..].as_ptr() as u64,
            values: values[done..].as_ptr() as u64,
            count: remaining,
            map_fd: u32::try_from(fd).expect("file descriptors are not negative"),
            ..BatchAttr::default()
        };
        // SAFETY: `attr` is a valid `bpf_attr.batch` for BPF_MAP_UPDATE_BATCH; `keys` and
        // `values` point at `count` contiguous `K` and `V` (both `Pod`: plain bytes of the
        // map's key and value size) that live for the whole call; the kernel only reads
        // them and writes `attr.count`.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_UPDATE_BATCH,
                (&raw mut attr).cast::<libc::c_void>(),
                size_of::<BatchAttr>(),
            )
        };
        let written = attr.count as usize;
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if written == 0 {
            return Err(std::io::Error::other("BPF_MAP_UPDATE_BATCH wrote nothing"));
        }
        done += written;
    }
    Ok(())
}

/// An array map created with `BPF_F_MMAPABLE`, mapped into this process: its elements are
/// read and written as memory, with no system call per element. A plain store is not
/// atomic for a reader in the kernel, so a caller writes only elements no program can be
/// reading (the backends array's ranges no frontend names yet).
pub struct MappedArray {
    base: std::ptr::NonNull<u8>,
    length: usize,
    /// Bytes per element: the value size rounded up to 8, as the kernel lays arrays out.
    stride: usize,
    value_size: usize,
    entries: u32,
}

// SAFETY: the mapping is plain shared memory owned by this value; moving it to another
// thread moves nothing the kernel ties to a thread.
unsafe impl Send for MappedArray {}

impl std::fmt::Debug for MappedArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedArray").field("entries", &self.entries).field("stride", &self.stride).finish()
    }
}

impl MappedArray {
    /// Maps the whole array `map` (`entries` elements of `value_size` bytes).
    pub fn new(map: &aya::maps::MapData, entries: u32, value_size: usize) -> std::io::Result<Self> {
        use std::os::fd::{AsFd, AsRawFd};
        let stride = value_size.div_ceil(8) * 8;
        let page = 4096;
        let length = (stride * entries as usize).div_ceil(page).max(1) * page;
        let fd = map.fd().as_fd().as_raw_fd();
        // SAFETY: a shared read-write mapping of a map fd (the kernel checks the map was
        // created mmapable and that `length` fits it); nothing else in this process maps it
        // at this address, and `Drop` unmaps exactly this range.
        let address = unsafe {
            libc::mmap(std::ptr::null_mut(), length, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        if address == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base =
            std::ptr::NonNull::new(address.cast::<u8>()).ok_or_else(|| std::io::Error::other("mmap gave null"))?;
        Ok(Self { base, length, stride, value_size, entries })
    }

    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// Writes `values` into elements `first ..`; fails, writing nothing, past the end.
    pub fn write<V: aya::Pod>(&mut self, first: u32, values: &[V]) -> std::io::Result<()> {
        assert_eq!(size_of::<V>(), self.value_size, "the map's value type");
        let end = first as usize + values.len();
        if end > self.entries as usize {
            return Err(std::io::Error::from_raw_os_error(libc::E2BIG));
        }
        for (index, value) in (first as usize..).zip(values) {
            // SAFETY: `index < entries`, so the element lies inside the mapping; `V` is
            // `Pod` of the map's value size, copied as bytes (no alignment needed).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (value as *const V).cast::<u8>(),
                    self.base.as_ptr().add(index * self.stride),
                    self.value_size,
                );
            }
        }
        // The stores above come before whatever the caller publishes next (a frontend
        // naming these elements, written by a system call).
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Elements `first .. first + count` (fewer past the end).
    pub fn read<V: aya::Pod + Default>(&self, first: u32, count: u32) -> Vec<V> {
        assert_eq!(size_of::<V>(), self.value_size, "the map's value type");
        let end = (first as usize + count as usize).min(self.entries as usize);
        (first as usize..end)
            .map(|index| {
                let mut value = V::default();
                // SAFETY: as in `write`, the other way round.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.base.as_ptr().add(index * self.stride),
                        (&raw mut value).cast::<u8>(),
                        self.value_size,
                    );
                }
                value
            })
            .collect()
    }
}

impl Drop for MappedArray {
    fn drop(&mut self) {
        // SAFETY: the range `new` mapped, unmapped once.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.length);
        }
    }
}

/// `BPF_OBJ_GET` and `BPF_LINK_UPDATE` (linux/bpf.h `enum bpf_cmd`).
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_LINK_UPDATE: libc::c_long = 29;

/// The `obj` member of `union bpf_attr` (pin path, fd, flags).
#[repr(C)]
#[derive(Default)]
struct ObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
    pad: u32,
}

/// The `link_update` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct LinkUpdateAttr {
    link_fd: u32,
    new_prog_fd: u32,
    flags: u32,
    old_prog_fd: u32,
}

/// Opens the BPF object pinned at `pin` (`BPF_OBJ_GET`): a map, program or link.
pub(crate) fn obj_get(pin: &Path) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(pin.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let mut attr = ObjAttr { pathname: path.as_ptr() as u64, ..ObjAttr::default() };
    // SAFETY: `attr` is a valid `bpf_attr` for BPF_OBJ_GET; `pathname` points at a
    // NUL-terminated string alive for the whole call, which the kernel only reads.
    let rc = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_OBJ_GET, (&raw mut attr).cast::<libc::c_void>(), size_of::<ObjAttr>())
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(rc).map_err(std::io::Error::other)?;
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Moves the BPF link `link` onto `program` (`BPF_LINK_UPDATE`, Linux 5.7 for cgroup links,
/// 6.6 for tcx ones): the hook runs the old program until the new one replaces it, never
/// none.
pub(crate) fn link_update(
    link: std::os::fd::BorrowedFd<'_>,
    program: std::os::fd::BorrowedFd<'_>,
) -> std::io::Result<()> {
    let mut attr = LinkUpdateAttr {
        link_fd: u32::try_from(link.as_raw_fd()).map_err(std::io::Error::other)?,
        new_prog_fd: u32::try_from(program.as_raw_fd()).map_err(std::io::Error::other)?,
        ..LinkUpdateAttr::default()
    };
    // SAFETY: `attr` is a valid `bpf_attr.link_update`; both descriptors are open for the
    // whole call (borrowed); the kernel only reads `attr`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_LINK_UPDATE,
            (&raw mut attr).cast::<libc::c_void>(),
            size_of::<LinkUpdateAttr>(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `BPF_PROG_TEST_RUN` (linux/bpf.h `enum bpf_cmd`).
const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// The `test` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    pad: u32,
}

/// Runs a loaded program once on `packet` (`BPF_PROG_TEST_RUN`): its return value and the
/// packet as it left the program. For tests of tc programs on crafted packets.
pub fn prog_test_run(program: std::os::fd::BorrowedFd<'_>, packet: &[u8]) -> std::io::Result<(u32, Vec<u8>)> {
    use std::os::fd::AsRawFd;
    let mut out = vec![0u8; packet.len() + 256];
    let mut attr = TestRunAttr {
        prog_fd: u32::try_from(program.as_raw_fd()).expect("file descriptors are not negative"),
        data_size_in: u32::try_from(packet.len()).map_err(std::io::Error::other)?,
        data_size_out: u32::try_from(out.len()).map_err(std::io::Error::other)?,
        data_in: packet.as_ptr() as u64,
        data_out: out.as_mut_ptr() as u64,
        repeat: 1,
        ..TestRunAttr::default()
    };
    // SAFETY: `attr` is a valid `bpf_attr.test` for BPF_PROG_TEST_RUN; `data_in` points at
    // `data_size_in` readable bytes and `data_out` at `data_size_out` writable bytes, both
    // alive for the whole call; the kernel writes only within them and into `attr`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            (&raw mut attr).cast::<libc::c_void>(),
            size_of::<TestRunAttr>(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    out.truncate(attr.data_size_out as usize);
    Ok((attr.retval, out))
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
