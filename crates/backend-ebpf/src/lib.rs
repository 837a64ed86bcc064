//! svcplane's eBPF mode: spells the core's per-node plan as entries of the socket-level
//! balancer's BPF maps (every frontend, once for the node itself and once for its pods,
//! leading to an endpoint set, a refusal or a drop) and keeps them in sync by diff against
//! an in-memory record of what it wrote. Its first sync has `svcplane-bpf` load the programs
//! on threads of their own while it fills the maps (see `docs/backend-ebpf.md`, "Cold start").
//!
//! Traffic from outside the node is translated by the tc program, whose maps (Maglev
//! tables, source ranges) it fills from the same rendering.
//!
//! What it does not do: decide any Service rule (the plan does), or load, pin and attach
//! programs itself (`svcplane-bpf` does).

pub mod render;
mod slots;
mod small_map;
pub mod sync;

pub use render::{Decision, NodeAddresses, PortEntries, render_all, render_port, render_text};
pub use svcplane_bpf::MapSizes;
pub use svcplane_bpf::maglev::is_prime;
pub use sync::{DEFAULT_BPF_ROOT, EbpfBackend, EbpfOptions, ExternalMode};
