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

fn main() -> Result<(), Error> {
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
    let (base_bytes, base_blocks) = counting_alloc::live();
    let mut feed = ManifestsFeed::new(settings)?;
    let started = Instant::now();
    let changes = feed.poll_changes().ok_or("the directory could not be listed")?;
    let cold = started.elapsed();
    let (with_bytes, with_blocks) = counting_alloc::live();
    let count = changes.len();
    drop(changes);
    let (bytes, blocks) = counting_alloc::live();
    println!("cold read: {:.0} ms, {count} changes; phases: {:?}", cold.as_secs_f64() * 1000.0, feed.phases());
    println!(
        "live heap with the changes: {:.1} MiB in {} allocations",
        mib(with_bytes - base_bytes),
        with_blocks - base_blocks
    );
    println!("the feed's own live heap: {:.1} MiB in {} allocations", mib(bytes - base_bytes), blocks - base_blocks);
    println!("VmRSS {:.0} MiB, VmHWM {:.0} MiB", status_mib("VmRSS:"), status_mib("VmHWM:"));
    Ok(())
}
