//! One object loader for both objects of a cold start, made without reading the kernel's
//! BTF.
//!
//! Making an aya loader parses the kernel's whole BTF (`/sys/kernel/btf/vmlinux`; 20-40 ms
//! of CPU on the 2-vCPU machine the benchmarks run on) for CO-RE relocations, which these
//! objects do not have, and aya 0.14 offers no way to make a loader without it. So the
//! loader is made on a short-lived thread that sees an empty `/sys/kernel/btf`: the thread
//! moves to a mount namespace of its own (`unshare(CLONE_NEWNS)` affects the calling thread
//! only) and mounts an empty read-only tmpfs there. aya then finds no kernel BTF and makes
//! the loader without it; the thread's namespace goes away with the thread, and nothing
//! the rest of the process or the machine sees is changed. Should any step fail, the loader
//! is made the ordinary way. A cold start makes one loader and opens the socket object and
//! then the tc object with it.

use std::path::Path;

use aya::{Ebpf, EbpfLoader};

use crate::{BpfError, MapSizes};

/// Where aya looks for the kernel's BTF.
const KERNEL_BTF_DIR: &str = "/sys/kernel/btf";

/// A loader that pins under one bpf root and gives every sized map of both objects its
/// capacity (a map an object does not have is not created by it).
pub struct ObjectLoader {
    loader: EbpfLoader<'static>,
}

impl std::fmt::Debug for ObjectLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectLoader").finish_non_exhaustive()
    }
}

impl ObjectLoader {
    pub fn new(bpf_root: &Path, sizes: MapSizes) -> Self {
        let mut loader = loader_without_kernel_btf().unwrap_or_else(|_| EbpfLoader::new());
        loader.default_map_pin_directory(bpf_root);
        for map in crate::upgrade::SIZED_MAPS {
            if let Some(entries) = crate::upgrade::sized(map, sizes) {
                loader.map_max_entries(map, entries);
            }
        }
        Self { loader }
    }

    /// Reads `object` and creates its maps (or adopts their pins); loads no program.
    pub(crate) fn open(&mut self, object: &[u8], name: &'static str) -> Result<Ebpf, BpfError> {
        self.loader.load(object).map_err(|source| BpfError::Load { object: name, source: Box::new(source) })
    }
}

/// An aya loader made where the kernel's BTF cannot be seen (see the module's text), or
/// why that could not be arranged.
pub fn loader_without_kernel_btf() -> Result<EbpfLoader<'static>, std::io::Error> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| -> Result<EbpfLoader<'static>, std::io::Error> {
                use nix::mount::{MsFlags, mount};
                use nix::sched::{CloneFlags, unshare};
                unshare(CloneFlags::CLONE_NEWNS)?;
                // Private first, so the mount below never propagates to the machine's namespace.
                mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)?;
                mount(Some("none"), KERNEL_BTF_DIR, Some("tmpfs"), MsFlags::MS_RDONLY, Some("size=4k"))?;
                Ok(EbpfLoader::new())
            })
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the thread making the loader panicked")))
    })
}
