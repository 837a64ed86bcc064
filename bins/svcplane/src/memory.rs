//! Giving freed memory back to the system after the work that frees the most: the proxy's
//! full syncs, and cluster DNS's zone swaps (`dns.rs` calls [`trim`] after each).
//!
//! A full sync (the cold start above all) builds the whole ruleset and its netlink
//! messages, then drops them; glibc's allocator keeps most of such freed memory mapped in
//! its arenas, so the process's RSS would stay near its peak for good. After each full sync
//! this hook asks the allocator to return its free pages (`malloc_trim`); partial syncs
//! free little and are left alone.
//!
//! The proxy also runs with at most two malloc arenas ([`limit_arenas`]): glibc otherwise
//! gives each thread that allocates an arena of its own (up to 8 per core), and the
//! watch thread's arena, where every object is converted, ends up holding the converted
//! model among the freed remains of the lists it was decoded from. At 10k Services x 10
//! endpoints `MALLOC_ARENA_MAX=2` took the kept RSS from 84.5 to 77.3 MiB (`docs/benchmarks.md`).

use svcplane_sync::{AfterSync, Synced};

/// The after-sync hook that trims the allocator after every full sync.
#[derive(Debug, Default)]
pub struct ReturnFreedMemory;

impl AfterSync for ReturnFreedMemory {
    fn synced(&mut self, sync: &Synced<'_>) {
        if sync.report.full {
            trim();
        }
    }
}

/// Returns the allocator's free pages to the system.
#[allow(unsafe_code, reason = "one libc call without preconditions")]
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator; it touches no live
    // allocation and may be called from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// At most two malloc arenas for this process, unless `MALLOC_ARENA_MAX` says otherwise.
/// Called before any thread starts.
#[allow(unsafe_code, reason = "one libc call without preconditions")]
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only changes the allocator's parameters; M_ARENA_MAX takes
        // effect for arenas created later.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}
