//! Backends the real-kernel runner is used with by more than one test crate.

use super::cluster::Backend;
use super::{Scenario, Sender, SourceSeen};

pub const NFTABLES: Backend = Backend {
    name: "nftables",
    proxy_args: &["--mode", "nftables"],
    diagnostics: &[&["nft", "list", "ruleset"]],
    ruleset: &["nft", "list", "ruleset"],
    not_applicable: super::cluster::every_row_applies,
    node_cgroups: false,
    relays_from_the_node: false,
};

pub const IPTABLES_LEGACY: Backend = Backend {
    name: "iptables-legacy",
    proxy_args: &["--mode", "iptables", "--iptables-backend", "legacy"],
    diagnostics: &[&["iptables-legacy-save"], &["ip6tables-legacy-save"]],
    ruleset: &["sh", "-c", "iptables-legacy-save && ip6tables-legacy-save"],
    not_applicable: super::cluster::every_row_applies,
    node_cgroups: false,
    relays_from_the_node: false,
};

pub const IPTABLES_NFT: Backend = Backend {
    name: "iptables-nft",
    proxy_args: &["--mode", "iptables", "--iptables-backend", "nft"],
    diagnostics: &[&["iptables-nft-save"], &["ip6tables-nft-save"]],
    ruleset: &["sh", "-c", "iptables-nft-save && ip6tables-nft-save"],
    not_applicable: super::cluster::every_row_applies,
    node_cgroups: false,
    relays_from_the_node: false,
};

pub const EBPF: Backend = Backend {
    name: "ebpf",
    proxy_args: &["--mode", "ebpf"],
    diagnostics: &[&["bpftool", "cgroup", "tree"]],
    ruleset: &["true"],
    not_applicable,
    node_cgroups: true,
    relays_from_the_node: false,
};

/// Rows the eBPF mode does not run yet, with the reason.
fn not_applicable(row: &Scenario) -> Option<&'static str> {
    let from_outside = matches!(
        row.from,
        Sender::ExternalClient | Sender::ExternalClientInsideRange | Sender::ExternalClientOutsideRange
    );
    match row.from {
        // Traffic from outside goes through the tc program, which translates like the other modes.
        _ if from_outside => None,
        // The socket balancer translates no address: the endpoint sees the pod (or the node)
        // itself. Masquerading these flows is what the other modes need so that replies of a
        // DNAT come back through it (a pod reaching itself, or a NodePort whose reply would
        // bypass the node); without a DNAT there is nothing for a reply to miss.
        _ if row.source == SourceSeen::NodeAddress || row.from == Sender::EndpointPodOnThisNode => {
            Some("socket-level balancing keeps the sender's own address (no NAT to undo)")
        }
        _ => None,
    }
}

/// eBPF mode with direct server return for external traffic (`--ebpf-external-mode dsr`).
pub const EBPF_DSR: Backend = Backend {
    name: "ebpf-dsr",
    proxy_args: &["--mode", "ebpf", "--ebpf-external-mode", "dsr"],
    diagnostics: &[&["bpftool", "cgroup", "tree"]],
    ruleset: &["true"],
    not_applicable: not_applicable_with_dsr,
    node_cgroups: true,
    relays_from_the_node: false,
};

fn not_applicable_with_dsr(row: &Scenario) -> Option<&'static str> {
    let from_outside = matches!(
        row.from,
        Sender::ExternalClient | Sender::ExternalClientInsideRange | Sender::ExternalClientOutsideRange
    );
    if from_outside && row.source == SourceSeen::NodeAddress {
        return Some("direct server return keeps the external client's address (the DSR test checks it)");
    }
    not_applicable(row)
}

pub const USERSPACE: Backend = Backend {
    name: "userspace",
    proxy_args: &["--mode", "userspace"],
    diagnostics: &[&["nft", "list", "ruleset"], &["ss", "-ltnup"]],
    ruleset: &["nft", "list", "ruleset"],
    not_applicable: userspace_not_applicable,
    node_cgroups: false,
    relays_from_the_node: true,
};

/// Rows the userspace mode cannot run, by design, with the reason.
fn userspace_not_applicable(row: &Scenario) -> Option<&'static str> {
    if row.protocol == super::Protocol::Sctp {
        return Some("the relay speaks TCP and UDP only; SCTP Service ports are refused");
    }
    None
}
