//! The Service scenario table: what a client somewhere in the cluster must experience when
//! it talks to a Service address, written once for every backend.
//!
//! A row names its sentence, who sends ([`Sender`]), to which address ([`Frontend`]) of which
//! Service of the shared [`cluster`] fixture, the family and protocol, what must happen
//! ([`Outcome`]) and which source address the answering pod must see ([`SourceSeen`]).
//! Nothing here knows how the dataplane is programmed: a backend's test file starts a
//! [`cluster::Cluster`] with its own [`cluster::Backend`] and runs the same tables through
//! [`check_rows`].
//!
//! Roles: "this node" is node1 (whose proxy is under test for external traffic), "the other
//! node" is node2; each node runs its own proxy, so a pod on node2 is served by node2's.

// Every backend's test crate includes this module and uses its own subset of it.
#![allow(dead_code)]

pub mod cluster;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use svcplane_testbed::{EchoReply, ProbeError};

pub use svcplane_testbed::Protocol;

use Family::{V4, V6};
use Protocol::{Tcp, Udp};

use crate::scenarios::cluster::{
    Cluster, ECHO_SERVICE, EMPTY_SERVICE, ENDPOINT_POD_ON_THIS_NODE, EXTERNAL_LOCAL_SERVICE,
    OTHER_NODE_EXTERNAL_LOCAL_SERVICE, OTHER_NODE_INTERNAL_LOCAL_SERVICE, POD_ON_OTHER_NODE, POD_ON_THIS_NODE,
    THIS_NODE,
};

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
    /// The external client on the LAN; it routes the pod and Service ranges via this node.
    ExternalClient,
}

/// Which address of the Service a probe goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frontend {
    /// The Service's ClusterIP of the row's family, Service port.
    ClusterIp,
    /// This node's address of the row's family, the Service port's nodePort.
    NodePort,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// What must happen to the probes of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every probe is answered by one of these pods, and each of them answers at least once
    /// (probes continue, bounded, until all have).
    Answered { by: &'static [&'static str] },
    /// Refused fast: TCP reset or ICMP port unreachable within [`REJECT_WITHIN`], not a
    /// timeout.
    Rejected,
    /// Nothing comes back: the probe times out.
    Dropped,
}

/// The source address the answering pod must see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceSeen {
    /// The sender's own address (preserved).
    ClientAddress,
    /// An address of the node the traffic entered the Service through (masqueraded): the
    /// sender's node for pods and nodes, this node for the external client.
    NodeAddress,
    /// Not checked.
    Any,
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// A sentence; every failure message starts with it.
    pub name: &'static str,
    /// A Service of the fixture (see [`cluster::SERVICES`]).
    pub service: &'static str,
    pub from: Sender,
    pub to: Frontend,
    pub family: Family,
    pub protocol: Protocol,
    pub expect: Outcome,
    pub source: SourceSeen,
}

/// Every echo pod of the fixture: the endpoints of [`ECHO_SERVICE`].
pub const ALL_ECHO_PODS: &[&str] = &["node1-pod1", "node1-pod2", "node2-pod1", "node2-pod2"];
/// The echo pods on this node.
pub const THIS_NODE_ECHO_PODS: &[&str] = &["node1-pod1", "node1-pod2"];
/// The echo pods on the other node.
pub const OTHER_NODE_ECHO_PODS: &[&str] = &["node2-pod1", "node2-pod2"];

/// A Rejected row's probes must fail within this.
pub const REJECT_WITHIN: Duration = Duration::from_secs(1);
/// Time limit of one probe that should be answered or refused: long enough that a refusal
/// arriving in time is told apart from a timeout.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);
/// Time limit of one probe of a Dropped row (the row waits this long per probe).
const DROP_TIMEOUT: Duration = Duration::from_millis(800);
/// Probes of an Answered row: at least this many, then until every expected pod answered,
/// at most the maximum. With 4 uniform endpoints, missing one in 100 probes has odds of
/// about 1e-12, so the bound cannot flake.
const MIN_ANSWER_PROBES: usize = 6;
const MAX_ANSWER_PROBES: usize = 100;
/// The kernel rate-limits ICMP errors per destination (a burst of 6, then 1 a second), and
/// refusals are ICMP errors: two probes a row, and at most three Rejected rows per sender
/// and family in one cluster, keep every refusal inside the burst.
const REJECT_PROBES: usize = 2;
const DROP_PROBES: usize = 2;
/// No row may take longer than this, whatever the probes do.
const ROW_DEADLINE: Duration = Duration::from_secs(20);

const ALL: Outcome = Outcome::Answered { by: ALL_ECHO_PODS };

/// IPv4 reachability of a Service with endpoints on both nodes, from everywhere.
pub const REACHABILITY: &[Scenario] = &[
    Scenario {
        name: "pod on this node to ClusterIP over TCP reaches endpoints on both nodes and keeps its own address",
        service: ECHO_SERVICE,
        from: Sender::PodOnThisNode,
        to: Frontend::ClusterIp,
        family: V4,
        protocol: Tcp,
        expect: ALL,
        source: SourceSeen::ClientAddress,
    },
    Scenario {
        name: "pod on this node to ClusterIP over UDP reaches endpoints on both nodes and keeps its own address",
        service: ECHO_SERVICE,
        from: Sender::PodOnThisNode,
        to: Frontend::ClusterIp,
        family: V4,
        protocol: Udp,
        expect: ALL,
        source: SourceSeen::ClientAddress,
    },
    Scenario {
        name: "pod on the other node to ClusterIP over TCP reaches endpoints on both nodes and keeps its own address",
        service: ECHO_SERVICE,
        from: Sender::PodOnOtherNode,
        to: Frontend::ClusterIp,
        family: V4,
        protocol: Tcp,
        expect: ALL,
        source: SourceSeen::ClientAddress,
    },
    Scenario {
        name: "pod on the other node to ClusterIP over UDP reaches endpoints on both nodes and keeps its own address",
        service: ECHO_SERVICE,
        from: Sender::PodOnOtherNode,
        to: Frontend::ClusterIp,
        family: V4,
        protocol: Udp,
        expect: ALL,
        source: SourceSeen::ClientAddress,
    },
    Scenario {
        name: "endpoint pod to its own Service's ClusterIP reaches every endpoint, itself through hairpin masquerade",
        service: ECHO_SERVICE,
        from: Sender::EndpointPodOnThisNode,
        to: Frontend::ClusterIp,
        family: V4,
        protocol: Tcp,
        expect: ALL,
        source: SourceSeen::ClientAddress,
    },
    Scenario {
        name: "the node itself to ClusterIP over TCP reaches endpoints on both nodes",
        service: ECHO_SERVICE,
        from: Sender::ThisNode,
        to: Frontend::ClusterIp,
        family: V4,
        protocol: Tcp,
        expect: ALL,
        source: SourceSeen::NodeAddress,
    },
    Scenario {
        name: "the node itself to ClusterIP over UDP reaches endpoints on both nodes",
        service: ECHO_SERVICE,
        from: Sender::ThisNode,
        to: Frontend::ClusterIp,
        family: V4,
        protocol: Udp,
        expect: ALL,
        source: SourceSeen::NodeAddress,
    },
    Scenario {
        name: "external client to NodePort on this node over TCP reaches every endpoint, masqueraded to the node",
        service: ECHO_SERVICE,
        from: Sender::ExternalClient,
        to: Frontend::NodePort,
        family: V4,
        protocol: Tcp,
        expect: ALL,
        source: SourceSeen::NodeAddress,
    },
    Scenario {
        name: "external client to NodePort on this node over UDP reaches every endpoint, masqueraded to the node",
        service: ECHO_SERVICE,
        from: Sender::ExternalClient,
        to: Frontend::NodePort,
        family: V4,
        protocol: Udp,
        expect: ALL,
        source: SourceSeen::NodeAddress,
    },
    Scenario {
        name: "external client to ClusterIP routed via this node over TCP reaches every endpoint, masqueraded as off-cluster traffic",
        service: ECHO_SERVICE,
        from: Sender::ExternalClient,
        to: Frontend::ClusterIp,
        family: V4,
        protocol: Tcp,
        expect: ALL,
        source: SourceSeen::NodeAddress,
    },
    Scenario {
        name: "external client to ClusterIP routed via this node over UDP reaches every endpoint, masqueraded as off-cluster traffic",
        service: ECHO_SERVICE,
        from: Sender::ExternalClient,
        to: Frontend::ClusterIp,
        family: V4,
        protocol: Udp,
        expect: ALL,
        source: SourceSeen::NodeAddress,
    },
];

/// A Service whose selector matches no pod refuses at once, whoever asks, in both families.
pub const NO_ENDPOINTS: &[Scenario] = &[
    Scenario {
        name: "pod on this node to the ClusterIP of a Service without endpoints over TCP is refused at once",
        service: EMPTY_SERVICE,
        from: Sender::PodOnThisNode,
        to: Frontend::ClusterIp,
        family: V4,
        protocol: Tcp,
        expect: Outcome::Rejected,
        source: SourceSeen::Any,
    },
    Scenario {
        name: "pod on this node to the ClusterIP of a Service without endpoints over UDP is refused at once",
        service: EMPTY_SERVICE,
        from: Sender::PodOnThisNode,
        to: Frontend::ClusterIp,
        family: V4,
        protocol: Udp,
        expect: Outcome::Rejected,
        source: SourceSeen::Any,
    },
    Scenario {
        name: "the node itself to the ClusterIP of a Service without endpoints over TCP is refused at once",
        service: EMPTY_SERVICE,
        from: Sender::ThisNode,
        to: Frontend::ClusterIp,
        family: V4,
        protocol: Tcp,
        expect: Outcome::Rejected,
        source: SourceSeen::Any,
    },
    Scenario {
        name: "the node itself to the ClusterIP of a Service without endpoints over UDP is refused at once",
        service: EMPTY_SERVICE,
        from: Sender::ThisNode,
        to: Frontend::ClusterIp,
        family: V4,
        protocol: Udp,
        expect: Outcome::Rejected,
        source: SourceSeen::Any,
    },
    Scenario {
        name: "external client to the NodePort of a Service without endpoints over TCP is refused at once",
        service: EMPTY_SERVICE,
        from: Sender::ExternalClient,
        to: Frontend::NodePort,
        family: V4,
        protocol: Tcp,
        expect: Outcome::Rejected,
        source: SourceSeen::Any,
    },
    Scenario {
        name: "external client to the NodePort of a Service without endpoints over UDP is refused at once",
        service: EMPTY_SERVICE,
        from: Sender::ExternalClient,
        to: Frontend::NodePort,
        family: V4,
        protocol: Udp,
        expect: Outcome::Rejected,
        source: SourceSeen::Any,
    },
    Scenario {
        name: "external client to the ClusterIP of a Service without endpoints routed via this node over TCP is refused at once",
        service: EMPTY_SERVICE,
        from: Sender::ExternalClient,
        to: Frontend::ClusterIp,
        family: V4,
        protocol: Tcp,
        expect: Outcome::Rejected,
        source: SourceSeen::Any,
    },
    Scenario {
        name: "pod on this node to the IPv6 ClusterIP of a Service without endpoints over TCP is refused at once",
        service: EMPTY_SERVICE,
        from: Sender::PodOnThisNode,
        to: Frontend::ClusterIp,
        family: V6,
        protocol: Tcp,
        expect: Outcome::Rejected,
        source: SourceSeen::Any,
    },
    Scenario {
        name: "pod on this node to the IPv6 ClusterIP of a Service without endpoints over UDP is refused at once",
        service: EMPTY_SERVICE,
        from: Sender::PodOnThisNode,
        to: Frontend::ClusterIp,
        family: V6,
        protocol: Udp,
        expect: Outcome::Rejected,
        source: SourceSeen::Any,
    },
    Scenario {
        name: "the node itself to the IPv6 ClusterIP of a Service without endpoints over TCP is refused at once",
        service: EMPTY_SERVICE,
        from: Sender::ThisNode,
        to: Frontend::ClusterIp,
        family: V6,
        protocol: Tcp,
        expect: Outcome::Rejected,
        source: SourceSeen::Any,
    },
    Scenario {
        name: "external client to the IPv6 NodePort of a Service without endpoints over TCP is refused at once",
        service: EMPTY_SERVICE,
        from: Sender::ExternalClient,
        to: Frontend::NodePort,
        family: V6,
        protocol: Tcp,
        expect: Outcome::Rejected,
        source: SourceSeen::Any,
    },
    Scenario {
        name: "external client to the IPv6 NodePort of a Service without endpoints over UDP is refused at once",
        service: EMPTY_SERVICE,
        from: Sender::ExternalClient,
        to: Frontend::NodePort,
        family: V6,
        protocol: Udp,
        expect: Outcome::Rejected,
        source: SourceSeen::Any,
    },
];

/// `internalTrafficPolicy` and `externalTrafficPolicy: Local`.
pub const TRAFFIC_POLICY: &[Scenario] = &[
    Scenario {
        name: "external client to an externalTrafficPolicy Local NodePort over TCP reaches only this node's endpoints and keeps its own address",
        service: EXTERNAL_LOCAL_SERVICE,
        from: Sender::ExternalClient,
        to: Frontend::NodePort,
        family: V4,
        protocol: Tcp,
        expect: Outcome::Answered { by: THIS_NODE_ECHO_PODS },
        source: SourceSeen::ClientAddress,
    },
    Scenario {
        name: "external client to an externalTrafficPolicy Local NodePort over UDP reaches only this node's endpoints and keeps its own address",
        service: EXTERNAL_LOCAL_SERVICE,
        from: Sender::ExternalClient,
        to: Frontend::NodePort,
        family: V4,
        protocol: Udp,
        expect: Outcome::Answered { by: THIS_NODE_ECHO_PODS },
        source: SourceSeen::ClientAddress,
    },
    Scenario {
        name: "external client to an externalTrafficPolicy Local NodePort without endpoints on this node is dropped, not refused",
        service: OTHER_NODE_EXTERNAL_LOCAL_SERVICE,
        from: Sender::ExternalClient,
        to: Frontend::NodePort,
        family: V4,
        protocol: Tcp,
        expect: Outcome::Dropped,
        source: SourceSeen::Any,
    },
    Scenario {
        name: "pod on this node to an externalTrafficPolicy Local NodePort is not external and reaches the other node's endpoints",
        service: OTHER_NODE_EXTERNAL_LOCAL_SERVICE,
        from: Sender::PodOnThisNode,
        to: Frontend::NodePort,
        family: V4,
        protocol: Tcp,
        expect: Outcome::Answered { by: OTHER_NODE_ECHO_PODS },
        source: SourceSeen::ClientAddress,
    },
    Scenario {
        name: "pod on this node to an internalTrafficPolicy Local ClusterIP with endpoints only on the other node is dropped",
        service: OTHER_NODE_INTERNAL_LOCAL_SERVICE,
        from: Sender::PodOnThisNode,
        to: Frontend::ClusterIp,
        family: V4,
        protocol: Tcp,
        expect: Outcome::Dropped,
        source: SourceSeen::Any,
    },
    Scenario {
        name: "pod on the other node to an internalTrafficPolicy Local ClusterIP reaches only its own node's endpoints",
        service: OTHER_NODE_INTERNAL_LOCAL_SERVICE,
        from: Sender::PodOnOtherNode,
        to: Frontend::ClusterIp,
        family: V4,
        protocol: Tcp,
        expect: Outcome::Answered { by: OTHER_NODE_ECHO_PODS },
        source: SourceSeen::ClientAddress,
    },
];

/// The dual-stack Service answers over IPv6 (IPv6 refusals are in [`NO_ENDPOINTS`]).
pub const IPV6: &[Scenario] = &[
    Scenario {
        name: "pod on this node to the IPv6 ClusterIP over TCP reaches endpoints on both nodes and keeps its own address",
        service: ECHO_SERVICE,
        from: Sender::PodOnThisNode,
        to: Frontend::ClusterIp,
        family: V6,
        protocol: Tcp,
        expect: ALL,
        source: SourceSeen::ClientAddress,
    },
    Scenario {
        name: "pod on this node to the IPv6 ClusterIP over UDP reaches endpoints on both nodes and keeps its own address",
        service: ECHO_SERVICE,
        from: Sender::PodOnThisNode,
        to: Frontend::ClusterIp,
        family: V6,
        protocol: Udp,
        expect: ALL,
        source: SourceSeen::ClientAddress,
    },
    Scenario {
        name: "pod on the other node to the IPv6 ClusterIP over TCP reaches endpoints on both nodes and keeps its own address",
        service: ECHO_SERVICE,
        from: Sender::PodOnOtherNode,
        to: Frontend::ClusterIp,
        family: V6,
        protocol: Tcp,
        expect: ALL,
        source: SourceSeen::ClientAddress,
    },
    Scenario {
        name: "pod on the other node to the IPv6 ClusterIP over UDP reaches endpoints on both nodes and keeps its own address",
        service: ECHO_SERVICE,
        from: Sender::PodOnOtherNode,
        to: Frontend::ClusterIp,
        family: V6,
        protocol: Udp,
        expect: ALL,
        source: SourceSeen::ClientAddress,
    },
    Scenario {
        name: "endpoint pod to its own Service's IPv6 ClusterIP reaches every endpoint, itself through hairpin masquerade",
        service: ECHO_SERVICE,
        from: Sender::EndpointPodOnThisNode,
        to: Frontend::ClusterIp,
        family: V6,
        protocol: Tcp,
        expect: ALL,
        source: SourceSeen::ClientAddress,
    },
    Scenario {
        name: "the node itself to the IPv6 ClusterIP over TCP reaches endpoints on both nodes",
        service: ECHO_SERVICE,
        from: Sender::ThisNode,
        to: Frontend::ClusterIp,
        family: V6,
        protocol: Tcp,
        expect: ALL,
        source: SourceSeen::NodeAddress,
    },
    Scenario {
        name: "external client to the IPv6 NodePort on this node over TCP reaches every endpoint, masqueraded to the node",
        service: ECHO_SERVICE,
        from: Sender::ExternalClient,
        to: Frontend::NodePort,
        family: V6,
        protocol: Tcp,
        expect: ALL,
        source: SourceSeen::NodeAddress,
    },
    Scenario {
        name: "external client to the IPv6 ClusterIP routed via this node over TCP reaches every endpoint, masqueraded as off-cluster traffic",
        service: ECHO_SERVICE,
        from: Sender::ExternalClient,
        to: Frontend::ClusterIp,
        family: V6,
        protocol: Tcp,
        expect: ALL,
        source: SourceSeen::NodeAddress,
    },
];

/// A row resolved against a running cluster: who sends what where.
#[derive(Debug, Clone)]
pub struct Probe {
    pub protocol: Protocol,
    /// The sender's namespace and a label for messages.
    pub namespace: String,
    pub sender: String,
    /// The sender's own address of the row's family.
    pub client_ip: IpAddr,
    /// The pod name of the sender, if it is a pod (for the hairpin rule).
    pub sender_pod: Option<String>,
    /// The addresses of the node the traffic enters the Service through.
    pub entry_node_ips: Vec<IpAddr>,
    pub target: SocketAddr,
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} from {} [{}] to {}", self.protocol, self.sender, self.client_ip, self.target)
    }
}

impl Probe {
    /// Resolves `row` in `cluster`.
    pub fn of(cluster: &Cluster, row: &Scenario) -> Result<Probe, String> {
        let lab = cluster.lab();
        let service =
            cluster.service(row.service).ok_or_else(|| format!("no Service {:?} in the fixture", row.service))?;
        let pick = |ips: [IpAddr; 2]| match row.family {
            Family::V4 => ips[0],
            Family::V6 => ips[1],
        };
        let this_node = lab.node(THIS_NODE);
        let (namespace, sender, client_ip, sender_pod, entry_node) = match row.from {
            Sender::PodOnThisNode | Sender::EndpointPodOnThisNode | Sender::PodOnOtherNode => {
                let name = match row.from {
                    Sender::PodOnThisNode => POD_ON_THIS_NODE,
                    Sender::EndpointPodOnThisNode => ENDPOINT_POD_ON_THIS_NODE,
                    _ => POD_ON_OTHER_NODE,
                };
                let pod = lab.pod(name);
                let node = lab.node(pod.node());
                (pod.namespace_name(), format!("pod {name}"), pick(pod.ips()), Some(name.to_owned()), node)
            }
            Sender::ThisNode => (
                this_node.namespace_name(),
                format!("node {}", this_node.name()),
                pick(this_node.ips()),
                None,
                this_node,
            ),
            Sender::ExternalClient => {
                let client = lab.client(1);
                (client.namespace_name(), format!("external {}", client.name()), pick(client.ips()), None, this_node)
            }
        };
        let port = service.port_for(row.protocol);
        let target = match row.to {
            Frontend::ClusterIp => {
                let ip = match row.family {
                    Family::V4 => Some(IpAddr::V4(service.cluster_ip_v4)),
                    Family::V6 => service.cluster_ip_v6.map(IpAddr::V6),
                }
                .ok_or_else(|| format!("Service {} has no ClusterIP of that family", service.name))?;
                SocketAddr::new(ip, port.port)
            }
            Frontend::NodePort => {
                let node_port = port.node_port.ok_or_else(|| format!("Service {} has no nodePort", service.name))?;
                SocketAddr::new(pick(this_node.ips()), node_port)
            }
        };
        Ok(Probe {
            protocol: row.protocol,
            namespace: namespace.to_owned(),
            sender,
            client_ip,
            sender_pod,
            entry_node_ips: entry_node.ips().to_vec(),
            target,
        })
    }

    /// One request, fresh source port each time (so every probe is a new connection for
    /// conntrack and draws its endpoint anew).
    pub fn send(&self, cluster: &Cluster, timeout: Duration) -> Result<EchoReply, ProbeError> {
        match self.protocol {
            Protocol::Tcp => cluster.lab().tcp_request(&self.namespace, self.target, timeout),
            Protocol::Udp => cluster.lab().udp_request(&self.namespace, self.target, timeout, None),
        }
    }

    /// Checks the source the pod saw. A pod that drew itself (hairpin) must always see a
    /// node address, whatever the row expects for the others.
    pub fn check_source(&self, expected: SourceSeen, reply: &EchoReply) -> Result<(), String> {
        let seen = reply.client_addr.ip();
        let hairpin = self.sender_pod.as_deref() == Some(reply.server_name.as_str());
        let expected = if hairpin { SourceSeen::NodeAddress } else { expected };
        let ok = match expected {
            SourceSeen::ClientAddress => seen == self.client_ip,
            SourceSeen::NodeAddress => self.entry_node_ips.contains(&seen),
            SourceSeen::Any => true,
        };
        if ok {
            return Ok(());
        }
        let wanted = match expected {
            SourceSeen::ClientAddress => format!("the sender's own address {}", self.client_ip),
            _ => format!("a node address {:?}", self.entry_node_ips),
        };
        let hairpin = if hairpin { " (hairpin: it answered its own request)" } else { "" };
        Err(format!("{} saw the client as {seen}, expected {wanted}{hairpin}", reply.server_name))
    }
}

/// What an Answered row saw: pod name -> replies.
pub type Answers = BTreeMap<String, usize>;

/// Runs one row; the error names the row, the probe and what went wrong.
pub fn run(cluster: &Cluster, row: &Scenario) -> Result<Answers, String> {
    let probe = Probe::of(cluster, row).map_err(|detail| format!("row `{}`: {detail}", row.name))?;
    let result = match row.expect {
        Outcome::Answered { by } => expect_answered(cluster, &probe, by, row.source),
        Outcome::Rejected => expect_rejected(cluster, &probe).map(|()| Answers::new()),
        Outcome::Dropped => expect_dropped(cluster, &probe).map(|()| Answers::new()),
    };
    result.map_err(|detail| format!("row `{}` ({probe}): {detail}", row.name))
}

fn expect_answered(cluster: &Cluster, probe: &Probe, by: &[&str], source: SourceSeen) -> Result<Answers, String> {
    let allowed: BTreeSet<&str> = by.iter().copied().collect();
    let mut answers = Answers::new();
    let started = Instant::now();
    for sent in 0..MAX_ANSWER_PROBES {
        let all_answered = allowed.iter().all(|pod| answers.contains_key(*pod));
        if sent >= MIN_ANSWER_PROBES && all_answered {
            return Ok(answers);
        }
        if started.elapsed() > ROW_DEADLINE {
            break;
        }
        let reply = probe
            .send(cluster, ANSWER_TIMEOUT)
            .map_err(|error| format!("probe {} failed: {error}; answers so far {answers:?}", sent + 1))?;
        if !allowed.contains(reply.server_name.as_str()) {
            return Err(format!("answered by {}, which is not one of {by:?}", reply.server_name));
        }
        probe.check_source(source, &reply)?;
        *answers.entry(reply.server_name).or_default() += 1;
    }
    let missing: Vec<&str> = allowed.iter().copied().filter(|pod| !answers.contains_key(*pod)).collect();
    if missing.is_empty() {
        return Ok(answers);
    }
    Err(format!("{missing:?} never answered in {} probes; answers {answers:?}", answers.values().sum::<usize>()))
}

fn expect_rejected(cluster: &Cluster, probe: &Probe) -> Result<(), String> {
    for _ in 0..REJECT_PROBES {
        let started = Instant::now();
        let result = match probe.protocol {
            Protocol::Tcp => probe.send(cluster, ANSWER_TIMEOUT).map_err(Refusal::from),
            Protocol::Udp => udp_probe_for_refusal(cluster, probe, ANSWER_TIMEOUT),
        };
        let took = started.elapsed();
        match result {
            Ok(reply) => {
                return Err(format!(
                    "answered by {} (seeing {}), expected a refusal",
                    reply.server_name, reply.client_addr
                ));
            }
            Err(Refusal::Refused) if took < REJECT_WITHIN => {}
            Err(Refusal::Refused) => {
                return Err(format!("refused, but only after {took:?}; expected within {REJECT_WITHIN:?}"));
            }
            Err(Refusal::Not(error)) => {
                return Err(format!("expected a refusal within {REJECT_WITHIN:?}, got `{error}` after {took:?}"));
            }
        }
    }
    Ok(())
}

/// How a probe that should be refused ended, when it was not answered.
enum Refusal {
    Refused,
    /// Anything else, described.
    Not(String),
}

impl From<ProbeError> for Refusal {
    fn from(error: ProbeError) -> Self {
        if error.is_refused() { Refusal::Refused } else { Refusal::Not(error.to_string()) }
    }
}

/// One UDP request that also understands a refusal on the sending host itself: when the
/// node's own output hook rejects, `send` fails with EPERM (Linux reports every locally
/// refused packet so, a drop too) and the ICMP port unreachable still arrives. So EPERM
/// alone proves nothing; the probe then waits for the ICMP error, which a drop never sends.
fn udp_probe_for_refusal(cluster: &Cluster, probe: &Probe, timeout: Duration) -> Result<EchoReply, Refusal> {
    use std::io::ErrorKind;
    let target = probe.target;
    if !svcplane_testbed::address_plan::is_lab_address(target.ip()) {
        return Err(Refusal::Not(format!("{target} is outside the lab's address plan")));
    }
    let outcome = cluster.lab().run_in(&probe.namespace, move || -> Result<EchoReply, Refusal> {
        let local: SocketAddr = match target {
            SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let io = |step: &str, error: std::io::Error| Refusal::Not(format!("udp {target}: {step}: {error}"));
        let socket = std::net::UdpSocket::bind(local).map_err(|e| io("bind", e))?;
        socket.connect(target).map_err(|e| io("connect", e))?;
        let mut local_eperm = false;
        match socket.send(b"svcplane-probe\n") {
            Ok(_) => {}
            Err(error) if error.raw_os_error() == Some(EPERM) => local_eperm = true,
            Err(error) if error.kind() == ErrorKind::ConnectionRefused => return Err(Refusal::Refused),
            Err(error) => return Err(io("send", error)),
        }
        socket.set_read_timeout(Some(timeout)).map_err(|e| io("set timeout", e))?;
        let mut buffer = [0u8; 4096];
        match socket.recv(&mut buffer) {
            Ok(n) => EchoReply::parse(&String::from_utf8_lossy(&buffer[..n]))
                .ok_or_else(|| Refusal::Not(format!("udp {target}: not an echo reply"))),
            Err(error) if error.kind() == ErrorKind::ConnectionRefused => Err(Refusal::Refused),
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                let eperm = if local_eperm {
                    " (send failed with EPERM, but no ICMP error followed: dropped, not rejected)"
                } else {
                    ""
                };
                Err(Refusal::Not(format!("udp {target}: no answer within {timeout:?}{eperm}")))
            }
            Err(error) => Err(io("receive", error)),
        }
    });
    outcome.unwrap_or_else(|error| Err(Refusal::Not(format!("entering {}: {error}", probe.namespace))))
}

/// Linux's `EPERM` (no libc dependency for one constant).
const EPERM: i32 = 1;

fn expect_dropped(cluster: &Cluster, probe: &Probe) -> Result<(), String> {
    for _ in 0..DROP_PROBES {
        match probe.send(cluster, DROP_TIMEOUT) {
            Ok(reply) => {
                return Err(format!(
                    "answered by {} (seeing {}), expected no answer at all",
                    reply.server_name, reply.client_addr
                ));
            }
            Err(error) if error.is_timed_out() => {}
            Err(error) => return Err(format!("expected silence (dropped), got `{error}`")),
        }
    }
    Ok(())
}

/// Runs every row, then fails once listing every failed row (with the proxies' logs and
/// the backend's diagnostics), so one broken row does not hide the others.
pub fn check_rows(cluster: &Cluster, rows: &[Scenario]) {
    let mut failures = Vec::new();
    for row in rows {
        match run(cluster, row) {
            Ok(answers) if answers.is_empty() => eprintln!("ok: {}", row.name),
            Ok(answers) => eprintln!("ok: {} (answers {answers:?})", row.name),
            Err(failure) => {
                eprintln!("FAILED: {failure}");
                failures.push(failure);
            }
        }
    }
    if !failures.is_empty() {
        panic!(
            "{} of {} scenario rows failed on the {} backend:\n- {}\n\n{}",
            failures.len(),
            rows.len(),
            cluster.backend().name,
            failures.join("\n- "),
            cluster.diagnostics()
        );
    }
}

/// Polls `attempt` until it returns `Some`, at most until `limit`; a short pause between
/// attempts keeps the loop from spinning. Returns the value and the time it took.
pub fn eventually<T>(limit: Duration, mut attempt: impl FnMut() -> Option<T>) -> Option<(T, Duration)> {
    let started = Instant::now();
    loop {
        if let Some(value) = attempt() {
            return Some((value, started.elapsed()));
        }
        if started.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
