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

pub mod cluster;
pub mod fake;
pub mod manifests;
pub mod net;
pub mod real;

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

/// Reachability of a Service with endpoints on both nodes, from everywhere.
pub const REACHABILITY: &[Scenario] = &[
    row(
        "pod on this node to ClusterIP over TCP reaches endpoints on both nodes and keeps its own address",
        ECHO_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        ALL,
        ClientAddress,
    ),
    row(
        "pod on this node to ClusterIP over UDP reaches endpoints on both nodes and keeps its own address",
        ECHO_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Udp,
        ALL,
        ClientAddress,
    ),
    row(
        "pod on the other node to ClusterIP over TCP reaches endpoints on both nodes and keeps its own address",
        ECHO_SERVICE,
        PodOnOtherNode,
        ClusterIp,
        Both,
        Tcp,
        ALL,
        ClientAddress,
    ),
    row(
        "pod on the other node to ClusterIP over UDP reaches endpoints on both nodes and keeps its own address",
        ECHO_SERVICE,
        PodOnOtherNode,
        ClusterIp,
        Both,
        Udp,
        ALL,
        ClientAddress,
    ),
    row(
        "endpoint pod to its own Service's ClusterIP reaches every endpoint, itself through hairpin masquerade",
        ECHO_SERVICE,
        EndpointPodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        ALL,
        ClientAddress,
    ),
    row(
        "the node itself to ClusterIP over TCP reaches endpoints on both nodes",
        ECHO_SERVICE,
        ThisNode,
        ClusterIp,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "the node itself to ClusterIP over UDP reaches endpoints on both nodes",
        ECHO_SERVICE,
        ThisNode,
        ClusterIp,
        Both,
        Udp,
        ALL,
        NodeAddress,
    ),
    row(
        "external client to NodePort on this node over TCP reaches every endpoint, masqueraded to the node",
        ECHO_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "external client to NodePort on this node over UDP reaches every endpoint, masqueraded to the node",
        ECHO_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Udp,
        ALL,
        NodeAddress,
    ),
    row(
        "external client to ClusterIP routed via this node over TCP reaches every endpoint, masqueraded as off-cluster traffic",
        ECHO_SERVICE,
        ExternalClient,
        ClusterIp,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "external client to ClusterIP routed via this node over UDP reaches every endpoint, masqueraded as off-cluster traffic",
        ECHO_SERVICE,
        ExternalClient,
        ClusterIp,
        Both,
        Udp,
        ALL,
        NodeAddress,
    ),
    row(
        "pod on this node to this node's NodePort reaches every endpoint, masqueraded to the node",
        ECHO_SERVICE,
        PodOnThisNode,
        NodePort,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "the node itself to its own NodePort reaches every endpoint",
        ECHO_SERVICE,
        ThisNode,
        NodePort,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
];

/// A Service whose selector matches no pod refuses at once, whoever asks.
pub const NO_ENDPOINTS: &[Scenario] = &[
    row(
        "pod on this node to the ClusterIP of a Service without endpoints over TCP is refused at once",
        EMPTY_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Rejected,
        Any,
    ),
    row(
        "pod on this node to the ClusterIP of a Service without endpoints over UDP is refused at once",
        EMPTY_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Udp,
        Outcome::Rejected,
        Any,
    ),
    row(
        "the node itself to the ClusterIP of a Service without endpoints over TCP is refused at once",
        EMPTY_SERVICE,
        ThisNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Rejected,
        Any,
    ),
    row(
        "the node itself to the ClusterIP of a Service without endpoints over UDP is refused at once",
        EMPTY_SERVICE,
        ThisNode,
        ClusterIp,
        Both,
        Udp,
        Outcome::Rejected,
        Any,
    ),
    row(
        "external client to the NodePort of a Service without endpoints over TCP is refused at once",
        EMPTY_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Tcp,
        Outcome::Rejected,
        Any,
    ),
    row(
        "external client to the NodePort of a Service without endpoints over UDP is refused at once",
        EMPTY_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Udp,
        Outcome::Rejected,
        Any,
    ),
    row(
        "external client to the ClusterIP of a Service without endpoints routed via this node over TCP is refused at once",
        EMPTY_SERVICE,
        ExternalClient,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Rejected,
        Any,
    ),
    row(
        "external client to the ClusterIP of a Service without endpoints routed via this node over UDP is refused at once",
        EMPTY_SERVICE,
        ExternalClient,
        ClusterIp,
        Both,
        Udp,
        Outcome::Rejected,
        Any,
    ),
    row(
        "pod on this node to the NodePort of a Service without endpoints is refused at once",
        EMPTY_SERVICE,
        PodOnThisNode,
        NodePort,
        Both,
        Tcp,
        Outcome::Rejected,
        Any,
    ),
];

/// `internalTrafficPolicy: Local` and `externalTrafficPolicy: Local` (NodePorts and
/// external IPs; load-balancer IPs are in [`LOAD_BALANCER`]).
pub const TRAFFIC_POLICY: &[Scenario] = &[
    row(
        "external client to an externalTrafficPolicy Local NodePort over TCP reaches only this node's endpoints and keeps its own address",
        EXTERNAL_LOCAL_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Tcp,
        THIS,
        ClientAddress,
    ),
    row(
        "external client to an externalTrafficPolicy Local NodePort over UDP reaches only this node's endpoints and keeps its own address",
        EXTERNAL_LOCAL_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Udp,
        THIS,
        ClientAddress,
    ),
    row(
        "external client to an externalTrafficPolicy Local NodePort without endpoints on this node is dropped, not refused",
        OTHER_NODE_EXTERNAL_LOCAL_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Tcp,
        Outcome::Dropped,
        Any,
    ),
    row(
        "external client to an externalTrafficPolicy Local NodePort without endpoints on this node over UDP is dropped",
        OTHER_NODE_EXTERNAL_LOCAL_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Udp,
        Outcome::Dropped,
        Any,
    ),
    row(
        "pod on this node to an externalTrafficPolicy Local NodePort is not external and reaches the other node's endpoints",
        OTHER_NODE_EXTERNAL_LOCAL_SERVICE,
        PodOnThisNode,
        NodePort,
        Both,
        Tcp,
        OTHER,
        ClientAddress,
    ),
    row(
        "the node itself to an externalTrafficPolicy Local NodePort without local endpoints reaches the other node's endpoints",
        OTHER_NODE_EXTERNAL_LOCAL_SERVICE,
        ThisNode,
        NodePort,
        Both,
        Tcp,
        OTHER,
        NodeAddress,
    ),
    row(
        "pod on this node to the ClusterIP of an externalTrafficPolicy Local Service reaches every endpoint (the policy is for external traffic)",
        EXTERNAL_LOCAL_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        ALL,
        ClientAddress,
    ),
    row(
        "pod on this node to an internalTrafficPolicy Local ClusterIP with endpoints only on the other node is dropped",
        OTHER_NODE_INTERNAL_LOCAL_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Dropped,
        Any,
    ),
    row(
        "the node itself to an internalTrafficPolicy Local ClusterIP with endpoints only on the other node is dropped",
        OTHER_NODE_INTERNAL_LOCAL_SERVICE,
        ThisNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Dropped,
        Any,
    ),
    row(
        "pod on the other node to an internalTrafficPolicy Local ClusterIP reaches only its own node's endpoints",
        OTHER_NODE_INTERNAL_LOCAL_SERVICE,
        PodOnOtherNode,
        ClusterIp,
        Both,
        Tcp,
        OTHER,
        ClientAddress,
    ),
    row(
        "pod on this node to an internalTrafficPolicy Local ClusterIP reaches only this node's endpoints",
        INTERNAL_LOCAL_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        THIS,
        ClientAddress,
    ),
    row(
        "pod on this node to an internalTrafficPolicy Local ClusterIP over UDP reaches only this node's endpoints",
        INTERNAL_LOCAL_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Udp,
        THIS,
        ClientAddress,
    ),
    row(
        "pod on the other node to an internalTrafficPolicy Local ClusterIP reaches only the other node's endpoints",
        INTERNAL_LOCAL_SERVICE,
        PodOnOtherNode,
        ClusterIp,
        Both,
        Tcp,
        OTHER,
        ClientAddress,
    ),
    row(
        "the node itself to an internalTrafficPolicy Local ClusterIP reaches only its own endpoints",
        INTERNAL_LOCAL_SERVICE,
        ThisNode,
        ClusterIp,
        Both,
        Tcp,
        THIS,
        NodeAddress,
    ),
    row(
        "external client to an internalTrafficPolicy Local ClusterIP routed via this node reaches only this node's endpoints, masqueraded",
        INTERNAL_LOCAL_SERVICE,
        ExternalClient,
        ClusterIp,
        Both,
        Tcp,
        THIS,
        NodeAddress,
    ),
];

/// `type: LoadBalancer`: ingress IPs like NodePorts, `ipMode: Proxy`, source ranges,
/// `externalTrafficPolicy: Local`.
pub const LOAD_BALANCER: &[Scenario] = &[
    row(
        "external client to a load-balancer IP over TCP reaches every endpoint, masqueraded to the node",
        LB_SERVICE,
        ExternalClient,
        LoadBalancerIp,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "external client to a load-balancer IP over UDP reaches every endpoint, masqueraded to the node",
        LB_SERVICE,
        ExternalClient,
        LoadBalancerIp,
        Both,
        Udp,
        ALL,
        NodeAddress,
    ),
    row(
        "pod on this node to a load-balancer IP reaches every endpoint, masqueraded to the node",
        LB_SERVICE,
        PodOnThisNode,
        LoadBalancerIp,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "pod on the other node to a load-balancer IP is served by its own node, masqueraded to it",
        LB_SERVICE,
        PodOnOtherNode,
        LoadBalancerIp,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "the node itself to a load-balancer IP reaches every endpoint",
        LB_SERVICE,
        ThisNode,
        LoadBalancerIp,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "external client to a LoadBalancer Service's NodePort reaches every endpoint",
        LB_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "external client to an ipMode Proxy ingress IP is not served by the node (the load balancer proxies it)",
        LB_SERVICE,
        ExternalClient,
        ProxyModeLoadBalancerIp,
        Both,
        Tcp,
        Outcome::NotServed,
        Any,
    ),
    row(
        "pod on this node to an ipMode Proxy ingress IP is not served by the node either",
        LB_SERVICE,
        PodOnThisNode,
        ProxyModeLoadBalancerIp,
        Both,
        Udp,
        Outcome::NotServed,
        Any,
    ),
    row(
        "external client inside loadBalancerSourceRanges to the load-balancer IP over TCP reaches every endpoint",
        LB_RANGES_SERVICE,
        ExternalClientInsideRange,
        LoadBalancerIp,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "external client inside loadBalancerSourceRanges to the load-balancer IP over UDP reaches every endpoint",
        LB_RANGES_SERVICE,
        ExternalClientInsideRange,
        LoadBalancerIp,
        Both,
        Udp,
        ALL,
        NodeAddress,
    ),
    row(
        "external client outside loadBalancerSourceRanges to the load-balancer IP over TCP is dropped",
        LB_RANGES_SERVICE,
        ExternalClientOutsideRange,
        LoadBalancerIp,
        Both,
        Tcp,
        Outcome::Dropped,
        Any,
    ),
    row(
        "external client outside loadBalancerSourceRanges to the load-balancer IP over UDP is dropped",
        LB_RANGES_SERVICE,
        ExternalClientOutsideRange,
        LoadBalancerIp,
        Both,
        Udp,
        Outcome::Dropped,
        Any,
    ),
    row(
        "external client outside loadBalancerSourceRanges still reaches the Service's NodePort (ranges guard load-balancer IPs only)",
        LB_RANGES_SERVICE,
        ExternalClientOutsideRange,
        NodePort,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "external client to an externalTrafficPolicy Local load-balancer IP over TCP reaches only this node's endpoints and keeps its own address",
        LB_LOCAL_SERVICE,
        ExternalClient,
        LoadBalancerIp,
        Both,
        Tcp,
        THIS,
        ClientAddress,
    ),
    row(
        "external client to an externalTrafficPolicy Local load-balancer IP over UDP reaches only this node's endpoints and keeps its own address",
        LB_LOCAL_SERVICE,
        ExternalClient,
        LoadBalancerIp,
        Both,
        Udp,
        THIS,
        ClientAddress,
    ),
    row(
        "pod on this node to an externalTrafficPolicy Local load-balancer IP reaches every endpoint and keeps its own address",
        LB_LOCAL_SERVICE,
        PodOnThisNode,
        LoadBalancerIp,
        Both,
        Tcp,
        ALL,
        ClientAddress,
    ),
    row(
        "the node itself to an externalTrafficPolicy Local load-balancer IP reaches every endpoint",
        LB_LOCAL_SERVICE,
        ThisNode,
        LoadBalancerIp,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "external client to an externalTrafficPolicy Local load-balancer IP without endpoints on this node is dropped",
        OTHER_NODE_LB_LOCAL_SERVICE,
        ExternalClient,
        LoadBalancerIp,
        Both,
        Tcp,
        Outcome::Dropped,
        Any,
    ),
    row(
        "pod on this node to an externalTrafficPolicy Local load-balancer IP without local endpoints reaches the other node's",
        OTHER_NODE_LB_LOCAL_SERVICE,
        PodOnThisNode,
        LoadBalancerIp,
        Both,
        Tcp,
        OTHER,
        ClientAddress,
    ),
];

/// `spec.externalIPs`, like load-balancer IPs.
pub const EXTERNAL_IPS: &[Scenario] = &[
    row(
        "external client to an external IP over TCP reaches every endpoint, masqueraded to the node",
        EXTERNAL_IPS_SERVICE,
        ExternalClient,
        ExternalIp,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "external client to an external IP over UDP reaches every endpoint, masqueraded to the node",
        EXTERNAL_IPS_SERVICE,
        ExternalClient,
        ExternalIp,
        Both,
        Udp,
        ALL,
        NodeAddress,
    ),
    row(
        "pod on this node to an external IP reaches every endpoint, masqueraded to the node",
        EXTERNAL_IPS_SERVICE,
        PodOnThisNode,
        ExternalIp,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "the node itself to an external IP reaches every endpoint",
        EXTERNAL_IPS_SERVICE,
        ThisNode,
        ExternalIp,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "external client to an external IP of an externalTrafficPolicy Local Service reaches only this node's endpoints and keeps its own address",
        EXTERNAL_LOCAL_SERVICE,
        ExternalClient,
        ExternalIp,
        Both,
        Tcp,
        THIS,
        ClientAddress,
    ),
    row(
        "pod on this node to an external IP of an externalTrafficPolicy Local Service reaches every endpoint and keeps its own address",
        EXTERNAL_LOCAL_SERVICE,
        PodOnThisNode,
        ExternalIp,
        Both,
        Tcp,
        ALL,
        ClientAddress,
    ),
];

/// `spec.healthCheckNodePort` of `externalTrafficPolicy: Local` load balancers.
pub const HEALTH_CHECKS: &[Scenario] = &[
    row(
        "the health-check node port of a Local load balancer with two ready endpoints on this node answers 200 with localEndpoints 2",
        LB_LOCAL_SERVICE,
        ExternalClient,
        HealthCheck,
        Both,
        Tcp,
        Outcome::HealthCheck { local_endpoints: 2 },
        Any,
    ),
    row(
        "the health-check node port of a Local load balancer without endpoints on this node answers 503 with localEndpoints 0",
        OTHER_NODE_LB_LOCAL_SERVICE,
        ExternalClient,
        HealthCheck,
        Both,
        Tcp,
        Outcome::HealthCheck { local_endpoints: 0 },
        Any,
    ),
];

/// Terminating endpoints: used only when no endpoint is ready, and only while serving.
pub const TERMINATING: &[Scenario] = &[
    row(
        "pod on this node to a Service whose endpoints are all terminating but serving reaches those endpoints",
        TERMINATING_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Answered { by: &["node1-pod1", "node2-pod1"] },
        ClientAddress,
    ),
    row(
        "pod on this node to a Service whose endpoints are all terminating but serving over UDP reaches those endpoints",
        TERMINATING_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Udp,
        Outcome::Answered { by: &["node1-pod1", "node2-pod1"] },
        ClientAddress,
    ),
    row(
        "external client to such a Service's ClusterIP reaches the terminating endpoints too",
        TERMINATING_SERVICE,
        ExternalClient,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Answered { by: &["node1-pod1", "node2-pod1"] },
        NodeAddress,
    ),
    row(
        "pod on this node to a Service with a ready and a terminating endpoint reaches only the ready one",
        READY_AND_TERMINATING_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Answered { by: &["node2-pod2"] },
        ClientAddress,
    ),
    row(
        "pod on this node to a Service whose endpoints are terminating and no longer serving is refused",
        TERMINATING_NOT_SERVING_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Rejected,
        Any,
    ),
    row(
        "pod on this node to a Service whose Pods are being deleted (still Ready) reaches them; the not-Ready one never",
        LEAVING_PODS_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Answered { by: &["node1-pod1", "node2-pod1"] },
        ClientAddress,
    ),
    row(
        "pod on the other node to a Service whose Pods are being deleted reaches them too",
        LEAVING_PODS_SERVICE,
        PodOnOtherNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Answered { by: &["node1-pod1", "node2-pod1"] },
        ClientAddress,
    ),
];

/// Topology: `trafficDistribution` (hints set by the controller from the Nodes' zones) and
/// hand-written hints, with upstream's fallbacks. node1 is in zone-a, node2 in zone-b.
pub const TOPOLOGY: &[Scenario] = &[
    row(
        "pod on this node to a PreferClose Service reaches only endpoints in its zone",
        PREFER_CLOSE_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        THIS,
        ClientAddress,
    ),
    row(
        "pod on the other node to a PreferClose Service reaches only endpoints in its own zone",
        PREFER_CLOSE_SERVICE,
        PodOnOtherNode,
        ClusterIp,
        Both,
        Tcp,
        OTHER,
        ClientAddress,
    ),
    row(
        "the node itself to a PreferClose Service reaches only endpoints in its zone",
        PREFER_CLOSE_SERVICE,
        ThisNode,
        ClusterIp,
        Both,
        Tcp,
        THIS,
        NodeAddress,
    ),
    row(
        "external client to a PreferClose Service's NodePort reaches only endpoints in this node's zone",
        PREFER_CLOSE_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Tcp,
        THIS,
        NodeAddress,
    ),
    row(
        "pod on this node to a PreferSameZone Service reaches only endpoints in its zone",
        PREFER_SAME_ZONE_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        THIS,
        ClientAddress,
    ),
    row(
        "pod on this node to a PreferSameNode Service reaches only endpoints on its node",
        PREFER_SAME_NODE_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        THIS,
        ClientAddress,
    ),
    row(
        "pod on the other node to a PreferSameNode Service reaches only endpoints on its own node",
        PREFER_SAME_NODE_SERVICE,
        PodOnOtherNode,
        ClusterIp,
        Both,
        Tcp,
        OTHER,
        ClientAddress,
    ),
    row(
        "pod on this node to a PreferClose Service with no endpoint in its zone falls back to every endpoint",
        PREFER_CLOSE_ELSEWHERE_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        OTHER,
        ClientAddress,
    ),
    row(
        "pod on this node to a PreferSameNode Service with no endpoint on its node or in its zone falls back to every endpoint",
        PREFER_SAME_NODE_ELSEWHERE_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        OTHER,
        ClientAddress,
    ),
    row(
        "pod on this node to a Service with hand-written zone hints reaches only the endpoint hinted for its zone",
        EXPLICIT_HINTS_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Answered { by: &["node1-pod2"] },
        ClientAddress,
    ),
    row(
        "pod on the other node to a Service with hand-written zone hints reaches only the endpoints hinted for its zone",
        EXPLICIT_HINTS_SERVICE,
        PodOnOtherNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Answered { by: &["node1-pod1", "node2-pod1"] },
        ClientAddress,
    ),
    row(
        "pod on this node to a Service where one ready endpoint lacks hints ignores the hints",
        HALF_HINTED_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Answered { by: &["node1-pod1", "node2-pod1", "node2-pod2"] },
        ClientAddress,
    ),
    row(
        "pod on this node to a Service whose hints name no endpoint for its zone ignores the hints",
        FOREIGN_ZONE_HINTS_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Answered { by: &["node1-pod1", "node2-pod1"] },
        ClientAddress,
    ),
];

/// Services svcplane must not program at all.
pub const IGNORED: &[Scenario] = &[
    row(
        "a Service labelled for another proxy (service.kubernetes.io/service-proxy-name) is not programmed: its ClusterIP is not served",
        OTHER_PROXY_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Ignored,
        Any,
    ),
    row(
        "a Service labelled for another proxy is not programmed: its NodePort is not served",
        OTHER_PROXY_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Tcp,
        Outcome::Ignored,
        Any,
    ),
    row(
        "a headless Service is not programmed",
        HEADLESS_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Ignored,
        Any,
    ),
    row(
        "an ExternalName Service is not programmed",
        EXTERNAL_NAME_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::Ignored,
        Any,
    ),
];

/// SCTP, where the kernel has it.
pub const SCTP: &[Scenario] = &[
    row(
        "pod on this node to ClusterIP over SCTP reaches endpoints on both nodes and keeps its own address",
        SCTP_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Sctp,
        ALL,
        ClientAddress,
    ),
    row(
        "the node itself to ClusterIP over SCTP reaches endpoints on both nodes",
        SCTP_SERVICE,
        ThisNode,
        ClusterIp,
        Both,
        Sctp,
        ALL,
        NodeAddress,
    ),
    row(
        "external client to NodePort over SCTP reaches every endpoint, masqueraded to the node",
        SCTP_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Sctp,
        ALL,
        NodeAddress,
    ),
];

/// NodePorts with no `--nodeport-addresses`: every node address except loopback.
pub const NODEPORT_ADDRESSES_DEFAULT: &[Scenario] = &[
    row(
        "by default a NodePort answers on the node's primary address",
        ECHO_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "by default a NodePort answers on every other node address too",
        ECHO_SERVICE,
        ExternalClient,
        NodePortOnSecondaryAddress,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "a NodePort is never reachable on loopback over TCP",
        ECHO_SERVICE,
        ThisNode,
        NodePortOnLoopback,
        Both,
        Tcp,
        Outcome::NotServed,
        Any,
    ),
    row(
        "a NodePort is never reachable on loopback over UDP",
        ECHO_SERVICE,
        ThisNode,
        NodePortOnLoopback,
        Both,
        Udp,
        Outcome::NotServed,
        Any,
    ),
];

/// NodePorts with `--nodeport-addresses primary`.
pub const NODEPORT_ADDRESSES_PRIMARY: &[Scenario] = &[
    row(
        "with --nodeport-addresses primary a NodePort answers on the node's primary address",
        ECHO_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "with --nodeport-addresses primary a NodePort does not answer on the node's other addresses",
        ECHO_SERVICE,
        ExternalClient,
        NodePortOnSecondaryAddress,
        Both,
        Tcp,
        Outcome::NotServed,
        Any,
    ),
    row(
        "with --nodeport-addresses primary a NodePort is not reachable on loopback",
        ECHO_SERVICE,
        ThisNode,
        NodePortOnLoopback,
        Both,
        Tcp,
        Outcome::NotServed,
        Any,
    ),
];

/// NodePorts with `--nodeport-addresses` set to CIDRs that exclude the primary address.
pub const NODEPORT_ADDRESSES_CIDRS: &[Scenario] = &[
    row(
        "with --nodeport-addresses CIDRs a NodePort answers on node addresses inside them",
        ECHO_SERVICE,
        ExternalClient,
        NodePortOnSecondaryAddress,
        Both,
        Tcp,
        ALL,
        NodeAddress,
    ),
    row(
        "with --nodeport-addresses CIDRs a NodePort does not answer on a node address outside them",
        ECHO_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Tcp,
        Outcome::NotServed,
        Any,
    ),
    row(
        "with --nodeport-addresses CIDRs a NodePort without endpoints is refused on node addresses inside them",
        EMPTY_SERVICE,
        ExternalClient,
        NodePortOnSecondaryAddress,
        Both,
        Tcp,
        Outcome::Rejected,
        Any,
    ),
];

/// `sessionAffinity: ClientIP` with a 3 s timeout.
pub const AFFINITY: &[Scenario] = &[
    row(
        "external clients to a ClientIP-affinity ClusterIP over UDP each stick to one endpoint, and pick afresh after a silence longer than the timeout",
        AFFINITY_SERVICE,
        ExternalClient,
        ClusterIp,
        Both,
        Udp,
        Outcome::StickyThenFreshAfterIdle { by: ALL_ECHO_PODS },
        Any,
    ),
    row(
        "external clients to a ClientIP-affinity NodePort over TCP each stick to one endpoint, and pick afresh after a silence longer than the timeout",
        AFFINITY_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Tcp,
        Outcome::StickyThenFreshAfterIdle { by: ALL_ECHO_PODS },
        Any,
    ),
    row(
        "external clients that keep connecting more often than the affinity timeout keep their endpoint beyond it",
        AFFINITY_RENEWED_SERVICE,
        ExternalClient,
        ClusterIp,
        Both,
        Tcp,
        Outcome::StickyWhileTalking { by: ALL_ECHO_PODS },
        Any,
    ),
];

/// Endpoint changes under way: stale UDP flows removed, open flows to a terminating
/// endpoint kept.
pub const ENDPOINT_CHANGES: &[Scenario] = &[
    row(
        "a UDP client re-using its source port follows the Service to its new endpoint when the old one goes away",
        UDP_MOVING_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Udp,
        Outcome::FollowsEndpointChange { before: &["node1-pod1"], after: &["node2-pod1"] },
        ClientAddress,
    ),
    row(
        "an external UDP client re-using its source port on a NodePort follows the Service to its new endpoint",
        UDP_MOVING_SERVICE,
        ExternalClient,
        NodePort,
        Both,
        Udp,
        Outcome::FollowsEndpointChange { before: &["node1-pod1"], after: &["node2-pod1"] },
        NodeAddress,
    ),
    row(
        "a UDP client re-using its source port is answered as soon as the Service gets its first endpoint",
        UDP_FIRST_ENDPOINT_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Udp,
        Outcome::FollowsEndpointChange { before: &[], after: &["node1-pod2"] },
        ClientAddress,
    ),
    row(
        "a UDP client that was sending to an address before its Service existed is answered once the Service appears with an endpoint",
        UDP_LATE_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Udp,
        Outcome::FollowsEndpointChange { before: &[], after: &["node1-pod2"] },
        ClientAddress,
    ),
    row(
        "a UDP flow to an endpoint that starts terminating (still serving) keeps being answered by it while new flows go to the ready one",
        UDP_TERMINATING_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Udp,
        Outcome::KeepsFlowAcrossEndpointChange { pod: "node1-pod1", new_flows: &["node2-pod2"] },
        ClientAddress,
    ),
    row(
        "an established TCP connection to an endpoint that starts terminating keeps working while new connections go to the ready one",
        TCP_TERMINATING_SERVICE,
        PodOnThisNode,
        ClusterIp,
        Both,
        Tcp,
        Outcome::KeepsFlowAcrossEndpointChange { pod: "node1-pod1", new_flows: &["node2-pod2"] },
        ClientAddress,
    ),
];

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
