//! The Service scenario table: what a client somewhere in the cluster must experience when
//! it talks to a Service address, written once for every backend and every way of running
//! it.
//!
//! A row names its sentence, who sends ([`Sender`]), to which address ([`Frontend`]) of which
//! Service of the shared fixture ([`manifests`]), the family (a [`Family::Both`] row runs
//! once per family) and protocol, what must happen ([`Outcome`]) and which source address
//! the answering pod must see ([`SourceSeen`]). Nothing here knows how the dataplane is
//! programmed. Two runners read the same rows:
//!
//! - [`real`] sends real packets in a two-node namespace lab ([`cluster::Cluster`]) where
//!   each node runs the real `svcplane proxy`;
//! - [`fake`] runs the library pipeline into a mode's in-memory fake kernel and walks each
//!   row's first packet through it with the mode's tracer (`nftables_fake_kernel.rs`,
//!   `iptables_fake_kernel.rs`).
//!
//! Roles: "this node" is node1 (whose proxy is under test for external traffic), "the other
//! node" is node2; each node runs its own proxy, so a pod on node2 is served by node2's.

// Every backend's test crate includes this module and uses its own subset of it.
#![allow(dead_code, unused_imports)]

/// One real-kernel test: `real_kernel_test!(a_sentence_naming_it, body)` runs `body` when
/// this process may program the kernel, and says why it skips otherwise (a skip fails
/// under `SVCPLANE_REQUIRE_ROOT`).
#[macro_export]
macro_rules! real_kernel_test {
    ($name:ident, $body:expr) => {
        #[test]
        fn $name() {
            if !svcplane_testbed::can_run_real_kernel_tests(stringify!($name)) {
                return;
            }
            $body;
        }
    };
}

/// The scenario table's tests for one backend, one cluster each: every static table, the
/// NodePort-address configurations, affinity and endpoint changes, and the checks beside
/// the table every mode runs ([`common`]). A mode's test file calls it once.
#[macro_export]
macro_rules! scenario_table_tests {
    ($backend:expr) => {
        use $crate::scenarios::common as shared;
        $crate::real_kernel_test!(
            pods_the_node_and_an_external_client_reach_a_service_through_its_cluster_ip_and_node_port,
            shared::check_table($backend, $crate::scenarios::REACHABILITY)
        );
        $crate::real_kernel_test!(
            a_service_without_endpoints_is_refused_at_once_from_a_pod_the_node_and_outside_in_both_families,
            shared::check_table($backend, $crate::scenarios::NO_ENDPOINTS)
        );
        $crate::real_kernel_test!(
            local_traffic_policies_keep_traffic_on_the_node_or_drop_it,
            shared::check_table($backend, $crate::scenarios::TRAFFIC_POLICY)
        );
        $crate::real_kernel_test!(
            load_balancer_ips_are_served_like_node_ports_within_their_source_ranges_unless_proxied,
            shared::check_table($backend, $crate::scenarios::LOAD_BALANCER)
        );
        $crate::real_kernel_test!(
            external_ips_are_served_like_load_balancer_ips,
            shared::check_table($backend, $crate::scenarios::EXTERNAL_IPS)
        );
        $crate::real_kernel_test!(
            health_check_node_ports_answer_with_the_local_endpoint_count,
            shared::check_table($backend, $crate::scenarios::HEALTH_CHECKS)
        );
        $crate::real_kernel_test!(
            terminating_endpoints_are_used_only_when_none_is_ready,
            shared::check_table($backend, $crate::scenarios::TERMINATING)
        );
        $crate::real_kernel_test!(
            topology_keeps_traffic_close_with_upstreams_fallbacks,
            shared::check_table($backend, $crate::scenarios::TOPOLOGY)
        );
        $crate::real_kernel_test!(
            headless_external_name_and_other_proxies_services_are_not_programmed,
            shared::check_table($backend, $crate::scenarios::IGNORED)
        );
        $crate::real_kernel_test!(
            node_ports_answer_on_every_node_address_but_loopback_by_default,
            shared::check_table($backend, $crate::scenarios::NODEPORT_ADDRESSES_DEFAULT)
        );
        $crate::real_kernel_test!(
            node_ports_answer_only_on_the_primary_address_with_nodeport_addresses_primary,
            shared::check_table_with_node_port_addresses(
                $backend,
                $crate::scenarios::NodePortAddresses::Primary,
                $crate::scenarios::NODEPORT_ADDRESSES_PRIMARY
            )
        );
        $crate::real_kernel_test!(
            node_ports_answer_only_inside_nodeport_addresses_cidrs,
            shared::check_table_with_node_port_addresses(
                $backend,
                $crate::scenarios::NodePortAddresses::SecondaryOnly,
                $crate::scenarios::NODEPORT_ADDRESSES_CIDRS
            )
        );
        $crate::real_kernel_test!(
            client_ip_affinity_sticks_until_the_timeout,
            shared::check_table($backend, $crate::scenarios::AFFINITY)
        );
        $crate::real_kernel_test!(
            endpoint_changes_remove_stale_udp_flows_and_keep_flows_to_terminating_endpoints,
            shared::check_endpoint_changes($backend)
        );
        $crate::real_kernel_test!(
            two_hundred_requests_to_a_four_endpoint_service_reach_every_endpoint_evenly,
            shared::requests_reach_every_endpoint_evenly($backend)
        );
        $crate::real_kernel_test!(
            a_pod_that_turns_not_ready_stops_receiving_traffic_within_five_seconds_and_returns_when_ready,
            shared::a_pod_turning_not_ready_stops_receiving_traffic_and_returns($backend)
        );
        $crate::real_kernel_test!(
            a_broken_service_does_not_keep_its_neighbour_in_the_same_file_from_being_programmed,
            shared::a_broken_service_does_not_keep_its_neighbour_from_being_programmed($backend)
        );
        $crate::real_kernel_test!(
            a_service_added_to_the_manifests_is_programmed_within_two_seconds_without_a_restart,
            shared::a_service_added_to_the_manifests_is_programmed_without_a_restart($backend)
        );
    };
}

/// For modes whose rules live in svcplane's own nftables tables (nftables, userspace):
/// cleanup and the three drift repairs, the repairs counted under `$mode`.
#[macro_export]
macro_rules! nftables_table_tests {
    ($backend:expr, $mode:literal) => {
        $crate::real_kernel_test!(
            svcplane_cleanup_removes_the_svcplane_tables_from_the_node,
            $crate::scenarios::common::svcplane_cleanup_removes_the_svcplane_nftables_tables($backend)
        );
        $crate::real_kernel_test!(
            a_svcplane_table_deleted_behind_its_back_is_put_back_within_five_seconds,
            $crate::scenarios::common::a_ruleset_change_behind_svcplanes_back_is_repaired_within_five_seconds(
                $backend,
                $mode,
                &[&["nft", "delete", "table", "ip", "svcplane"]]
            )
        );
        $crate::real_kernel_test!(
            a_flushed_ruleset_is_put_back_within_five_seconds,
            $crate::scenarios::common::a_ruleset_change_behind_svcplanes_back_is_repaired_within_five_seconds(
                $backend,
                $mode,
                &[&["nft", "flush", "ruleset"]]
            )
        );
        $crate::real_kernel_test!(
            a_flushed_svcplane_table_is_put_back_within_five_seconds,
            $crate::scenarios::common::a_ruleset_change_behind_svcplanes_back_is_repaired_within_five_seconds(
                $backend,
                $mode,
                &[&["nft", "flush", "table", "ip", "svcplane"]]
            )
        );
    };
}

/// The scenario table's tests against one mode's in-memory fake ([`fake::FakeMode`]): every
/// table the fake runner can walk, one test each. A fake-kernel test file calls it once.
#[macro_export]
macro_rules! fake_table_tests {
    ($mode:ty) => {
        #[test]
        fn pods_the_node_and_an_external_client_reach_a_service_through_its_cluster_ip_and_node_port() {
            $crate::scenarios::fake::check_rows::<$mode>(
                $crate::scenarios::NodePortAddresses::Default,
                $crate::scenarios::REACHABILITY,
            );
        }

        #[test]
        fn a_service_without_endpoints_is_refused_at_once_from_a_pod_the_node_and_outside_in_both_families() {
            $crate::scenarios::fake::check_rows::<$mode>(
                $crate::scenarios::NodePortAddresses::Default,
                $crate::scenarios::NO_ENDPOINTS,
            );
        }

        #[test]
        fn local_traffic_policies_keep_traffic_on_the_node_or_drop_it() {
            $crate::scenarios::fake::check_rows::<$mode>(
                $crate::scenarios::NodePortAddresses::Default,
                $crate::scenarios::TRAFFIC_POLICY,
            );
        }

        #[test]
        fn load_balancer_ips_are_served_like_node_ports_within_their_source_ranges_unless_proxied() {
            $crate::scenarios::fake::check_rows::<$mode>(
                $crate::scenarios::NodePortAddresses::Default,
                $crate::scenarios::LOAD_BALANCER,
            );
        }

        #[test]
        fn external_ips_are_served_like_load_balancer_ips() {
            $crate::scenarios::fake::check_rows::<$mode>(
                $crate::scenarios::NodePortAddresses::Default,
                $crate::scenarios::EXTERNAL_IPS,
            );
        }

        #[test]
        fn health_check_node_ports_answer_with_the_local_endpoint_count() {
            $crate::scenarios::fake::check_rows::<$mode>(
                $crate::scenarios::NodePortAddresses::Default,
                $crate::scenarios::HEALTH_CHECKS,
            );
        }

        #[test]
        fn terminating_endpoints_are_used_only_when_none_is_ready() {
            $crate::scenarios::fake::check_rows::<$mode>(
                $crate::scenarios::NodePortAddresses::Default,
                $crate::scenarios::TERMINATING,
            );
        }

        #[test]
        fn topology_keeps_traffic_close_with_upstreams_fallbacks() {
            $crate::scenarios::fake::check_rows::<$mode>(
                $crate::scenarios::NodePortAddresses::Default,
                $crate::scenarios::TOPOLOGY,
            );
        }

        #[test]
        fn headless_external_name_and_other_proxies_services_are_not_programmed() {
            $crate::scenarios::fake::check_rows::<$mode>(
                $crate::scenarios::NodePortAddresses::Default,
                $crate::scenarios::IGNORED,
            );
        }

        #[test]
        fn sctp_services_are_programmed_like_tcp_ones() {
            $crate::scenarios::fake::check_rows::<$mode>(
                $crate::scenarios::NodePortAddresses::Default,
                $crate::scenarios::SCTP,
            );
        }

        #[test]
        fn node_ports_answer_on_every_node_address_but_loopback_by_default() {
            $crate::scenarios::fake::check_rows::<$mode>(
                $crate::scenarios::NodePortAddresses::Default,
                $crate::scenarios::NODEPORT_ADDRESSES_DEFAULT,
            );
        }

        #[test]
        fn node_ports_answer_only_on_the_primary_address_with_nodeport_addresses_primary() {
            $crate::scenarios::fake::check_rows::<$mode>(
                $crate::scenarios::NodePortAddresses::Primary,
                $crate::scenarios::NODEPORT_ADDRESSES_PRIMARY,
            );
        }

        #[test]
        fn node_ports_answer_only_inside_nodeport_addresses_cidrs() {
            $crate::scenarios::fake::check_rows::<$mode>(
                $crate::scenarios::NodePortAddresses::SecondaryOnly,
                $crate::scenarios::NODEPORT_ADDRESSES_CIDRS,
            );
        }

        #[test]
        fn client_ip_affinity_sticks_until_the_timeout() {
            $crate::scenarios::fake::check_rows::<$mode>(
                $crate::scenarios::NodePortAddresses::Default,
                $crate::scenarios::AFFINITY,
            );
        }

        #[test]
        fn endpoint_changes_remove_stale_udp_flows_and_keep_flows_to_terminating_endpoints() {
            $crate::scenarios::fake::check_rows::<$mode>(
                $crate::scenarios::NodePortAddresses::Default,
                $crate::scenarios::ENDPOINT_CHANGES,
            );
        }
    };
}

pub mod agreement;
pub mod backends;
pub mod cluster;
pub mod common;
pub mod fake;
pub mod manifests;
pub mod net;
pub mod real;
mod rows;

use std::fmt;
use std::net::IpAddr;

pub use manifests::{
    AFFINITY_RENEWED_SERVICE, AFFINITY_SERVICE, ECHO_SERVICE, EMPTY_SERVICE, EXPLICIT_HINTS_SERVICE,
    EXTERNAL_IPS_SERVICE, EXTERNAL_LOCAL_SERVICE, EXTERNAL_NAME_SERVICE, FOREIGN_ZONE_HINTS_SERVICE,
    HALF_HINTED_SERVICE, HEADLESS_SERVICE, INTERNAL_LOCAL_SERVICE, LB_LOCAL_SERVICE, LB_RANGES_SERVICE, LB_SERVICE,
    LEAVING_PODS_SERVICE, OTHER_NODE_EXTERNAL_LOCAL_SERVICE, OTHER_NODE_INTERNAL_LOCAL_SERVICE,
    OTHER_NODE_LB_LOCAL_SERVICE, OTHER_PROXY_SERVICE, PREFER_CLOSE_ELSEWHERE_SERVICE, PREFER_CLOSE_SERVICE,
    PREFER_SAME_NODE_ELSEWHERE_SERVICE, PREFER_SAME_NODE_SERVICE, PREFER_SAME_ZONE_SERVICE,
    READY_AND_TERMINATING_SERVICE, SCTP_SERVICE, TCP_TERMINATING_SERVICE, TERMINATING_NOT_SERVING_SERVICE,
    TERMINATING_SERVICE, UDP_FIRST_ENDPOINT_SERVICE, UDP_LATE_SERVICE, UDP_MOVING_SERVICE, UDP_TERMINATING_SERVICE,
};
pub use real::{check_rows, eventually};
pub use rows::*;

use Family::Both;
use Frontend::{
    ClusterIp, ExternalIp, HealthCheck, LoadBalancerIp, NodePort, NodePortOnLoopback, NodePortOnSecondaryAddress,
    ProxyModeLoadBalancerIp,
};
use Protocol::{Sctp, Tcp, Udp};
use Sender::{
    EndpointPodOnThisNode, ExternalClient, ExternalClientInsideRange, ExternalClientOutsideRange, PodOnOtherNode,
    PodOnThisNode, ThisNode,
};
use SourceSeen::{Any, ClientAddress, NodeAddress};

/// Where a probe is sent from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// A pod on this node that backs no Service (`node1-client`).
    PodOnThisNode,
    /// A pod on this node that is itself an endpoint of the Service (`node1-pod1`): when
    /// it draws itself, hairpin masquerade must make it see a node address.
    EndpointPodOnThisNode,
    /// A pod on the other node that backs no Service (`node2-client`).
    PodOnOtherNode,
    /// This node's own network namespace.
    ThisNode,
    /// The external client on the LAN (client 1); it routes the pod, Service and
    /// load-balancer ranges via this node.
    ExternalClient,
    /// Client 1 again, named for rows about `loadBalancerSourceRanges`: it is inside them.
    ExternalClientInsideRange,
    /// A second external client (client 2), routed the same way, outside every source range.
    ExternalClientOutsideRange,
}

/// Which address of the Service a probe goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frontend {
    /// The Service's ClusterIP of the row's family, Service port.
    ClusterIp,
    /// This node's (primary) address of the row's family, the Service port's nodePort.
    NodePort,
    /// This node's second LAN address, the nodePort.
    NodePortOnSecondaryAddress,
    /// `127.0.0.1` / `::1` on this node, the nodePort: never a NodePort.
    NodePortOnLoopback,
    /// The Service's first `status.loadBalancer.ingress` IP of the family that is not
    /// `ipMode: Proxy`, Service port.
    LoadBalancerIp,
    /// The Service's first `ipMode: Proxy` ingress IP of the family, Service port.
    ProxyModeLoadBalancerIp,
    /// The Service's first `spec.externalIPs` entry of the family, Service port.
    ExternalIp,
    /// This node's address of the family, `spec.healthCheckNodePort`, over HTTP.
    HealthCheck,
}

/// The IP family of a row. [`Family::Both`] rows run once per family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
    Both,
}

impl Family {
    pub fn of(address: IpAddr) -> Family {
        if address.is_ipv4() { Family::V4 } else { Family::V6 }
    }

    /// The families a row of this family runs in.
    pub fn each(self) -> &'static [Family] {
        match self {
            Family::V4 => &[Family::V4],
            Family::V6 => &[Family::V6],
            Both => &[Family::V4, Family::V6],
        }
    }

    pub fn is_v6(self) -> bool {
        match self {
            Family::V4 => false,
            Family::V6 => true,
            Both => panic!("a row's family is resolved before it is used"),
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
            Both => "IPv4+IPv6",
        })
    }
}

/// The transport of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// `TCP`, `UDP`, `SCTP`.
    pub fn kubernetes(self) -> &'static str {
        match self {
            Tcp => "TCP",
            Udp => "UDP",
            Sctp => "SCTP",
        }
    }

    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Tcp => 6,
            Udp => 17,
            Sctp => 132,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tcp => "tcp",
            Udp => "udp",
            Sctp => "sctp",
        })
    }
}

/// What must happen to the probes of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every probe is answered by one of these pods, and each of them answers at least once
    /// (probes continue, bounded, until all have).
    Answered { by: &'static [&'static str] },
    /// Refused fast: TCP reset or ICMP port unreachable within [`real::REJECT_WITHIN`], not a
    /// timeout.
    Rejected,
    /// Nothing comes back: the probe times out.
    Dropped,
    /// Nothing of the dataplane serves this address: no pod answers, no rule translates it,
    /// and (for ClusterIPs, load-balancer and external IPs) no rule even names it. Whatever
    /// the node's own stack then does (a reset, an unreachable, silence) is fine.
    NotServed,
    /// The Service is ignored whole: no rule names it, and its address (if it has one of
    /// the family) is [`Outcome::NotServed`].
    Ignored,
    /// The health-check node port answers HTTP 200 with this many local endpoints, or 503
    /// with 0, in kube-proxy's JSON shape.
    HealthCheck { local_endpoints: usize },
    /// Session affinity, `timeoutSeconds` = [`manifests::AFFINITY_TIMEOUT_SECONDS`]: each of
    /// several clients (separate source addresses) sticks to one of these pods for the
    /// requests it sends within the timeout; after all stay silent for longer than the
    /// timeout, the next pick is fresh: at least one client lands elsewhere (all twelve
    /// staying put by chance has odds of 4^-12), and sticks there again.
    StickyThenFreshAfterIdle { by: &'static [&'static str] },
    /// Session affinity: clients that keep making requests more often than the timeout
    /// keep their endpoint for twice the timeout (every connection renews the affinity, as
    /// kube-proxy's `update @affinity-set` does).
    StickyWhileTalking { by: &'static [&'static str] },
    /// The Service's endpoints change while the row runs (see [`manifests::MUTATIONS`]): a
    /// UDP client re-using one source port is answered by `before` (not answered when
    /// empty), and within [`real::CHANGE_WITHIN`] of the change by `after`: the flow that would
    /// black-hole was removed.
    FollowsEndpointChange { before: &'static [&'static str], after: &'static [&'static str] },
    /// The Service's only endpoint `pod` starts terminating (still serving) while a flow to
    /// it is open (a TCP connection, or a UDP client re-using its source port) and a ready
    /// endpoint appears: new flows go to `new_flows`, the open one keeps being answered by
    /// `pod`.
    KeepsFlowAcrossEndpointChange { pod: &'static str, new_flows: &'static [&'static str] },
}

impl Outcome {
    /// Whether the row changes the cluster (an endpoint change) while it runs.
    pub fn mutates(self) -> bool {
        matches!(self, Outcome::FollowsEndpointChange { .. } | Outcome::KeepsFlowAcrossEndpointChange { .. })
    }
}

/// The source address the answering pod must see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceSeen {
    /// The sender's own address (preserved).
    ClientAddress,
    /// An address of the node the traffic entered the Service through (masqueraded): the
    /// sender's node for pods and nodes, this node for the external clients.
    NodeAddress,
    /// Not checked.
    Any,
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// A sentence; every failure message starts with it.
    pub name: &'static str,
    /// A Service of the fixture (see [`manifests::SERVICES`]).
    pub service: &'static str,
    pub from: Sender,
    pub to: Frontend,
    pub family: Family,
    pub protocol: Protocol,
    pub expect: Outcome,
    pub source: SourceSeen,
}

impl Scenario {
    /// The row once per family it runs in.
    pub fn each_family(&self) -> Vec<Scenario> {
        self.family.each().iter().map(|&family| Scenario { family, ..*self }).collect()
    }

    /// The row's name with its resolved family, as reports print it.
    pub fn label(&self) -> String {
        format!("{} [{}]", self.name, self.family)
    }
}

/// A row, compactly; the argument order reads as the sentence does.
#[allow(clippy::too_many_arguments)]
const fn row(
    name: &'static str,
    service: &'static str,
    from: Sender,
    to: Frontend,
    family: Family,
    protocol: Protocol,
    expect: Outcome,
    source: SourceSeen,
) -> Scenario {
    Scenario { name, service, from, to, family, protocol, expect, source }
}

/// Every echo pod of the fixture: the endpoints of [`ECHO_SERVICE`].
pub const ALL_ECHO_PODS: &[&str] = &["node1-pod1", "node1-pod2", "node2-pod1", "node2-pod2"];
/// The echo pods on this node.
pub const THIS_NODE_ECHO_PODS: &[&str] = &["node1-pod1", "node1-pod2"];
/// The echo pods on the other node.
pub const OTHER_NODE_ECHO_PODS: &[&str] = &["node2-pod1", "node2-pod2"];

const ALL: Outcome = Outcome::Answered { by: ALL_ECHO_PODS };
const THIS: Outcome = Outcome::Answered { by: THIS_NODE_ECHO_PODS };
const OTHER: Outcome = Outcome::Answered { by: OTHER_NODE_ECHO_PODS };

/// How a fixture's proxies choose where NodePorts answer (`--nodeport-addresses`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// No flag: every node address except loopback.
    Default,
    /// `--nodeport-addresses primary`: the `--node-ip` of each family.
    Primary,
    /// `--nodeport-addresses` with the CIDRs of each node's secondary address only (which
    /// excludes its primary LAN address).
    SecondaryOnly,
}

/// Every static table (no endpoint change, no timing), for runners that take them all.
pub const STATIC_TABLES: &[(&str, &[Scenario])] = &[
    ("reachability", REACHABILITY),
    ("no endpoints", NO_ENDPOINTS),
    ("traffic policy", TRAFFIC_POLICY),
    ("load balancer", LOAD_BALANCER),
    ("external IPs", EXTERNAL_IPS),
    ("health checks", HEALTH_CHECKS),
    ("terminating", TERMINATING),
    ("topology", TOPOLOGY),
    ("ignored", IGNORED),
    ("sctp", SCTP),
    ("nodeport addresses (default)", NODEPORT_ADDRESSES_DEFAULT),
];
