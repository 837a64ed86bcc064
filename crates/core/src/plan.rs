//! The per-node plan: for every service port and IP family, the frontends that accept
//! traffic and, for each, which sources go to which endpoint set, masqueraded or not, and
//! what happens to the rest. Backends render this and decide nothing themselves.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::model::{
    ClientIpAffinity, IpFamily, NamespacedName, Node, Protocol, Service, ServicePortName, ServiceType, TrafficPolicy,
};
use crate::selection::{Selection, select_endpoints};
use crate::state::{Changes, ClusterState};

/// Where NodePorts answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// Every address of the node except loopback.
    #[default]
    AllLocal,
    /// Node addresses inside these CIDRs.
    Cidrs(Vec<IpNet>),
}

/// Node-level facts and operator choices the plan depends on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeConfig {
    pub node_name: String,
    /// The node's own addresses (`--node-ip`, or the Node object's).
    pub node_ips: Vec<IpAddr>,
    /// The pod network: traffic from outside it to a ClusterIP is masqueraded. Empty means
    /// "unknown", and then ClusterIP traffic is never masqueraded (as kube-proxy).
    pub cluster_cidrs: Vec<IpNet>,
    pub node_port_addresses: NodePortAddresses,
}

/// Which kind of Service address a frontend is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FrontendKind {
    ClusterIp,
    NodePort,
    ExternalIp,
    LoadBalancer,
}

/// Where a frontend listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Destination {
    /// One service address.
    Address(IpAddr),
    /// The node-port addresses of the plan's family.
    NodePortAddresses,
}

/// A test on a packet's source address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SourceMatch {
    Any,
    /// Source inside one of these CIDRs.
    Inside(Vec<IpNet>),
    /// Source outside all of these CIDRs.
    Outside(Vec<IpNet>),
    /// Source is an address of this node (the node itself sent it).
    ThisNode,
}

/// Which endpoint list a route sends traffic to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EndpointSetKind {
    Cluster,
    Local,
}

/// One way through a frontend: matching sources go to an endpoint set.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Route {
    pub sources: SourceMatch,
    pub masquerade: bool,
    pub endpoints: EndpointSetKind,
}

/// What happens to traffic that no route takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unrouted {
    /// Nothing could be routed anywhere: refuse at once (ICMP unreachable / TCP reset).
    Reject,
    /// Endpoints exist but not for this traffic here: drop silently, as kube-proxy.
    Drop,
    /// Every source has a route; nothing is left over.
    Unreachable,
}

/// One address and port that accepts traffic for a service port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frontend {
    pub kind: FrontendKind,
    pub destination: Destination,
    pub port: u16,
    /// Only these sources may use the frontend (`loadBalancerSourceRanges`); empty: all.
    pub allowed_sources: Vec<IpNet>,
    /// Tried in order; the first whose source matches wins.
    pub routes: Vec<Route>,
    pub unrouted: Unrouted,
}

/// Everything one service port needs on this node, for one IP family.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServicePortPlan {
    pub name: ServicePortName,
    pub family: IpFamily,
    pub protocol: Protocol,
    pub frontends: Vec<Frontend>,
    pub cluster_endpoints: Vec<SocketAddr>,
    pub local_endpoints: Vec<SocketAddr>,
    pub affinity: Option<ClientIpAffinity>,
}

impl ServicePortPlan {
    pub fn endpoints(&self, set: EndpointSetKind) -> &[SocketAddr] {
        match set {
            EndpointSetKind::Cluster => &self.cluster_endpoints,
            EndpointSetKind::Local => &self.local_endpoints,
        }
    }
}

/// Identifies a service port plan within a node plan.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PlanKey {
    pub family: IpFamily,
    pub name: ServicePortName,
}

/// The whole plan for one node.
///
/// Invariant every backend renders: a packet whose source is the endpoint it is sent to
/// (hairpin) is always masqueraded, or the reply would bypass the node's conntrack.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePlan {
    pub config: NodeConfig,
    pub service_ports: BTreeMap<PlanKey, ServicePortPlan>,
    /// Per family, where NodePorts answer.
    pub node_port_cidrs: BTreeMap<IpFamily, Vec<IpNet>>,
}

/// Which plan keys an update added, changed or removed.
pub type ChangedKeys = BTreeSet<PlanKey>;

impl NodePlan {
    pub fn new(config: NodeConfig) -> Self {
        let node_port_cidrs = node_port_cidrs(&config);
        Self { config, service_ports: BTreeMap::new(), node_port_cidrs }
    }

    /// The plan from scratch.
    pub fn build(state: &ClusterState, config: NodeConfig) -> Self {
        let mut plan = Self::new(config);
        let mut changes = Changes { everything: true, ..Changes::default() };
        plan.update(state, &mut changes);
        plan
    }

    /// Replans the services in `changes` (everything if it says so) and reports which keys
    /// differ from before. Costs in proportion to the changed services, not the cluster.
    pub fn update(&mut self, state: &ClusterState, changes: &mut Changes) -> ChangedKeys {
        let node = node_of(state, &self.config);
        let mut changed = ChangedKeys::new();
        let services: Vec<NamespacedName> = if changes.everything {
            let mut all: BTreeSet<NamespacedName> = state.services().map(|s| s.name.clone()).collect();
            all.extend(self.service_ports.keys().map(|k| k.name.service.clone()));
            all.into_iter().collect()
        } else {
            changes.services.iter().cloned().collect()
        };
        for name in services {
            let fresh = state.service(&name).map(|s| plan_service(s, state, &node, self)).unwrap_or_default();
            let stale: Vec<PlanKey> = self
                .service_ports
                .range(..)
                .filter(|(k, _)| k.name.service == name && !fresh.contains_key(k))
                .map(|(k, _)| k.clone())
                .collect();
            for key in stale {
                self.service_ports.remove(&key);
                changed.insert(key);
            }
            for (key, port_plan) in fresh {
                if self.service_ports.get(&key) != Some(&port_plan) {
                    self.service_ports.insert(key.clone(), port_plan);
                    changed.insert(key);
                }
            }
        }
        changed
    }
}

fn node_of(state: &ClusterState, config: &NodeConfig) -> Node {
    let mut node = state
        .node(&config.node_name)
        .cloned()
        .unwrap_or_else(|| Node { name: config.node_name.clone(), ..Node::default() });
    if !config.node_ips.is_empty() {
        node.addresses = config.node_ips.clone();
    }
    node
}

fn node_port_cidrs(config: &NodeConfig) -> BTreeMap<IpFamily, Vec<IpNet>> {
    let mut cidrs: BTreeMap<IpFamily, Vec<IpNet>> = BTreeMap::new();
    match &config.node_port_addresses {
        NodePortAddresses::AllLocal => {
            cidrs.insert(IpFamily::V4, vec!["0.0.0.0/0".parse().expect("valid CIDR")]);
            cidrs.insert(IpFamily::V6, vec!["::/0".parse().expect("valid CIDR")]);
        }
        NodePortAddresses::Cidrs(list) => {
            for cidr in list {
                let family = IpFamily::of(&cidr.addr());
                cidrs.entry(family).or_default().push(*cidr);
            }
        }
    }
    cidrs
}

fn cidrs_of_family(cidrs: &[IpNet], family: IpFamily) -> Vec<IpNet> {
    cidrs.iter().filter(|c| IpFamily::of(&c.addr()) == family).copied().collect()
}

/// The plans of every port and family of one Service.
fn plan_service(
    service: &Service,
    state: &ClusterState,
    node: &Node,
    plan: &NodePlan,
) -> BTreeMap<PlanKey, ServicePortPlan> {
    let mut out = BTreeMap::new();
    let families: BTreeSet<IpFamily> = service.cluster_ips.iter().map(IpFamily::of).collect();
    for port in &service.ports {
        let name = service.port_name(port);
        let endpoints = state.endpoints_for(&name);
        for &family in &families {
            let of_family: Vec<_> =
                endpoints.iter().filter(|e| IpFamily::of(&e.address.ip()) == family).cloned().collect();
            let selection = select_endpoints(service, &of_family, node);
            let frontends = plan_frontends(service, port.port, port.node_port, family, &selection, plan);
            let key = PlanKey { family, name: name.clone() };
            out.insert(
                key,
                ServicePortPlan {
                    name: name.clone(),
                    family,
                    protocol: port.protocol,
                    frontends,
                    cluster_endpoints: selection.cluster,
                    local_endpoints: selection.local,
                    affinity: service.session_affinity,
                },
            );
        }
    }
    out
}

fn unrouted(selection: &Selection) -> Unrouted {
    if selection.has_any { Unrouted::Drop } else { Unrouted::Reject }
}

/// Routes for traffic that `internalTrafficPolicy` governs (to ClusterIPs).
fn internal_routes(service: &Service, selection: &Selection, cluster_cidrs: &[IpNet]) -> (Vec<Route>, Unrouted) {
    let endpoints = match service.internal_traffic_policy {
        TrafficPolicy::Cluster => EndpointSetKind::Cluster,
        TrafficPolicy::Local => EndpointSetKind::Local,
    };
    let available = match endpoints {
        EndpointSetKind::Cluster => !selection.cluster.is_empty(),
        EndpointSetKind::Local => !selection.local.is_empty(),
    };
    if !available {
        return (Vec::new(), unrouted(selection));
    }
    let mut routes = Vec::new();
    if !cluster_cidrs.is_empty() {
        // Off-cluster clients reach ClusterIPs through a node; the reply must come back
        // through the same node.
        routes.push(Route { sources: SourceMatch::Outside(cluster_cidrs.to_vec()), masquerade: true, endpoints });
    }
    routes.push(Route { sources: SourceMatch::Any, masquerade: false, endpoints });
    (routes, Unrouted::Unreachable)
}

/// Routes for traffic that `externalTrafficPolicy` governs (NodePorts, external and
/// load-balancer IPs).
fn external_routes(service: &Service, selection: &Selection, cluster_cidrs: &[IpNet]) -> (Vec<Route>, Unrouted) {
    match service.external_traffic_policy {
        TrafficPolicy::Cluster => {
            if selection.cluster.is_empty() {
                return (Vec::new(), unrouted(selection));
            }
            let route = Route { sources: SourceMatch::Any, masquerade: true, endpoints: EndpointSetKind::Cluster };
            (vec![route], Unrouted::Unreachable)
        }
        TrafficPolicy::Local => {
            let mut routes = Vec::new();
            if !selection.cluster.is_empty() {
                // Pods and the node itself are not "external": they may use every endpoint.
                if !cluster_cidrs.is_empty() {
                    routes.push(Route {
                        sources: SourceMatch::Inside(cluster_cidrs.to_vec()),
                        masquerade: false,
                        endpoints: EndpointSetKind::Cluster,
                    });
                }
                routes.push(Route {
                    sources: SourceMatch::ThisNode,
                    masquerade: true,
                    endpoints: EndpointSetKind::Cluster,
                });
            }
            if selection.local.is_empty() {
                return (routes, unrouted(selection));
            }
            routes.push(Route { sources: SourceMatch::Any, masquerade: false, endpoints: EndpointSetKind::Local });
            (routes, Unrouted::Unreachable)
        }
    }
}

fn plan_frontends(
    service: &Service,
    port: u16,
    node_port: Option<u16>,
    family: IpFamily,
    selection: &Selection,
    plan: &NodePlan,
) -> Vec<Frontend> {
    let cluster_cidrs = cidrs_of_family(&plan.config.cluster_cidrs, family);
    let mut frontends = Vec::new();
    let (routes, unrouted) = internal_routes(service, selection, &cluster_cidrs);
    for ip in service.cluster_ips.iter().filter(|ip| IpFamily::of(ip) == family) {
        frontends.push(Frontend {
            kind: FrontendKind::ClusterIp,
            destination: Destination::Address(*ip),
            port,
            allowed_sources: Vec::new(),
            routes: routes.clone(),
            unrouted,
        });
    }
    let (routes, unrouted) = external_routes(service, selection, &cluster_cidrs);
    if service.service_type != ServiceType::ClusterIp
        && let Some(node_port) = node_port
        && plan.node_port_cidrs.contains_key(&family)
    {
        frontends.push(Frontend {
            kind: FrontendKind::NodePort,
            destination: Destination::NodePortAddresses,
            port: node_port,
            allowed_sources: Vec::new(),
            routes: routes.clone(),
            unrouted,
        });
    }
    for ip in service.external_ips.iter().filter(|ip| IpFamily::of(ip) == family) {
        frontends.push(Frontend {
            kind: FrontendKind::ExternalIp,
            destination: Destination::Address(*ip),
            port,
            allowed_sources: Vec::new(),
            routes: routes.clone(),
            unrouted,
        });
    }
    if service.service_type == ServiceType::LoadBalancer {
        let allowed = cidrs_of_family(&service.load_balancer_source_ranges, family);
        for ingress in
            service.load_balancer_ingress.iter().filter(|i| !i.is_proxy_mode && IpFamily::of(&i.ip) == family)
        {
            frontends.push(Frontend {
                kind: FrontendKind::LoadBalancer,
                destination: Destination::Address(ingress.ip),
                port,
                allowed_sources: allowed.clone(),
                routes: routes.clone(),
                unrouted,
            });
        }
    }
    frontends
}
