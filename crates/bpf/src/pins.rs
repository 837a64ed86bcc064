//! Everything eBPF mode pins under a bpf root, removed together: the socket programs'
//! links and maps, the tc program's links and maps, and the bpffs mounted for them.

use std::path::Path;

use crate::sys::{self, LINKS_DIR};
use crate::{BpfError, sock_lb, tc};

/// Removes every link and map pinned under `bpf_root`, the tc program's too (the programs
/// detach when their last link goes), then the directory, unmounting it if it is a bpffs of its own.
/// Returns whether anything was there.
pub fn cleanup(bpf_root: &Path) -> Result<bool, BpfError> {
    if !bpf_root.exists() {
        return Ok(false);
    }
    let mut found = false;
    let links_dir = bpf_root.join(LINKS_DIR);
    for program in sock_lb::PROGRAMS {
        found |= remove_if_there(&links_dir.join(program))?;
    }
    for interface in tc::pinned_interfaces(bpf_root) {
        found |= remove_if_there(&links_dir.join(format!("tc-{interface}")))?;
    }
    let maps = crate::maps::SOCK_LB_MAPS
        .iter()
        .chain(tc::TC_MAPS.iter())
        .chain(crate::maps::RETIRED_MAPS.iter())
        .chain(std::iter::once(&crate::upgrade::BUILD_MAP));
    for map in maps {
        found |= remove_if_there(&bpf_root.join(map))?;
    }
    let _ = std::fs::remove_dir(&links_dir);
    if sys::is_bpffs_mount_point(bpf_root) {
        nix::mount::umount(bpf_root).map_err(|errno| BpfError::BpfFs {
            path: bpf_root.to_owned(),
            what: "unmounting",
            source: errno.into(),
        })?;
    }
    let _ = std::fs::remove_dir(bpf_root);
    Ok(found)
}

fn remove_if_there(path: &Path) -> Result<bool, BpfError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(BpfError::Io { what: format!("removing {}", path.display()), source }),
    }
}
