//! The cluster every scenario runs against, as manifests text: the lab's layout (which pod
//! has which address on which node), the Services, the Pods, the Nodes and the explicit
//! EndpointSlices. Pure data: the real-kernel fixture ([`super::cluster`]) writes these
//! files into the directory its proxies watch, and the fake-kernel runner feeds the very
//! same text through the library pipeline, so both backends see one cluster.
//!
//! Addresses follow `docs/lab.md`: nodes `198.18.0.(10+N)`, pods
//! `198.18.(128+N).k`, ClusterIPs in `198.19.0.0/16`, load-balancer and external IPs in
//! `198.18.100.0/24` (and the IPv6 twins of each).

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use svcplane_testbed::address_plan;

use super::{Family, Protocol};

/// The node whose proxy serves external traffic and the pods on it.
pub const THIS_NODE: u16 = 1;
/// The other node; its own proxy serves its pods.
pub const OTHER_NODE: u16 = 2;
/// Pods that back no Service, the senders of pod rows.
pub const POD_ON_THIS_NODE: &str = "node1-client";
pub const POD_ON_OTHER_NODE: &str = "node2-client";
/// An endpoint of every `app: echo` Service, the sender of hairpin rows.
pub const ENDPOINT_POD_ON_THIS_NODE: &str = "node1-pod1";

/// Where every echo server listens (all pods run one, TCP and UDP; SCTP too where the
/// kernel has it).
pub const ECHO_PORT: u16 = 8080;
/// Where the conversation servers (connections that stay open) listen, in the pods that
/// run one.
pub const CONVERSATION_PORT: u16 = 9090;
/// The port of every Service.
pub const SERVICE_PORT: u16 = 80;

pub const SERVICE_CIDR_V4: &str = "198.19.0.0/16";
pub const SERVICE_CIDR_V6: &str = "2001:db8:f::/108";
pub const CLUSTER_CIDR_V4: &str = "198.18.128.0/17";
pub const CLUSTER_CIDR_V6: &str = "2001:db8:1::/48";

/// `topology.kubernetes.io/zone` of each node.
pub const ZONES: [&str; 2] = ["zone-a", "zone-b"];

/// Where a pod of the lab lives: the lab builds them in this order (`pods_per_node(2)`,
/// then the named client pod on each node), which decides their addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LabPod {
    pub name: &'static str,
    pub node: u16,
    /// The pod's number on its node.
    pub index: u16,
}

pub const LAB_PODS: &[LabPod] = &[
    LabPod { name: "node1-pod1", node: 1, index: 1 },
    LabPod { name: "node1-pod2", node: 1, index: 2 },
    LabPod { name: POD_ON_THIS_NODE, node: 1, index: 3 },
    LabPod { name: "node2-pod1", node: 2, index: 1 },
    LabPod { name: "node2-pod2", node: 2, index: 2 },
    LabPod { name: POD_ON_OTHER_NODE, node: 2, index: 3 },
];

/// External clients on the LAN, both routing the cluster ranges via this node. Client 1 is
/// inside every `loadBalancerSourceRanges` of the fixture, client 2 outside.
pub const CLIENTS: u16 = 2;
pub const CLIENT_INSIDE_RANGES: u16 = 1;
pub const CLIENT_OUTSIDE_RANGES: u16 = 2;

/// How many extra source addresses client 1 gets for the session-affinity rows (each is a
/// client of its own to the Service's affinity sets).
pub const AFFINITY_CLIENT_ADDRESSES: u16 = 12;

pub fn lab_pod(name: &str) -> &'static LabPod {
    LAB_PODS.iter().find(|pod| pod.name == name).unwrap_or_else(|| panic!("no pod {name:?} in the lab layout"))
}

pub fn pod_ip(name: &str, family: Family) -> IpAddr {
    let pod = lab_pod(name);
    if family.is_v6() {
        address_plan::pod_ip_v6(pod.node, pod.index).into()
    } else {
        address_plan::pod_ip_v4(pod.node, pod.index).into()
    }
}

/// The pod whose address this is (of any family).
pub fn pod_at(address: IpAddr) -> Option<&'static str> {
    LAB_PODS.iter().find(|pod| [Family::V4, Family::V6].iter().any(|f| pod_ip(pod.name, *f) == address)).map(|p| p.name)
}

pub fn node_name(node: u16) -> String {
    format!("node{node}")
}

/// The node's address on the LAN (`--node-ip`).
pub fn node_ip(node: u16, family: Family) -> IpAddr {
    if family.is_v6() { address_plan::node_ip_v6(node).into() } else { address_plan::node_ip_v4(node).into() }
}

/// A second LAN address of each node, `198.18.0.(60+N)` / `2001:db8::(60+N)` as a /32 and a
/// deprecated /128, so the kernel never picks it as a source: NodePorts must answer on it
/// by default and not with `--nodeport-addresses primary`.
pub fn node_secondary_ip(node: u16, family: Family) -> IpAddr {
    lan_host(60 + node, family)
}

/// Every address of the node (the primary and the secondary LAN address).
pub fn node_addresses(node: u16) -> Vec<IpAddr> {
    let mut addresses = Vec::new();
    for family in [Family::V4, Family::V6] {
        addresses.push(node_ip(node, family));
        addresses.push(node_secondary_ip(node, family));
    }
    addresses
}

pub fn client_ip(client: u16, family: Family) -> IpAddr {
    if family.is_v6() { address_plan::client_ip_v6(client).into() } else { address_plan::client_ip_v4(client).into() }
}

/// The extra source addresses of client 1 for the affinity rows: `198.18.0.(200+i)` and
/// `2001:db8::(200+i)`.
pub fn affinity_client_ips(family: Family) -> Vec<IpAddr> {
    (0..AFFINITY_CLIENT_ADDRESSES).map(|i| lan_host(200 + i, family)).collect()
}

/// `198.18.0.<host>`, or `2001:db8::<host>` with the decimal number spelled as hex digits
/// (as the lab's plan spells node and client addresses).
fn lan_host(host: u16, family: Family) -> IpAddr {
    if family.is_v6() {
        let hex = u16::from_str_radix(&host.to_string(), 16).expect("decimal digits are hex digits");
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, hex).into()
    } else {
        Ipv4Addr::new(198, 18, 0, u8::try_from(host).expect("a LAN host number")).into()
    }
}

/// What kind of Service a [`ServiceSpec`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    ClusterIp,
    NodePort,
    LoadBalancer,
    /// `clusterIP: None`: svcplane must not program it.
    Headless,
    /// `type: ExternalName`: svcplane must not program it.
    ExternalName,
}

/// A Service of the fixture. Explicit addresses and ports, so tests know them without
/// asking the proxy. Build from [`ServiceSpec::DEFAULT`] with struct update syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceSpec {
    pub name: &'static str,
    pub kind: Kind,
    pub cluster_ip_v4: Ipv4Addr,
    /// With one, the Service is `PreferDualStack` with both families.
    pub cluster_ip_v6: Option<Ipv6Addr>,
    /// Pods whose labels hold all of these; empty: no selector (explicit EndpointSlices).
    pub selector: &'static [(&'static str, &'static str)],
    /// One Service port per protocol, each [`SERVICE_PORT`], named after its protocol.
    pub protocols: &'static [Protocol],
    pub target_port: u16,
    /// The TCP nodePort; UDP gets the next one, SCTP the one after. Only with a NodePort or
    /// LoadBalancer kind.
    pub node_port_base: Option<u16>,
    pub internal_traffic_local: bool,
    pub external_traffic_local: bool,
    pub external_ips: &'static [&'static str],
    /// `status.loadBalancer.ingress`: `(ip, ipMode Proxy)`.
    pub load_balancer_ingress: &'static [(&'static str, bool)],
    pub source_ranges: &'static [&'static str],
    pub health_check_node_port: Option<u16>,
    /// `sessionAffinity: ClientIP` with this `timeoutSeconds`.
    pub affinity_timeout_seconds: Option<u32>,
    pub traffic_distribution: Option<&'static str>,
    pub labels: &'static [(&'static str, &'static str)],
}

const TCP_UDP: &[Protocol] = &[Protocol::Tcp, Protocol::Udp];

impl ServiceSpec {
    /// A single-stack ClusterIP Service in front of every echo pod.
    pub const DEFAULT: ServiceSpec = ServiceSpec {
        name: "",
        kind: Kind::ClusterIp,
        cluster_ip_v4: Ipv4Addr::UNSPECIFIED,
        cluster_ip_v6: None,
        selector: &[("app", "echo")],
        protocols: TCP_UDP,
        target_port: ECHO_PORT,
        node_port_base: None,
        internal_traffic_local: false,
        external_traffic_local: false,
        external_ips: &[],
        load_balancer_ingress: &[],
        source_ranges: &[],
        health_check_node_port: None,
        affinity_timeout_seconds: None,
        traffic_distribution: None,
        labels: &[],
    };

    /// A single-stack ClusterIP Service in front of every echo pod.
    pub const fn cluster_ip(name: &'static str, ip: Ipv4Addr) -> Self {
        Self { name, cluster_ip_v4: ip, ..Self::DEFAULT }
    }

    /// The ClusterIP of a family (none for headless and ExternalName Services).
    pub fn address(&self, family: Family) -> Option<IpAddr> {
        if matches!(self.kind, Kind::Headless | Kind::ExternalName) {
            return None;
        }
        if family.is_v6() { self.cluster_ip_v6.map(IpAddr::V6) } else { Some(IpAddr::V4(self.cluster_ip_v4)) }
    }

    /// The ClusterIP address and Service port of a family.
    pub fn cluster_ip_address(&self, v6: bool) -> Option<std::net::SocketAddr> {
        let family = if v6 { Family::V6 } else { Family::V4 };
        self.address(family).map(|ip| std::net::SocketAddr::new(ip, SERVICE_PORT))
    }

    pub fn node_port(&self, protocol: Protocol) -> Option<u16> {
        let offset = match protocol {
            Protocol::Tcp => 0,
            Protocol::Udp => 1,
            Protocol::Sctp => 2,
        };
        self.node_port_base.filter(|_| self.protocols.contains(&protocol)).map(|base| base + offset)
    }

    /// The load-balancer IPs (`ipMode: Proxy` ones when `proxy_mode`) of a family.
    pub fn load_balancer_ips(&self, family: Family, proxy_mode: bool) -> Vec<IpAddr> {
        self.load_balancer_ingress
            .iter()
            .filter(|(_, proxy)| *proxy == proxy_mode)
            .map(|(ip, _)| ip.parse::<IpAddr>().expect("a valid address in the fixture"))
            .filter(|ip| Family::of(*ip) == family)
            .collect()
    }

    pub fn external_ips(&self, family: Family) -> Vec<IpAddr> {
        self.external_ips
            .iter()
            .map(|ip| ip.parse::<IpAddr>().expect("a valid address in the fixture"))
            .filter(|ip| Family::of(*ip) == family)
            .collect()
    }

    /// The Service as a manifest.
    pub fn manifest(&self) -> String {
        let mut text =
            format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: {}\n  namespace: default\n", self.name);
        if !self.labels.is_empty() {
            text.push_str("  labels:\n");
            for (key, value) in self.labels {
                let _ = writeln!(text, "    {key}: \"{value}\"");
            }
        }
        text.push_str("spec:\n");
        let service_type = match self.kind {
            Kind::ClusterIp | Kind::Headless => "ClusterIP",
            Kind::NodePort => "NodePort",
            Kind::LoadBalancer => "LoadBalancer",
            Kind::ExternalName => "ExternalName",
        };
        let _ = writeln!(text, "  type: {service_type}");
        match self.kind {
            Kind::ExternalName => text.push_str("  externalName: echo.example.invalid\n"),
            Kind::Headless => text.push_str(
                "  clusterIP: None\n  clusterIPs: [None]\n  ipFamilyPolicy: PreferDualStack\n  ipFamilies: [IPv4, IPv6]\n",
            ),
            _ => match self.cluster_ip_v6 {
                Some(v6) => {
                    let _ = writeln!(
                        text,
                        "  ipFamilyPolicy: PreferDualStack\n  ipFamilies: [IPv4, IPv6]\n  clusterIP: \"{v4}\"\n  clusterIPs: [\"{v4}\", \"{v6}\"]",
                        v4 = self.cluster_ip_v4
                    );
                }
                None => {
                    let _ = writeln!(
                        text,
                        "  ipFamilyPolicy: SingleStack\n  ipFamilies: [IPv4]\n  clusterIP: \"{v4}\"\n  clusterIPs: [\"{v4}\"]",
                        v4 = self.cluster_ip_v4
                    );
                }
            },
        }
        if !self.selector.is_empty() {
            text.push_str("  selector:\n");
            for (key, value) in self.selector {
                let _ = writeln!(text, "    {key}: {value}");
            }
        }
        let policy = |local: bool| if local { "Local" } else { "Cluster" };
        if self.kind != Kind::ExternalName {
            let _ = writeln!(text, "  internalTrafficPolicy: {}", policy(self.internal_traffic_local));
        }
        if matches!(self.kind, Kind::NodePort | Kind::LoadBalancer) || !self.external_ips.is_empty() {
            let _ = writeln!(text, "  externalTrafficPolicy: {}", policy(self.external_traffic_local));
        }
        if !self.external_ips.is_empty() {
            text.push_str("  externalIPs:\n");
            for ip in self.external_ips {
                let _ = writeln!(text, "    - \"{ip}\"");
            }
        }
        if !self.source_ranges.is_empty() {
            text.push_str("  loadBalancerSourceRanges:\n");
            for range in self.source_ranges {
                let _ = writeln!(text, "    - \"{range}\"");
            }
        }
        if let Some(port) = self.health_check_node_port {
            let _ = writeln!(text, "  healthCheckNodePort: {port}");
        }
        if let Some(seconds) = self.affinity_timeout_seconds {
            let _ = writeln!(
                text,
                "  sessionAffinity: ClientIP\n  sessionAffinityConfig:\n    clientIP:\n      timeoutSeconds: {seconds}"
            );
        }
        if let Some(distribution) = self.traffic_distribution {
            let _ = writeln!(text, "  trafficDistribution: {distribution}");
        }
        text.push_str("  ports:\n");
        for &protocol in self.protocols {
            let _ = writeln!(
                text,
                "    - name: {protocol}\n      protocol: {}\n      port: {SERVICE_PORT}\n      targetPort: {}",
                protocol.kubernetes(),
                self.target_port
            );
            if let Some(node_port) = self.node_port(protocol) {
                let _ = writeln!(text, "      nodePort: {node_port}");
            }
        }
        if !self.load_balancer_ingress.is_empty() {
            text.push_str("status:\n  loadBalancer:\n    ingress:\n");
            for (ip, proxy_mode) in self.load_balancer_ingress {
                let _ = writeln!(text, "      - ip: \"{ip}\"");
                if *proxy_mode {
                    text.push_str("        ipMode: Proxy\n");
                } else {
                    text.push_str("        ipMode: VIP\n");
                }
            }
        }
        text
    }
}

const fn v4(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, 0, last)
}

/// `2001:db8:f::<n>`, the decimal number `n` spelled as hex digits (so `::80` goes with
/// `198.19.0.80`).
const fn v6(hex: u16) -> Option<Ipv6Addr> {
    Some(Ipv6Addr::new(0x2001, 0xdb8, 0xf, 0, 0, 0, 0, hex))
}

pub const ECHO_SERVICE: &str = "echo";
pub const EMPTY_SERVICE: &str = "empty";
pub const EXTERNAL_LOCAL_SERVICE: &str = "external-local";
pub const OTHER_NODE_EXTERNAL_LOCAL_SERVICE: &str = "node2-external-local";
pub const OTHER_NODE_INTERNAL_LOCAL_SERVICE: &str = "node2-internal-local";
pub const INTERNAL_LOCAL_SERVICE: &str = "internal-local";
pub const LB_SERVICE: &str = "lb";
pub const LB_RANGES_SERVICE: &str = "lb-ranges";
pub const LB_LOCAL_SERVICE: &str = "lb-local";
pub const OTHER_NODE_LB_LOCAL_SERVICE: &str = "node2-lb-local";
pub const EXTERNAL_IPS_SERVICE: &str = "external-ips";
pub const AFFINITY_SERVICE: &str = "affinity";
pub const AFFINITY_RENEWED_SERVICE: &str = "affinity-renewed";
pub const TERMINATING_SERVICE: &str = "terminating";
pub const READY_AND_TERMINATING_SERVICE: &str = "ready-and-terminating";
pub const TERMINATING_NOT_SERVING_SERVICE: &str = "terminating-not-serving";
pub const LEAVING_PODS_SERVICE: &str = "leaving";
pub const PREFER_CLOSE_SERVICE: &str = "prefer-close";
pub const PREFER_SAME_ZONE_SERVICE: &str = "prefer-same-zone";
pub const PREFER_SAME_NODE_SERVICE: &str = "prefer-same-node";
pub const PREFER_CLOSE_ELSEWHERE_SERVICE: &str = "prefer-close-elsewhere";
pub const PREFER_SAME_NODE_ELSEWHERE_SERVICE: &str = "prefer-same-node-elsewhere";
pub const EXPLICIT_HINTS_SERVICE: &str = "explicit-hints";
pub const HALF_HINTED_SERVICE: &str = "half-hinted";
pub const FOREIGN_ZONE_HINTS_SERVICE: &str = "foreign-zone-hints";
pub const OTHER_PROXY_SERVICE: &str = "other-proxy";
pub const HEADLESS_SERVICE: &str = "headless";
pub const EXTERNAL_NAME_SERVICE: &str = "external-name";
pub const SCTP_SERVICE: &str = "sctp";
pub const UDP_MOVING_SERVICE: &str = "udp-moving";
pub const UDP_FIRST_ENDPOINT_SERVICE: &str = "udp-first-endpoint";
pub const UDP_TERMINATING_SERVICE: &str = "udp-terminating";
pub const UDP_LATE_SERVICE: &str = "udp-late";
pub const TCP_TERMINATING_SERVICE: &str = "tcp-terminating";

/// Session-affinity timeout of the affinity Services.
pub const AFFINITY_TIMEOUT_SECONDS: u32 = 3;

/// Endpoints only on node2.
const NODE2_ECHO: &[(&str, &str)] = &[("app", "echo"), ("node", "node2")];

/// The Services every cluster starts with.
pub const SERVICES: &[ServiceSpec] = &[
    // Dual-stack NodePort in front of all four echo pods.
    ServiceSpec {
        name: ECHO_SERVICE,
        kind: Kind::NodePort,
        cluster_ip_v4: v4(10),
        cluster_ip_v6: v6(0x10),
        node_port_base: Some(30080),
        ..ServiceSpec::DEFAULT
    },
    // A selector that matches no pod.
    ServiceSpec {
        name: EMPTY_SERVICE,
        kind: Kind::NodePort,
        cluster_ip_v4: v4(20),
        cluster_ip_v6: v6(0x20),
        selector: &[("app", "nobody")],
        node_port_base: Some(30090),
        ..ServiceSpec::DEFAULT
    },
    // External traffic kept on the node it enters, also through external IPs.
    ServiceSpec {
        name: EXTERNAL_LOCAL_SERVICE,
        kind: Kind::NodePort,
        cluster_ip_v4: v4(30),
        cluster_ip_v6: v6(0x30),
        node_port_base: Some(30100),
        external_traffic_local: true,
        external_ips: &["198.18.100.41", "2001:db8:100::41"],
        ..ServiceSpec::DEFAULT
    },
    // Endpoints only on node2, external traffic kept local: node1 has none for outsiders.
    ServiceSpec {
        name: OTHER_NODE_EXTERNAL_LOCAL_SERVICE,
        kind: Kind::NodePort,
        cluster_ip_v4: v4(40),
        cluster_ip_v6: v6(0x40),
        selector: NODE2_ECHO,
        node_port_base: Some(30110),
        external_traffic_local: true,
        ..ServiceSpec::DEFAULT
    },
    // Endpoints only on node2, internal traffic kept local: node1's pods have none.
    ServiceSpec {
        name: OTHER_NODE_INTERNAL_LOCAL_SERVICE,
        cluster_ip_v4: v4(50),
        cluster_ip_v6: v6(0x50),
        selector: NODE2_ECHO,
        internal_traffic_local: true,
        ..ServiceSpec::DEFAULT
    },
    // Endpoints on both nodes, internal traffic kept local.
    ServiceSpec {
        name: INTERNAL_LOCAL_SERVICE,
        cluster_ip_v4: v4(51),
        cluster_ip_v6: v6(0x51),
        internal_traffic_local: true,
        ..ServiceSpec::DEFAULT
    },
    // A LoadBalancer with a VIP ingress and an `ipMode: Proxy` one per family.
    ServiceSpec {
        name: LB_SERVICE,
        kind: Kind::LoadBalancer,
        cluster_ip_v4: v4(80),
        cluster_ip_v6: v6(0x80),
        node_port_base: Some(30120),
        load_balancer_ingress: &[
            ("198.18.100.10", false),
            ("2001:db8:100::10", false),
            ("198.18.100.11", true),
            ("2001:db8:100::11", true),
        ],
        ..ServiceSpec::DEFAULT
    },
    // Only client 1 may use the load-balancer IPs.
    ServiceSpec {
        name: LB_RANGES_SERVICE,
        kind: Kind::LoadBalancer,
        cluster_ip_v4: v4(81),
        cluster_ip_v6: v6(0x81),
        node_port_base: Some(30130),
        load_balancer_ingress: &[("198.18.100.20", false), ("2001:db8:100::20", false)],
        source_ranges: &["198.18.0.101/32", "2001:db8::101/128"],
        ..ServiceSpec::DEFAULT
    },
    ServiceSpec {
        name: LB_LOCAL_SERVICE,
        kind: Kind::LoadBalancer,
        cluster_ip_v4: v4(82),
        cluster_ip_v6: v6(0x82),
        node_port_base: Some(30140),
        external_traffic_local: true,
        health_check_node_port: Some(30300),
        load_balancer_ingress: &[("198.18.100.30", false), ("2001:db8:100::30", false)],
        ..ServiceSpec::DEFAULT
    },
    // Local external traffic, endpoints only on node2: node1 drops it and fails its health check.
    ServiceSpec {
        name: OTHER_NODE_LB_LOCAL_SERVICE,
        kind: Kind::LoadBalancer,
        cluster_ip_v4: v4(83),
        cluster_ip_v6: v6(0x83),
        selector: NODE2_ECHO,
        node_port_base: Some(30150),
        external_traffic_local: true,
        health_check_node_port: Some(30310),
        load_balancer_ingress: &[("198.18.100.31", false), ("2001:db8:100::31", false)],
        ..ServiceSpec::DEFAULT
    },
    ServiceSpec {
        name: EXTERNAL_IPS_SERVICE,
        cluster_ip_v4: v4(90),
        cluster_ip_v6: v6(0x90),
        external_ips: &["198.18.100.40", "2001:db8:100::40"],
        ..ServiceSpec::DEFAULT
    },
    ServiceSpec {
        name: AFFINITY_SERVICE,
        kind: Kind::NodePort,
        cluster_ip_v4: v4(100),
        cluster_ip_v6: v6(0x100),
        node_port_base: Some(30160),
        affinity_timeout_seconds: Some(AFFINITY_TIMEOUT_SECONDS),
        ..ServiceSpec::DEFAULT
    },
    ServiceSpec {
        name: AFFINITY_RENEWED_SERVICE,
        cluster_ip_v4: v4(101),
        cluster_ip_v6: v6(0x101),
        affinity_timeout_seconds: Some(AFFINITY_TIMEOUT_SECONDS),
        ..ServiceSpec::DEFAULT
    },
    // Terminating endpoints, from explicit EndpointSlices (see SLICES).
    ServiceSpec {
        name: TERMINATING_SERVICE,
        cluster_ip_v4: v4(110),
        cluster_ip_v6: v6(0x110),
        selector: &[],
        ..ServiceSpec::DEFAULT
    },
    ServiceSpec {
        name: READY_AND_TERMINATING_SERVICE,
        cluster_ip_v4: v4(111),
        cluster_ip_v6: v6(0x111),
        selector: &[],
        ..ServiceSpec::DEFAULT
    },
    ServiceSpec {
        name: TERMINATING_NOT_SERVING_SERVICE,
        cluster_ip_v4: v4(112),
        cluster_ip_v6: v6(0x112),
        selector: &[],
        ..ServiceSpec::DEFAULT
    },
    // Terminating endpoints the controller derives from Pods being deleted (see GHOST_PODS).
    ServiceSpec {
        name: LEAVING_PODS_SERVICE,
        cluster_ip_v4: v4(113),
        cluster_ip_v6: v6(0x113),
        selector: &[("app", "leaving")],
        ..ServiceSpec::DEFAULT
    },
    // Topology: the controller hints from trafficDistribution and the Nodes' zones.
    ServiceSpec {
        name: PREFER_CLOSE_SERVICE,
        kind: Kind::NodePort,
        cluster_ip_v4: v4(120),
        cluster_ip_v6: v6(0x120),
        node_port_base: Some(30190),
        traffic_distribution: Some("PreferClose"),
        ..ServiceSpec::DEFAULT
    },
    ServiceSpec {
        name: PREFER_SAME_ZONE_SERVICE,
        cluster_ip_v4: v4(121),
        cluster_ip_v6: v6(0x121),
        traffic_distribution: Some("PreferSameZone"),
        ..ServiceSpec::DEFAULT
    },
    ServiceSpec {
        name: PREFER_SAME_NODE_SERVICE,
        cluster_ip_v4: v4(122),
        cluster_ip_v6: v6(0x122),
        traffic_distribution: Some("PreferSameNode"),
        ..ServiceSpec::DEFAULT
    },
    ServiceSpec {
        name: PREFER_CLOSE_ELSEWHERE_SERVICE,
        cluster_ip_v4: v4(123),
        cluster_ip_v6: v6(0x123),
        selector: NODE2_ECHO,
        traffic_distribution: Some("PreferClose"),
        ..ServiceSpec::DEFAULT
    },
    ServiceSpec {
        name: PREFER_SAME_NODE_ELSEWHERE_SERVICE,
        cluster_ip_v4: v4(124),
        cluster_ip_v6: v6(0x124),
        selector: NODE2_ECHO,
        traffic_distribution: Some("PreferSameNode"),
        ..ServiceSpec::DEFAULT
    },
    // Hints written by hand in explicit EndpointSlices, used as they are.
    ServiceSpec {
        name: EXPLICIT_HINTS_SERVICE,
        cluster_ip_v4: v4(125),
        cluster_ip_v6: v6(0x125),
        selector: &[],
        ..ServiceSpec::DEFAULT
    },
    ServiceSpec {
        name: HALF_HINTED_SERVICE,
        cluster_ip_v4: v4(126),
        cluster_ip_v6: v6(0x126),
        selector: &[],
        ..ServiceSpec::DEFAULT
    },
    ServiceSpec {
        name: FOREIGN_ZONE_HINTS_SERVICE,
        cluster_ip_v4: v4(127),
        cluster_ip_v6: v6(0x127),
        selector: &[],
        ..ServiceSpec::DEFAULT
    },
    // Services svcplane must leave alone.
    ServiceSpec {
        name: OTHER_PROXY_SERVICE,
        kind: Kind::NodePort,
        cluster_ip_v4: v4(130),
        cluster_ip_v6: v6(0x130),
        node_port_base: Some(30200),
        labels: &[("service.kubernetes.io/service-proxy-name", "some-other-proxy")],
        ..ServiceSpec::DEFAULT
    },
    ServiceSpec { name: HEADLESS_SERVICE, kind: Kind::Headless, ..ServiceSpec::DEFAULT },
    ServiceSpec { name: EXTERNAL_NAME_SERVICE, kind: Kind::ExternalName, selector: &[], ..ServiceSpec::DEFAULT },
    ServiceSpec {
        name: SCTP_SERVICE,
        kind: Kind::NodePort,
        cluster_ip_v4: v4(140),
        cluster_ip_v6: v6(0x140),
        protocols: &[Protocol::Sctp],
        node_port_base: Some(30210),
        ..ServiceSpec::DEFAULT
    },
    // Endpoint changes under way (see MUTATIONS): UDP flows and TCP connections across them.
    ServiceSpec {
        name: UDP_MOVING_SERVICE,
        kind: Kind::NodePort,
        cluster_ip_v4: v4(150),
        cluster_ip_v6: v6(0x150),
        selector: &[],
        protocols: &[Protocol::Udp],
        node_port_base: Some(30220),
        ..ServiceSpec::DEFAULT
    },
    ServiceSpec {
        name: UDP_FIRST_ENDPOINT_SERVICE,
        cluster_ip_v4: v4(151),
        cluster_ip_v6: v6(0x151),
        selector: &[],
        protocols: &[Protocol::Udp],
        ..ServiceSpec::DEFAULT
    },
    // Written only when its row runs: clients already send to its address before.
    ServiceSpec {
        name: UDP_LATE_SERVICE,
        cluster_ip_v4: v4(154),
        cluster_ip_v6: v6(0x154),
        selector: &[],
        protocols: &[Protocol::Udp],
        ..ServiceSpec::DEFAULT
    },
    ServiceSpec {
        name: UDP_TERMINATING_SERVICE,
        cluster_ip_v4: v4(152),
        cluster_ip_v6: v6(0x152),
        selector: &[],
        protocols: &[Protocol::Udp],
        ..ServiceSpec::DEFAULT
    },
    ServiceSpec {
        name: TCP_TERMINATING_SERVICE,
        cluster_ip_v4: v4(153),
        cluster_ip_v6: v6(0x153),
        selector: &[],
        protocols: &[Protocol::Tcp],
        target_port: CONVERSATION_PORT,
        ..ServiceSpec::DEFAULT
    },
];

pub fn service(name: &str) -> Option<&'static ServiceSpec> {
    SERVICES.iter().find(|service| service.name == name)
}

/// One endpoint of an explicit EndpointSlice: a lab pod with its conditions and hints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointSpec {
    pub pod: &'static str,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub zone_hints: &'static [&'static str],
    pub node_hints: &'static [&'static str],
}

impl EndpointSpec {
    pub const fn ready(pod: &'static str) -> Self {
        Self { pod, ready: true, serving: true, terminating: false, zone_hints: &[], node_hints: &[] }
    }

    /// Being deleted, still answering: `ready: false, serving: true, terminating: true`.
    pub const fn serving_terminating(pod: &'static str) -> Self {
        Self { ready: false, serving: true, terminating: true, ..Self::ready(pod) }
    }

    /// Being deleted and no longer answering: `ready: false, serving: false, terminating: true`.
    pub const fn terminating_not_serving(pod: &'static str) -> Self {
        Self { ready: false, serving: false, terminating: true, ..Self::ready(pod) }
    }

    pub const fn zone_hints(self, zones: &'static [&'static str]) -> Self {
        Self { zone_hints: zones, ..self }
    }
}

/// An EndpointSlice written by hand for a selector-less Service, one per family, all the
/// Service's ports to `port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceSpec {
    pub service: &'static str,
    pub endpoints: &'static [EndpointSpec],
}

impl SliceSpec {
    pub fn file(&self) -> String {
        format!("slice-{}.yaml", self.service)
    }

    /// The slices of both families as one multi-document manifest.
    pub fn manifest(&self) -> String {
        let service = service(self.service).unwrap_or_else(|| panic!("no Service {:?} for a slice", self.service));
        let mut text = String::new();
        for family in [Family::V4, Family::V6] {
            let address_type = if family == Family::V4 { "IPv4" } else { "IPv6" };
            let _ = write!(
                text,
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-{suffix}\n  namespace: default\n  labels:\n    kubernetes.io/service-name: {name}\n    endpointslice.kubernetes.io/managed-by: scenario-fixture\naddressType: {address_type}\nports:\n",
                name = self.service,
                suffix = if family == Family::V4 { "v4" } else { "v6" },
            );
            for protocol in service.protocols {
                let _ = writeln!(
                    text,
                    "  - name: {protocol}\n    protocol: {}\n    port: {}",
                    protocol.kubernetes(),
                    service.target_port
                );
            }
            if self.endpoints.is_empty() {
                text.push_str("endpoints: []\n");
                continue;
            }
            text.push_str("endpoints:\n");
            for endpoint in self.endpoints {
                let pod = lab_pod(endpoint.pod);
                let _ = writeln!(
                    text,
                    "  - addresses: [\"{ip}\"]\n    conditions:\n      ready: {}\n      serving: {}\n      terminating: {}\n    nodeName: {node}\n    zone: {zone}",
                    endpoint.ready,
                    endpoint.serving,
                    endpoint.terminating,
                    ip = pod_ip(endpoint.pod, family),
                    node = node_name(pod.node),
                    zone = ZONES[usize::from(pod.node - 1)],
                );
                if !endpoint.zone_hints.is_empty() || !endpoint.node_hints.is_empty() {
                    text.push_str("    hints:\n");
                    if !endpoint.zone_hints.is_empty() {
                        text.push_str("      forZones:\n");
                        for zone in endpoint.zone_hints {
                            let _ = writeln!(text, "        - name: {zone}");
                        }
                    }
                    if !endpoint.node_hints.is_empty() {
                        text.push_str("      forNodes:\n");
                        for node in endpoint.node_hints {
                            let _ = writeln!(text, "        - name: {node}");
                        }
                    }
                }
            }
        }
        text
    }
}

/// The explicit EndpointSlices every cluster starts with.
pub const SLICES: &[SliceSpec] = &[
    // No ready endpoint: the serving, terminating ones are used.
    SliceSpec {
        service: TERMINATING_SERVICE,
        endpoints: &[EndpointSpec::serving_terminating("node1-pod1"), EndpointSpec::serving_terminating("node2-pod1")],
    },
    // A ready endpoint exists: terminating ones are not used.
    SliceSpec {
        service: READY_AND_TERMINATING_SERVICE,
        endpoints: &[EndpointSpec::serving_terminating("node1-pod1"), EndpointSpec::ready("node2-pod2")],
    },
    // Terminating and no longer serving: never used, so the Service has no endpoint.
    SliceSpec {
        service: TERMINATING_NOT_SERVING_SERVICE,
        endpoints: &[
            EndpointSpec::terminating_not_serving("node1-pod1"),
            EndpointSpec::terminating_not_serving("node2-pod1"),
        ],
    },
    // Hints as written, even where they disagree with where the pod runs: node1 (zone-a)
    // may use only node1-pod2, node2 (zone-b) the two others.
    SliceSpec {
        service: EXPLICIT_HINTS_SERVICE,
        endpoints: &[
            EndpointSpec::ready("node1-pod1").zone_hints(&["zone-b"]),
            EndpointSpec::ready("node1-pod2").zone_hints(&["zone-a"]),
            EndpointSpec::ready("node2-pod1").zone_hints(&["zone-b"]),
        ],
    },
    // One ready endpoint without hints: hints are ignored, every endpoint is used.
    SliceSpec {
        service: HALF_HINTED_SERVICE,
        endpoints: &[
            EndpointSpec::ready("node1-pod1").zone_hints(&["zone-a"]),
            EndpointSpec::ready("node2-pod1").zone_hints(&["zone-b"]),
            EndpointSpec::ready("node2-pod2"),
        ],
    },
    // Every endpoint hinted, none for zone-a: node1 ignores the hints and uses them all.
    SliceSpec {
        service: FOREIGN_ZONE_HINTS_SERVICE,
        endpoints: &[
            EndpointSpec::ready("node1-pod1").zone_hints(&["zone-c"]),
            EndpointSpec::ready("node2-pod1").zone_hints(&["zone-b"]),
        ],
    },
];

/// An endpoint change a dynamic row makes while it runs: the slice file is rewritten from
/// `before` (written at start; `None`: no slice at all) to `after`. With `adds_service`, the
/// Service itself is absent until then and arrives together with `after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mutation {
    pub before: Option<SliceSpec>,
    pub after: SliceSpec,
    pub adds_service: bool,
}

impl Mutation {
    /// The file the change writes, and its text (one file, so the change is atomic).
    pub fn change(&self) -> (String, String) {
        if self.adds_service {
            let service = service(self.after.service).expect("a Service of the fixture");
            (format!("late-{}.yaml", service.name), format!("---\n{}{}", service.manifest(), self.after.manifest()))
        } else {
            (self.after.file(), self.after.manifest())
        }
    }
}

pub const MUTATIONS: &[Mutation] = &[
    // The only endpoint is replaced by another one.
    Mutation {
        before: Some(SliceSpec { service: UDP_MOVING_SERVICE, endpoints: &[EndpointSpec::ready("node1-pod1")] }),
        after: SliceSpec { service: UDP_MOVING_SERVICE, endpoints: &[EndpointSpec::ready("node2-pod1")] },
        adds_service: false,
    },
    // No endpoint, then a first one.
    Mutation {
        before: None,
        after: SliceSpec { service: UDP_FIRST_ENDPOINT_SERVICE, endpoints: &[EndpointSpec::ready("node1-pod2")] },
        adds_service: false,
    },
    // No Service at all (packets to its address leave untranslated flows), then the
    // Service with an endpoint.
    Mutation {
        before: None,
        after: SliceSpec { service: UDP_LATE_SERVICE, endpoints: &[EndpointSpec::ready("node1-pod2")] },
        adds_service: true,
    },
    // The endpoint starts terminating (still serving) and a ready one appears.
    Mutation {
        before: Some(SliceSpec { service: UDP_TERMINATING_SERVICE, endpoints: &[EndpointSpec::ready("node1-pod1")] }),
        after: SliceSpec {
            service: UDP_TERMINATING_SERVICE,
            endpoints: &[EndpointSpec::serving_terminating("node1-pod1"), EndpointSpec::ready("node2-pod2")],
        },
        adds_service: false,
    },
    Mutation {
        before: Some(SliceSpec { service: TCP_TERMINATING_SERVICE, endpoints: &[EndpointSpec::ready("node1-pod1")] }),
        after: SliceSpec {
            service: TCP_TERMINATING_SERVICE,
            endpoints: &[EndpointSpec::serving_terminating("node1-pod1"), EndpointSpec::ready("node2-pod2")],
        },
        adds_service: false,
    },
];

pub fn mutation(service: &str) -> Option<&'static Mutation> {
    MUTATIONS.iter().find(|mutation| mutation.after.service == service)
}

/// Pods that exist only as objects: being deleted, they reuse the addresses of lab pods
/// (whose echo servers answer for them) under labels of their own, so the controller turns
/// them into terminating endpoints of [`LEAVING_PODS_SERVICE`] without touching the other
/// Services. `(name, lab pod whose address it has, Ready)`.
pub const GHOST_PODS: &[(&str, &str, bool)] = &[
    // Ready and being deleted: serving, terminating.
    ("leaving-a", "node1-pod1", true),
    ("leaving-b", "node2-pod1", true),
    // Not ready and being deleted: terminating, not serving: never used.
    ("leaving-c", "node1-pod2", false),
];

pub fn pod_file(pod: &str) -> String {
    format!("pod-{pod}.yaml")
}

/// A Pod as the kubelet would report it: scheduled, running, both addresses of lab pod
/// `address_of`. Echo pods are `app: echo`; client pods back no Service.
pub fn pod_manifest(name: &str, address_of: &str, app: &str, ready: bool, deleting: bool) -> String {
    let pod = lab_pod(address_of);
    let (v4, v6) = (pod_ip(address_of, Family::V4), pod_ip(address_of, Family::V6));
    let ready = if ready { "True" } else { "False" };
    let mut lines = vec![
        "apiVersion: v1".to_owned(),
        "kind: Pod".to_owned(),
        "metadata:".to_owned(),
        format!("  name: {name}"),
        "  namespace: default".to_owned(),
    ];
    if deleting {
        lines.push("  deletionTimestamp: \"2024-01-01T00:00:00Z\"".to_owned());
    }
    lines.extend([
        "  labels:".to_owned(),
        format!("    app: {app}"),
        format!("    node: node{}", pod.node),
        "spec:".to_owned(),
        format!("  nodeName: node{}", pod.node),
        "  containers:".to_owned(),
        "    - name: echo".to_owned(),
        "      image: svcplane/echo".to_owned(),
        "status:".to_owned(),
        "  phase: Running".to_owned(),
        format!("  podIP: \"{v4}\""),
        "  podIPs:".to_owned(),
        format!("    - ip: \"{v4}\""),
        format!("    - ip: \"{v6}\""),
        "  conditions:".to_owned(),
        "    - type: Ready".to_owned(),
        format!("      status: \"{ready}\""),
        String::new(),
    ]);
    lines.join("\n")
}

/// The manifest of a lab pod, Ready or not.
pub fn lab_pod_manifest(name: &str, ready: bool) -> String {
    let app = if name.contains("-client") { "client" } else { "echo" };
    pod_manifest(name, name, app, ready, false)
}

pub fn nodes_manifest() -> String {
    let mut text = String::new();
    for node in [THIS_NODE, OTHER_NODE] {
        let _ = write!(
            text,
            "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n    topology.kubernetes.io/zone: {zone}\nstatus:\n  addresses:\n    - type: InternalIP\n      address: \"{v4}\"\n    - type: InternalIP\n      address: \"{v6}\"\n",
            name = node_name(node),
            zone = ZONES[usize::from(node - 1)],
            v4 = node_ip(node, Family::V4),
            v6 = node_ip(node, Family::V6),
        );
    }
    text
}

/// Every file of the initial manifests directory: `(file name, text)`.
pub fn initial_files() -> Vec<(String, String)> {
    let mut files = vec![("nodes.yaml".to_owned(), nodes_manifest())];
    let late = |service: &ServiceSpec| mutation(service.name).is_some_and(|m| m.adds_service);
    let services: String = SERVICES.iter().filter(|s| !late(s)).map(|s| format!("---\n{}", s.manifest())).collect();
    files.push(("services.yaml".to_owned(), services));
    for pod in LAB_PODS {
        files.push((pod_file(pod.name), lab_pod_manifest(pod.name, true)));
    }
    for (name, address_of, ready) in GHOST_PODS {
        files.push((pod_file(name), pod_manifest(name, address_of, "leaving", *ready, true)));
    }
    for slice in SLICES {
        files.push((slice.file(), slice.manifest()));
    }
    for mutation in MUTATIONS {
        if let Some(before) = &mutation.before {
            files.push((before.file(), before.manifest()));
        }
    }
    files
}
