//! One object loader for both objects of a cold start.
//!
//! Making an aya loader parses the kernel's whole BTF (`/sys/kernel/btf/vmlinux`; 20-40 ms
//! of CPU on the 2-vCPU machine the benchmarks run on) for CO-RE relocations, which these
//! objects do not have; aya 0.14 offers no way to make a loader without it. So a cold start
//! makes one loader and opens the socket object and then the tc object with it: one parse
//! instead of two.

use std::path::Path;

use aya::{Ebpf, EbpfLoader};

use crate::maps::{AFFINITY_MAP, BACKENDS_MAP, COUNTERS_MAP, CT_MAP, LIVE_MAP, SERVICES_MAP, UDP_FLOWS_MAP};
use crate::{BpfError, MapSizes};

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
        let mut loader = EbpfLoader::new();
        loader
            .default_map_pin_directory(bpf_root)
            .map_max_entries(SERVICES_MAP, sizes.services)
            .map_max_entries(BACKENDS_MAP, sizes.backends)
            .map_max_entries(AFFINITY_MAP, sizes.affinity)
            // Serving endpoints per service port are about as many as backend slots.
            .map_max_entries(LIVE_MAP, sizes.backends)
            .map_max_entries(COUNTERS_MAP, sizes.backends)
            .map_max_entries(UDP_FLOWS_MAP, sizes.reverse)
            .map_max_entries(CT_MAP, sizes.reverse);
        Self { loader }
    }

    /// Reads `object` and creates its maps (or adopts their pins); loads no program.
    pub(crate) fn open(&mut self, object: &[u8], name: &'static str) -> Result<Ebpf, BpfError> {
        self.loader.load(object).map_err(|source| BpfError::Load { object: name, source: Box::new(source) })
    }
}
