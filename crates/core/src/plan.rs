//! The per-node plan: for every service port and IP family, the frontends that accept
//! traffic and, for each, which sources go to which endpoint set, masqueraded or not, and
//! what happens to the rest. Backends render this and decide nothing themselves.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;

use crate::model::{
    ClientIpAffinity, IpFamily, NamespacedName, Node, Protocol, Service, ServicePortName, ServiceType, TrafficPolicy,
};
use crate::selection::{Selection, select_endpoints};
use crate::sorted::SortedVec;
use crate::state::{Changes, ClusterState};

/// Where NodePorts answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// Every address of the node except loopback.
    #[default]
    AllLocal,
    /// Node addresses inside these CIDRs.
    Cidrs(Vec<IpNet>),
    /// The node's primary address of each family (`--node-ip`, else the Node object's first).
    Primary,
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

/// How a frontend refuses traffic when [`Unrouted::Reject`] applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// A TCP reset: a client still in `connect()` takes it at once, where an ICMP error
    /// may be rate-limited or (IPv6) lost before the socket sees it.
    TcpReset,
    /// ICMP (v6) port unreachable, as kube-proxy answers every protocol.
    IcmpPortUnreachable,
}

impl Refusal {
    pub fn for_protocol(protocol: Protocol) -> Self {
        match protocol {
            Protocol::Tcp => Refusal::TcpReset,
            Protocol::Udp | Protocol::Sctp => Refusal::IcmpPortUnreachable,
        }
    }
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

/// A list of endpoint addresses in a plan, shared rather than copied: the plan keeps every
/// port's lists until its Service changes, a backend's record of what it wrote can hold
/// the same lists, and a port's serving endpoints are usually its cluster endpoints (at
/// 10k Services x 10 endpoints each copy was ~3 MiB).
pub type Endpoints = Arc<[SocketAddr]>;

/// Everything one service port needs on this node, for one IP family.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServicePortPlan {
    pub name: ServicePortName,
    pub family: IpFamily,
    pub protocol: Protocol,
    pub frontends: Vec<Frontend>,
    pub cluster_endpoints: Endpoints,
    pub local_endpoints: Endpoints,
    /// Every serving endpoint of this family, whatever policy, topology or termination
    /// says: conntrack flows to these stay valid (UDP keeps behaving like TCP).
    pub serving_endpoints: Endpoints,
    pub affinity: Option<ClientIpAffinity>,
    /// How `Unrouted::Reject` refuses on this port.
    pub refusal: Refusal,
    /// A packet whose source is the endpoint it is sent to (a pod reaching itself through
    /// the Service) is masqueraded, or the reply would bypass the node's conntrack. Always
    /// true today; a field so every backend renders the decision instead of making it.
    pub masquerade_hairpin: bool,
}

impl ServicePortPlan {
    pub fn endpoints(&self, set: EndpointSetKind) -> &[SocketAddr] {
        self.shared_endpoints(set)
    }

    /// The list of one set itself, for a backend that keeps it without copying.
    pub fn shared_endpoints(&self, set: EndpointSetKind) -> &Endpoints {
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePlan {
    pub config: NodeConfig,
    pub service_ports: BTreeMap<PlanKey, ServicePortPlan>,
    /// Per family, where NodePorts answer: local addresses inside these CIDRs, except
    /// [`Self::node_port_exclusions`].
    pub node_port_cidrs: BTreeMap<IpFamily, Vec<IpNet>>,
    /// Per family, addresses where NodePorts never answer whatever the CIDRs say:
    /// loopback, so a NodePort never opens Services to every local process.
    pub node_port_exclusions: BTreeMap<IpFamily, Vec<IpNet>>,
    /// The keys each Service owns, so replanning one Service never scans the others.
    keys_by_service: BTreeMap<NamespacedName, SortedVec<PlanKey>>,
    /// Health-check node ports of Services with `externalTrafficPolicy: Local`.
    pub health_checks: BTreeMap<NamespacedName, HealthCheck>,
}

/// `spec.healthCheckNodePort`: answers whether this node has endpoints for the Service,
/// so an external load balancer only sends to nodes that can serve locally.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HealthCheck {
    pub port: u16,
    /// Distinct local endpoint addresses across the Service's ports, in its primary family.
    pub local_endpoints: usize,
}

/// What one or more plan updates changed: every key added, changed or removed, with what
/// it looked like before the first of them (`None`: the key is new). A value the sync loop
/// hands to whoever needs it (the dataplane, conntrack cleanup, metrics), never state kept
/// inside the plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanDiff {
    before: BTreeMap<PlanKey, Option<ServicePortPlan>>,
}

impl PlanDiff {
    /// The keys that differ.
    pub fn keys(&self) -> impl Iterator<Item = &PlanKey> + '_ {
        self.before.keys()
    }

    pub fn contains(&self, key: &PlanKey) -> bool {
        self.before.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.before.len()
    }

    pub fn is_empty(&self) -> bool {
        self.before.is_empty()
    }

    /// How `key` looked before the change; `None` if it is new (or did not change).
    pub fn previous(&self, key: &PlanKey) -> Option<&ServicePortPlan> {
        self.before.get(key).and_then(Option::as_ref)
    }

    /// Records that `key` changed from `before`, unless an earlier change already said
    /// what it was at the start.
    fn record(&mut self, key: PlanKey, before: Option<ServicePortPlan>) {
        self.before.entry(key).or_insert(before);
    }

    /// Adds a later diff to this one (a sync that failed leaves its diff to the next):
    /// for keys in both, the earlier "before" stays.
    pub fn absorb(&mut self, later: PlanDiff) {
        for (key, before) in later.before {
            self.record(key, before);
        }
    }

    /// Keys that are the same now as before (changed and changed back) are no difference.
    pub fn without_round_trips(mut self, plan: &NodePlan) -> PlanDiff {
        self.before.retain(|key, before| before.as_ref() != plan.service_ports.get(key));
        self
    }
}

impl NodePlan {
    pub fn new(config: NodeConfig) -> Self {
        let node_port_cidrs = node_port_cidrs(&config, &[]);
        Self {
            config,
            service_ports: BTreeMap::new(),
            node_port_cidrs,
            node_port_exclusions: node_port_exclusions(),
            keys_by_service: BTreeMap::new(),
            health_checks: BTreeMap::new(),
        }
    }

    /// The plan from scratch.
    pub fn build(state: &ClusterState, config: NodeConfig) -> Self {
        let mut plan = Self::new(config);
        let changes = Changes { everything: true, ..Changes::default() };
        plan.update(state, &changes);
        plan
    }

    /// Replans the services in `changes` (everything if it says so) and returns what
    /// differs from before. Costs in proportion to the changed services, not the cluster.
    pub fn update(&mut self, state: &ClusterState, changes: &Changes) -> PlanDiff {
        let node = node_of(state, &self.config);
        if changes.everything {
            self.node_port_cidrs = node_port_cidrs(&self.config, &node.addresses);
        }
        if changes.everything && self.service_ports.is_empty() && self.keys_by_service.is_empty() {
            return self.build_in_bulk(state, &node);
        }
        let mut changed = PlanDiff::default();
        let services: Vec<NamespacedName> = if changes.everything {
            let mut all: BTreeSet<NamespacedName> = state.services().map(|s| s.name.clone()).collect();
            all.extend(self.keys_by_service.keys().cloned());
            all.into_iter().collect()
        } else {
            changes.services.iter().cloned().collect()
        };
        for name in services {
            let fresh = state.service(&name).map(|s| plan_service(s, state, &node, self)).unwrap_or_default();
            let previous = self.keys_by_service.remove(&name).unwrap_or_default();
            for key in previous.into_iter().filter(|k| !fresh.contains_key(k)) {
                let old = self.service_ports.remove(&key);
                changed.record(key, old);
            }
            if !fresh.is_empty() {
                self.keys_by_service.insert(name.clone(), fresh.keys().cloned().collect());
            }
            match state.service(&name).and_then(|service| health_check(service, &fresh)) {
                Some(check) => self.health_checks.insert(name.clone(), check),
                None => self.health_checks.remove(&name),
            };
            for (key, port_plan) in fresh {
                if self.service_ports.get(&key) != Some(&port_plan) {
                    let old = self.service_ports.insert(key.clone(), port_plan);
                    changed.record(key, old);
                }
            }
        }
        changed
    }
}

impl NodePlan {
    /// The first plan (nothing planned yet): every Service planned, then each map built
    /// in one go from its sorted entries. A B-tree filled one ascending key at a time
    /// leaves its nodes about half empty; built in bulk its nodes are full, which at 10k
    /// Services is megabytes (see `examples/plan_memory.rs`). Same result as planning
    /// Service by Service.
    fn build_in_bulk(&mut self, state: &ClusterState, node: &Node) -> PlanDiff {
        let mut ports = Vec::new();
        let mut keys = Vec::new();
        let mut checks = Vec::new();
        for service in state.services() {
            let fresh = plan_service(service, state, node, self);
            if let Some(check) = health_check(service, &fresh) {
                checks.push((service.name.clone(), check));
            }
            if !fresh.is_empty() {
                keys.push((service.name.clone(), fresh.keys().cloned().collect()));
            }
            ports.extend(fresh);
        }
        let changed = PlanDiff { before: ports.iter().map(|(key, _)| (key.clone(), None)).collect() };
        self.service_ports = ports.into_iter().collect();
        self.keys_by_service = keys.into_iter().collect();
        self.health_checks = checks.into_iter().collect();
        changed
    }
}

fn health_check(service: &Service, ports: &BTreeMap<PlanKey, ServicePortPlan>) -> Option<HealthCheck> {
    let port = service.health_check_node_port?;
    if service.service_type != ServiceType::LoadBalancer || service.external_traffic_policy != TrafficPolicy::Local {
        return None;
    }
    // Counted in the primary family only, as kube-proxy does: a dual-stack pod is one endpoint.
    let primary = service.cluster_ips.first().map(IpFamily::of)?;
    let local: BTreeSet<IpAddr> = ports
        .values()
        .filter(|p| p.family == primary)
        .flat_map(|p| p.local_endpoints.iter().map(SocketAddr::ip))
        .collect();
    Some(HealthCheck { port, local_endpoints: local.len() })
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

fn node_port_cidrs(config: &NodeConfig, node_addresses: &[IpAddr]) -> BTreeMap<IpFamily, Vec<IpNet>> {
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
        NodePortAddresses::Primary => {
            for family in [IpFamily::V4, IpFamily::V6] {
                if let Some(address) = node_addresses.iter().find(|a| IpFamily::of(a) == family) {
                    cidrs.insert(family, vec![IpNet::from(*address)]);
                }
            }
        }
    }
    cidrs
}

fn node_port_exclusions() -> BTreeMap<IpFamily, Vec<IpNet>> {
    BTreeMap::from([
        (IpFamily::V4, vec!["127.0.0.0/8".parse().expect("valid CIDR")]),
        (IpFamily::V6, vec!["::1/128".parse().expect("valid CIDR")]),
    ])
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
            let cluster_endpoints: Endpoints = selection.cluster.into();
            let serving: Vec<SocketAddr> = of_family.iter().filter(|e| e.endpoint.serving).map(|e| e.address).collect();
            let serving_endpoints =
                if *serving == *cluster_endpoints { Arc::clone(&cluster_endpoints) } else { serving.into() };
            out.insert(
                key,
                ServicePortPlan {
                    name: name.clone(),
                    family,
                    protocol: port.protocol,
                    frontends: exactly_sized(frontends),
                    cluster_endpoints,
                    local_endpoints: selection.local.into(),
                    serving_endpoints,
                    affinity: service.session_affinity,
                    refusal: Refusal::for_protocol(port.protocol),
                    masquerade_hairpin: true,
                },
            );
        }
    }
    out
}

/// The plan lives until the next change of its Service: spare capacity left by filtering
/// is memory held for nothing (a megabyte at 10k Services).
fn exactly_sized<T>(mut list: Vec<T>) -> Vec<T> {
    list.shrink_to_fit();
    list
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, EndpointPort, EndpointSlice, ServicePort};
    use crate::state::Change;

    fn config() -> NodeConfig {
        NodeConfig {
            node_name: "node1".into(),
            node_ips: vec!["198.18.0.11".parse().unwrap()],
            cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
            node_port_addresses: NodePortAddresses::AllLocal,
        }
    }

    fn service(service_type: ServiceType) -> Service {
        let mut s = Service::cluster_ip(
            NamespacedName::new("default", "web"),
            vec!["198.19.0.10".parse().unwrap()],
            vec![ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: 80, node_port: Some(30080) }],
        );
        s.service_type = service_type;
        s
    }

    fn slice(endpoints: &[(&str, &str)]) -> EndpointSlice {
        EndpointSlice {
            last_change_trigger: None,
            name: NamespacedName::new("default", "web-abc"),
            service: NamespacedName::new("default", "web"),
            family: IpFamily::V4,
            ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
            endpoints: endpoints.iter().map(|(ip, node)| Endpoint::ready(ip.parse().unwrap(), Some(node))).collect(),
        }
    }

    fn plan_of(service: Service, endpoints: &[(&str, &str)]) -> ServicePortPlan {
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(service));
        state.apply(Change::SliceUpserted(slice(endpoints)));
        let plan = NodePlan::build(&state, config());
        assert_eq!(plan.service_ports.len(), 1);
        plan.service_ports.into_values().next().unwrap()
    }

    fn frontend(plan: &ServicePortPlan, kind: FrontendKind) -> &Frontend {
        plan.frontends.iter().find(|f| f.kind == kind).expect("frontend of that kind")
    }

    #[test]
    fn a_cluster_ip_masquerades_only_traffic_from_outside_the_cluster_cidr() {
        let plan = plan_of(service(ServiceType::ClusterIp), &[("198.18.129.2", "node1")]);
        let cluster_ip = frontend(&plan, FrontendKind::ClusterIp);
        assert_eq!(cluster_ip.destination, Destination::Address("198.19.0.10".parse().unwrap()));
        assert_eq!(
            cluster_ip.routes,
            vec![
                Route {
                    sources: SourceMatch::Outside(vec!["198.18.128.0/17".parse().unwrap()]),
                    masquerade: true,
                    endpoints: EndpointSetKind::Cluster
                },
                Route { sources: SourceMatch::Any, masquerade: false, endpoints: EndpointSetKind::Cluster },
            ]
        );
        assert_eq!(cluster_ip.unrouted, Unrouted::Unreachable);
    }

    #[test]
    fn a_port_whose_endpoints_all_serve_keeps_one_list_for_its_cluster_and_serving_endpoints() {
        let plan = plan_of(service(ServiceType::ClusterIp), &[("198.18.129.2", "node1"), ("198.18.130.2", "node2")]);
        assert_eq!(plan.cluster_endpoints.len(), 2);
        assert!(Arc::ptr_eq(&plan.cluster_endpoints, &plan.serving_endpoints));
    }

    #[test]
    fn a_terminating_endpoint_that_still_serves_is_in_the_serving_list_only() {
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(service(ServiceType::ClusterIp)));
        let mut with_terminating = slice(&[("198.18.129.2", "node1"), ("198.18.130.2", "node2")]);
        let leaving = &mut with_terminating.endpoints[1];
        (leaving.ready, leaving.serving, leaving.terminating) = (false, true, true);
        state.apply(Change::SliceUpserted(with_terminating));
        let plan = NodePlan::build(&state, config());
        let port = plan.service_ports.values().next().unwrap();
        let address = |ip: &str| SocketAddr::new(ip.parse().unwrap(), 8080);
        assert_eq!(*port.cluster_endpoints, [address("198.18.129.2")]);
        assert_eq!(*port.serving_endpoints, [address("198.18.129.2"), address("198.18.130.2")]);
    }

    #[test]
    fn a_cluster_ip_without_a_known_cluster_cidr_is_never_masqueraded() {
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(service(ServiceType::ClusterIp)));
        state.apply(Change::SliceUpserted(slice(&[("198.18.129.2", "node1")])));
        let plan = NodePlan::build(&state, NodeConfig { cluster_cidrs: vec![], ..config() });
        let port = plan.service_ports.values().next().unwrap();
        assert!(port.frontends[0].routes.iter().all(|r| !r.masquerade));
    }

    #[test]
    fn a_cluster_ip_service_has_no_node_port_frontend() {
        let plan = plan_of(service(ServiceType::ClusterIp), &[("198.18.129.2", "node1")]);
        assert!(plan.frontends.iter().all(|f| f.kind == FrontendKind::ClusterIp));
    }

    #[test]
    fn a_node_port_masquerades_all_traffic_under_cluster_policy() {
        let plan = plan_of(service(ServiceType::NodePort), &[("198.18.129.2", "node1")]);
        let node_port = frontend(&plan, FrontendKind::NodePort);
        assert_eq!(node_port.port, 30080);
        assert_eq!(
            node_port.routes,
            vec![Route { sources: SourceMatch::Any, masquerade: true, endpoints: EndpointSetKind::Cluster }]
        );
    }

    #[test]
    fn a_service_without_endpoints_rejects_on_every_frontend() {
        let plan = plan_of(service(ServiceType::NodePort), &[]);
        assert_eq!(plan.frontends.len(), 2);
        for f in &plan.frontends {
            assert!(f.routes.is_empty());
            assert_eq!(f.unrouted, Unrouted::Reject);
        }
    }

    #[test]
    fn external_local_policy_keeps_external_sources_on_local_endpoints_unmasqueraded() {
        let mut svc = service(ServiceType::NodePort);
        svc.external_traffic_policy = TrafficPolicy::Local;
        let plan = plan_of(svc, &[("198.18.129.2", "node1"), ("198.18.130.2", "node2")]);
        let node_port = frontend(&plan, FrontendKind::NodePort);
        let last = node_port.routes.last().unwrap();
        assert_eq!(last, &Route { sources: SourceMatch::Any, masquerade: false, endpoints: EndpointSetKind::Local });
        assert_eq!(plan.local_endpoints.len(), 1);
        // Pods short-circuit to every endpoint; the node itself too, masqueraded.
        assert_eq!(node_port.routes[0].endpoints, EndpointSetKind::Cluster);
        assert_eq!(
            node_port.routes[1],
            Route { sources: SourceMatch::ThisNode, masquerade: true, endpoints: EndpointSetKind::Cluster }
        );
    }

    #[test]
    fn external_local_policy_without_local_endpoints_drops_external_traffic() {
        let mut svc = service(ServiceType::NodePort);
        svc.external_traffic_policy = TrafficPolicy::Local;
        let plan = plan_of(svc, &[("198.18.130.2", "node2")]);
        let node_port = frontend(&plan, FrontendKind::NodePort);
        assert_eq!(node_port.unrouted, Unrouted::Drop);
        assert!(node_port.routes.iter().all(|r| r.sources != SourceMatch::Any));
    }

    #[test]
    fn internal_local_policy_without_local_endpoints_drops_instead_of_rejecting() {
        let mut svc = service(ServiceType::ClusterIp);
        svc.internal_traffic_policy = TrafficPolicy::Local;
        let plan = plan_of(svc, &[("198.18.130.2", "node2")]);
        let cluster_ip = frontend(&plan, FrontendKind::ClusterIp);
        assert!(cluster_ip.routes.is_empty());
        assert_eq!(cluster_ip.unrouted, Unrouted::Drop);
    }

    #[test]
    fn load_balancer_ips_in_proxy_mode_are_not_programmed() {
        let mut svc = service(ServiceType::LoadBalancer);
        svc.load_balancer_ingress = vec![
            crate::model::LoadBalancerIngress { ip: "198.18.100.1".parse().unwrap(), is_proxy_mode: false },
            crate::model::LoadBalancerIngress { ip: "198.18.100.2".parse().unwrap(), is_proxy_mode: true },
        ];
        svc.load_balancer_source_ranges = vec!["198.18.0.0/24".parse().unwrap()];
        let plan = plan_of(svc, &[("198.18.129.2", "node1")]);
        let lbs: Vec<_> = plan.frontends.iter().filter(|f| f.kind == FrontendKind::LoadBalancer).collect();
        assert_eq!(lbs.len(), 1);
        assert_eq!(lbs[0].destination, Destination::Address("198.18.100.1".parse().unwrap()));
        assert_eq!(lbs[0].allowed_sources, vec!["198.18.0.0/24".parse::<IpNet>().unwrap()]);
    }

    #[test]
    fn a_dual_stack_service_gets_one_plan_per_family_with_endpoints_of_that_family() {
        let mut svc = service(ServiceType::NodePort);
        svc.cluster_ips.push("2001:db8:f::10".parse().unwrap());
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(svc));
        state.apply(Change::SliceUpserted(slice(&[("198.18.129.2", "node1")])));
        let plan = NodePlan::build(&state, config());
        let families: Vec<IpFamily> = plan.service_ports.keys().map(|k| k.family).collect();
        assert_eq!(families, [IpFamily::V4, IpFamily::V6]);
        let v6 = plan.service_ports.values().find(|p| p.family == IpFamily::V6).unwrap();
        assert!(v6.cluster_endpoints.is_empty());
        assert!(v6.frontends.iter().all(|f| f.unrouted == Unrouted::Reject));
    }

    #[test]
    fn an_update_reports_only_the_service_ports_that_changed() {
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(service(ServiceType::ClusterIp)));
        let mut other = service(ServiceType::ClusterIp);
        other.name = NamespacedName::new("default", "other");
        other.cluster_ips = vec!["198.19.0.11".parse().unwrap()];
        state.apply(Change::ServiceUpserted(other));
        let mut plan = NodePlan::build(&state, config());
        state.take_changes();

        state.apply(Change::SliceUpserted(slice(&[("198.18.129.2", "node1")])));
        let changed = {
            let changes = state.take_changes();
            plan.update(&state, &changes)
        };
        let names: Vec<String> = changed.keys().map(|k| k.name.service.name.to_string()).collect();
        assert_eq!(names, ["web"]);
        assert_eq!(plan.service_ports.len(), 2);
    }

    #[test]
    fn deleting_a_service_removes_its_plans_and_reports_them() {
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(service(ServiceType::NodePort)));
        let mut plan = NodePlan::build(&state, config());
        state.take_changes();
        state.apply(Change::ServiceDeleted(NamespacedName::new("default", "web")));
        let changed = {
            let changes = state.take_changes();
            plan.update(&state, &changes)
        };
        assert_eq!(changed.len(), 1);
        assert!(plan.service_ports.is_empty());
    }

    #[test]
    fn a_local_policy_load_balancer_counts_its_local_endpoints_for_the_health_check() {
        let mut svc = service(ServiceType::LoadBalancer);
        svc.external_traffic_policy = TrafficPolicy::Local;
        svc.health_check_node_port = Some(32000);
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(svc));
        state.apply(Change::SliceUpserted(slice(&[("198.18.129.2", "node1"), ("198.18.130.2", "node2")])));
        let plan = NodePlan::build(&state, config());
        assert_eq!(
            plan.health_checks.get(&NamespacedName::new("default", "web")),
            Some(&HealthCheck { port: 32000, local_endpoints: 1 })
        );
    }

    /// Services of every kind, dual-stack ones, one without endpoints and one with a
    /// health check, named so that their order differs from the order they arrive in.
    fn mixed_state() -> ClusterState {
        let mut state = ClusterState::new();
        for (n, service_type) in [ServiceType::LoadBalancer, ServiceType::ClusterIp, ServiceType::NodePort]
            .into_iter()
            .cycle()
            .take(30)
            .enumerate()
        {
            let name = NamespacedName::new("default", format!("web-{}", 29 - n));
            let mut svc = service(service_type);
            svc.name = name.clone();
            svc.cluster_ips = vec![format!("198.19.0.{}", n + 10).parse().unwrap()];
            if n % 4 == 0 {
                svc.cluster_ips.push(format!("2001:db8::{:x}", n + 10).parse().unwrap());
            }
            if n % 3 == 0 {
                svc.external_traffic_policy = TrafficPolicy::Local;
                svc.health_check_node_port = Some(32000 + n as u16);
            }
            state.apply(Change::ServiceUpserted(svc));
            if n % 5 != 4 {
                let mut endpoints = slice(&[("198.18.129.2", "node1"), ("198.18.130.2", "node2")]);
                endpoints.name = NamespacedName::new("default", format!("web-{}-abc", 29 - n));
                endpoints.service = name;
                state.apply(Change::SliceUpserted(endpoints));
            }
        }
        state
    }

    #[test]
    fn the_first_plan_built_in_bulk_is_the_plan_made_service_by_service() {
        let state = mixed_state();
        let bulk = NodePlan::build(&state, config());
        let mut one_by_one = NodePlan::new(config());
        // Naming every Service (not "everything") plans them one at a time.
        let every = Changes { services: state.services().map(|s| s.name.clone()).collect(), everything: false };
        let diff = one_by_one.update(&state, &every);
        one_by_one.node_port_cidrs = bulk.node_port_cidrs.clone();
        assert_eq!(bulk, one_by_one);
        assert_eq!(bulk.service_ports.len(), 38);
        assert_eq!(bulk.health_checks.len(), 10);
        let mut first = NodePlan::new(config());
        let bulk_diff = first.update(&state, &Changes { everything: true, ..Changes::default() });
        assert_eq!(bulk_diff, diff);
        assert_eq!(bulk_diff.before.len(), 38);
    }

    #[test]
    fn an_update_remembers_what_the_changed_keys_looked_like_before() {
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(service(ServiceType::ClusterIp)));
        state.apply(Change::SliceUpserted(slice(&[("198.18.129.2", "node1")])));
        let mut plan = NodePlan::build(&state, config());
        state.take_changes();
        state.apply(Change::SliceUpserted(slice(&[("198.18.129.3", "node1")])));
        let changed = {
            let changes = state.take_changes();
            plan.update(&state, &changes)
        };
        let key = changed.keys().next().unwrap();
        let before = changed.previous(key).expect("the old plan");
        assert_eq!(before.cluster_endpoints[0].ip().to_string(), "198.18.129.2");
        assert_eq!(plan.service_ports[key].cluster_endpoints[0].ip().to_string(), "198.18.129.3");
    }

    #[test]
    fn a_diff_absorbing_a_later_one_keeps_what_each_key_looked_like_first() {
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(service(ServiceType::ClusterIp)));
        state.apply(Change::SliceUpserted(slice(&[("198.18.129.2", "node1")])));
        let mut plan = NodePlan::build(&state, config());
        state.take_changes();
        let mut step = |endpoint: &str| {
            state.apply(Change::SliceUpserted(slice(&[(endpoint, "node1")])));
            let changes = state.take_changes();
            plan.update(&state, &changes)
        };
        let mut pending = step("198.18.129.3");
        pending.absorb(step("198.18.129.4"));
        assert_eq!(pending.len(), 1);
        let key = pending.keys().next().unwrap().clone();
        assert_eq!(pending.previous(&key).unwrap().cluster_endpoints[0].ip().to_string(), "198.18.129.2");
    }

    #[test]
    fn a_key_changed_and_changed_back_is_no_difference() {
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(service(ServiceType::ClusterIp)));
        state.apply(Change::SliceUpserted(slice(&[("198.18.129.2", "node1")])));
        let mut plan = NodePlan::build(&state, config());
        state.take_changes();
        let mut pending = PlanDiff::default();
        for endpoint in ["198.18.129.3", "198.18.129.2"] {
            state.apply(Change::SliceUpserted(slice(&[(endpoint, "node1")])));
            let changes = state.take_changes();
            pending.absorb(plan.update(&state, &changes));
        }
        assert!(pending.without_round_trips(&plan).is_empty());
    }

    #[test]
    fn tcp_is_refused_with_a_reset_and_other_protocols_with_icmp() {
        let plan = plan_of(service(ServiceType::ClusterIp), &[]);
        assert_eq!(plan.refusal, Refusal::TcpReset);
        assert_eq!(Refusal::for_protocol(Protocol::Udp), Refusal::IcmpPortUnreachable);
        assert!(plan.masquerade_hairpin);
    }

    #[test]
    fn node_ports_never_answer_on_loopback() {
        let plan = NodePlan::new(config());
        assert_eq!(plan.node_port_exclusions[&IpFamily::V4], vec!["127.0.0.0/8".parse::<IpNet>().unwrap()]);
        assert_eq!(plan.node_port_exclusions[&IpFamily::V6], vec!["::1/128".parse::<IpNet>().unwrap()]);
    }

    #[test]
    fn primary_node_port_addresses_are_the_node_addresses_of_each_family() {
        let state = ClusterState::new();
        let plan = NodePlan::build(&state, NodeConfig { node_port_addresses: NodePortAddresses::Primary, ..config() });
        assert_eq!(plan.node_port_cidrs.get(&IpFamily::V4), Some(&vec!["198.18.0.11/32".parse::<IpNet>().unwrap()]));
        assert!(!plan.node_port_cidrs.contains_key(&IpFamily::V6));
    }

    #[test]
    fn node_ports_answer_only_in_families_the_operator_allowed() {
        let cfg = NodeConfig {
            node_port_addresses: NodePortAddresses::Cidrs(vec!["198.18.0.0/24".parse().unwrap()]),
            ..config()
        };
        let plan = NodePlan::new(cfg);
        assert!(plan.node_port_cidrs.contains_key(&IpFamily::V4));
        assert!(!plan.node_port_cidrs.contains_key(&IpFamily::V6));
    }
}
