//! svcplane-testbed: throwaway network-namespace labs for real-kernel tests and for the
//! `svcplane lab` demo.
//!
//! A [`Lab`] builds a small cluster out of network namespaces, following the address plan
//! of `LAB.md` (IPv4 and IPv6 everywhere): a LAN namespace with a bridge, nodes that route
//! each other's pod ranges, Calico-style routed pods, and external clients on the LAN. It
//! starts [`echo`] servers in pods, probes them from any lab namespace with the [`probe`]
//! clients (the test process itself can be the client, see [`run_in_namespace`]), and on
//! drop kills every process inside its namespaces and deletes them. Setup first removes
//! leftovers of labs that crashed.
//!
//! What it does not do: no Service logic at all, and it programs no proxy rules (nftables,
//! iptables, BPF, IPVS) itself; that is the job of the dataplane under test, run inside the
//! node namespaces. Nothing is ever configured in the caller's own network namespace,
//! clients have no default route, and routes and probes are refused outside the plan.
//!
//! [`guest`] runs tests that need kernel modules the host lacks (ip_vs, sctp, ...) inside a
//! qemu guest through `scripts/in-guest`, and decides when such a test skips.
//!
//! Everything here needs root (`CAP_NET_ADMIN` and `CAP_SYS_ADMIN`), except the pure parts
//! ([`address_plan`], reply parsing).

pub mod address_plan;
pub mod cgroup;
mod command;
pub mod echo;
pub mod guest;
mod lab;
pub mod load;
pub mod namespace;
mod prefix;
pub mod probe;

pub use echo::{EchoError, EchoServer, serve_echo, wildcard_addrs};
pub use lab::{
    Client, DEFAULT_COMMAND_TIMEOUT, ECHO_START_TIMEOUT, Lab, LabBuilder, LabError, Node, OUTSIDE_INTERFACE, Pod,
};
pub use load::{Load, LoadReport, LoadSpec};
pub use namespace::{NamespaceError, ScratchNamespace, run_in_namespace, run_in_namespace_within};
pub use probe::{
    EchoReply, ProbeError, ProbeErrorKind, Protocol, tcp_request, tcp_request_in, udp_request, udp_request_in,
};

/// Whether tests that need the real kernel can run here (they need root: network
/// namespaces, nftables, iptables). Without root this says why on stderr and returns false,
/// so the test returns early as skipped; with `SVCPLANE_REQUIRE_ROOT=1` (as `.ci/run` sets
/// it) a missing root fails the test instead, so CI never passes on skipped tests.
pub fn can_run_real_kernel_tests(test: &str) -> bool {
    if nix::unistd::Uid::effective().is_root() {
        return true;
    }
    let required = std::env::var_os("SVCPLANE_REQUIRE_ROOT").is_some_and(|value| value == "1");
    assert!(!required, "{test}: needs root (network namespaces, nftables, iptables), and SVCPLANE_REQUIRE_ROOT=1");
    eprintln!("SKIPPED {test}: needs root (network namespaces, nftables, iptables)");
    false
}
