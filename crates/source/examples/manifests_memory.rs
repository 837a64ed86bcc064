//! The manifests feed's own heap after its first read of a directory, counted in process:
//! what `svcplane proxy --manifests DIR` keeps for the feed alone (the store, the held
//! records, the controller step's state, the differ's digests), apart from the core model,
//! plan and kernel rules the sync loop keeps.
//!
//! ```text
//! cargo run --release -p svcplane-source --example manifests_memory -- DIR
//! ```
//!
//! DIR is a manifests directory, for example the one `scripts/bench-manifests-cold` writes
//! (10k Services x 10 Pods). Prints the cold read's time and phases, the live heap (bytes
//! and allocations) with the changes still held and after they are dropped, and the peak
//! VmHWM.
//!
//! Like the proxy, it runs with at most two malloc arenas (unless `MALLOC_ARENA_MAX` is
//! set) and asks the allocator to give its free pages back after the read (`malloc_trim`,
//! as the proxy does after its first full sync), and prints VmRSS then: what the process
//! keeps beyond the live heap is the pages that live allocations pin among freed ones.
//! With `MALLOC_STATS=1` in the environment it also prints glibc's per-arena figures at
//! the end (on stderr).
#![allow(unsafe_code)]

#[path = "../../core/examples/support/counting_alloc.rs"]
mod counting_alloc;

use std::path::PathBuf;
use std::time::Instant;

use svcplane_controller::{AllocatorConfig, NodePortRange};
use svcplane_source::{ManifestsFeed, ManifestsSettings};

#[path = "support/proc_status.rs"]
mod proc_status;
use proc_status::status_mib;

type Error = Box<dyn std::error::Error>;

fn mib(bytes: isize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    unsafe extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
        fn malloc_trim(pad: usize) -> i32;
        fn malloc_stats();
    }
    /// glibc's `M_ARENA_MAX`.
    const M_ARENA_MAX: i32 = -8;

    /// At most two arenas, as the proxy sets them (`bins/svcplane/src/memory.rs`), unless
    /// `MALLOC_ARENA_MAX` says otherwise (the proxy defers to it too, and glibc reads it).
    pub fn limit_arenas() {
        if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
            return;
        }
        // SAFETY: mallopt only changes the allocator's parameters.
        unsafe {
            mallopt(M_ARENA_MAX, 2);
        }
    }

    /// Returns the allocator's free pages to the system, as the proxy does after a full sync.
    pub fn trim() {
        // SAFETY: malloc_trim only releases free memory; it touches no live allocation.
        unsafe {
            malloc_trim(0);
        }
    }

    /// glibc's per-arena figures (system bytes, bytes in use), on stderr.
    pub fn print_stats() {
        // SAFETY: malloc_stats only reads the allocator's state and prints it.
        unsafe {
            malloc_stats();
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod glibc {
    pub fn limit_arenas() {}
    pub fn trim() {}
    pub fn print_stats() {}
}

fn main() -> Result<(), Error> {
    glibc::limit_arenas();
    let dir: PathBuf = std::env::args_os().nth(1).ok_or("usage: manifests_memory DIR")?.into();
    let settings = ManifestsSettings {
        dir,
        allocator: AllocatorConfig {
            service_cidrs: vec!["198.19.0.0/16".parse()?],
            node_port_range: NodePortRange::DEFAULT,
        },
        allocations_file: None,
        saves_allocations: false,
    };
    glibc::trim();
    let base_rss = status_mib("VmRSS:");
    let (base_bytes, base_blocks) = counting_alloc::live();
    // On a thread of its own, as the proxy runs the feed (which arena a thread allocates
    // from decides where its records land).
    let (feed, changes, cold) = std::thread::Builder::new()
        .name("manifests-feed".to_owned())
        .spawn(move || -> Result<_, String> {
            let mut feed = ManifestsFeed::new(settings).map_err(|error| error.to_string())?;
            let started = Instant::now();
            let changes = feed.poll_changes().ok_or("the directory could not be listed")?;
            Ok((feed, changes, started.elapsed()))
        })?
        .join()
        .map_err(|_| "the feed thread panicked")??;
    let (with_bytes, with_blocks) = counting_alloc::live();
    glibc::trim();
    let with_rss = status_mib("VmRSS:");
    let count = changes.len();
    drop(changes);
    let (bytes, blocks) = counting_alloc::live();
    glibc::trim();
    let rss = status_mib("VmRSS:");
    println!("cold read: {:.0} ms, {count} changes; phases: {:?}", cold.as_secs_f64() * 1000.0, feed.phases());
    println!(
        "live heap with the changes: {:.1} MiB in {} allocations; VmRSS after trim {:.1} MiB above the start",
        mib(with_bytes - base_bytes),
        with_blocks - base_blocks,
        with_rss - base_rss
    );
    println!(
        "the feed's own live heap: {:.1} MiB in {} allocations; VmRSS after trim {:.1} MiB above the start",
        mib(bytes - base_bytes),
        blocks - base_blocks,
        rss - base_rss
    );
    println!("VmRSS {:.0} MiB, VmHWM {:.0} MiB", status_mib("VmRSS:"), status_mib("VmHWM:"));
    if std::env::var_os("MALLOC_STATS").is_some() {
        glibc::print_stats();
    }
    // Kept to the end: what a heap profiler (heaptrack) reports as leaked at exit is then
    // the feed's live heap, by allocation site.
    std::mem::forget(feed);
    Ok(())
}
