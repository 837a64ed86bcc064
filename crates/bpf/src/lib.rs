//! The BPF mechanism of svcplane's eBPF mode: the C programs under `bpf/` (compiled by
//! clang from `build.rs` and embedded), the typed keys and values of their maps, and
//! loading, pinning (under a bpffs directory), attaching (to a cgroup v2 directory) and
//! removing them, with aya 0.14; moving the links an earlier build pinned onto this
//! build's programs in place ([`upgrade`]); and closing the node's connected UDP sockets the
//! programs balanced, through the socket-diagnostics netlink family ([`sockets`]).
//!
//! What it does not do: it knows nothing of Services, plans or Kubernetes and decides no
//! policy. It writes what it is told into maps; `svcplane-backend-ebpf` decides what that is.

mod error;
pub mod loader;
pub mod maglev;
pub mod maps;
/// aya's map traits, for callers holding the typed maps [`SockLb`] hands out.
pub mod aya_maps {
    pub use aya::maps::IterableMap;
}
mod pins;
mod pod;
pub mod sock_lb;
pub mod sockets;
pub mod sys;
pub mod tc;
pub mod upgrade;

pub use error::BpfError;
pub use loader::ObjectLoader;
pub use maps::{
    AffinityKey, AffinityValue, BackendValue, Config, LiveKey, RevEntry, RevKey, RevSock, RevValue, Scope,
    ServiceFlags, ServiceKey, ServiceValue,
};
pub use pins::cleanup;
pub use sock_lb::{BatchMaps, MapSizes, PortNamesMap, SockLb, SockLbOptions, SockPrograms, StagedPrograms};

/// The socket-level load balancer's object (`bpf/sock_lb.c`), as clang built it.
/// The tc program's object (`bpf/tc_nat.c`).
pub(crate) static TC_NAT_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tc_nat.o"));

/// The socket-level load balancer's object (`bpf/sock_lb.c`), as clang built it.
pub(crate) static SOCK_LB_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sock_lb.o"));
