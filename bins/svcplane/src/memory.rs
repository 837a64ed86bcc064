//! Giving freed memory back to the system after the work that frees the most: the proxy's
//! full syncs, and cluster DNS's zone swaps (`dns.rs` calls [`trim`] after each).
//!
//! A full sync (the cold start above all) builds the whole ruleset and its netlink
//! messages, then drops them; glibc's allocator keeps most of such freed memory mapped in
//! its arenas, so the process's RSS would stay near its peak for good. After each full sync
//! this hook asks the allocator to return its free pages (`malloc_trim`); partial syncs
//! free little and are left alone.

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
