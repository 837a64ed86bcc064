//! The plan spelled as socket-balancer map entries: pure, no kernel.
//!
//! A socket in the node's cgroup is either the node itself (its network namespace) or a pod
//! of the node; the plan's routes are evaluated once for each of those two sources, so the
//! programs only look up (frontend, scope) and pick an endpoint.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use crate::small_map::{SmallMap, SmallSet};
use svcplane_bpf::maps::{PROTO_SCTP, PROTO_TCP, PROTO_UDP};
use svcplane_bpf::{BackendValue, Scope, ServiceKey};
use svcplane_core::{
    Destination, EndpointSetKind, Endpoints, Frontend, FrontendKind, IpFamily, NodePlan, PlanKey, Protocol,
    ServicePortPlan, SourceMatch, Unrouted,
};

use ipnet::IpNet;

/// What one frontend does for one scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Balance over this endpoint set.
    Balance(EndpointSetKind),
    /// No endpoint at all: connect() fails with ECONNREFUSED.
    Reject,
    /// Not for this source: dropped (the caller sees EPERM, as with a local firewall drop).
    Drop,
}

/// Every map entry one service port needs; kept for every port between syncs, so its
/// maps and sets are sorted vectors ([`SmallMap`]), not trees.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortEntries {
    /// The endpoint sets some frontend balances over: the plan's own lists, shared.
    pub sets: SmallMap<EndpointSetKind, Endpoints>,
    pub frontends: SmallMap<ServiceKey, Decision>,
    /// Entries whose traffic the tc programs translate to the node's address.
    pub masqueraded: SmallSet<ServiceKey>,
    /// External-scope entries only sources inside these ranges may use
    /// (`loadBalancerSourceRanges`).
    pub source_ranges: SmallMap<ServiceKey, Vec<IpNet>>,
    /// Sets that external traffic to a NodePort, load-balancer or external IP balances over:
    /// the tc program picks in them with a Maglev table.
    pub maglev_sets: SmallSet<EndpointSetKind>,
    /// ClientIP affinity timeout in seconds (0: none).
    pub affinity_seconds: u32,
    /// UDP ports: every endpoint still serving (ready or terminating); flows already on one
    /// of these stay there. Empty for other protocols.
    pub serving: Endpoints,
    /// The endpoints of `sets` that run on this node (the plan's local endpoints).
    pub local: SmallSet<SocketAddr>,
}

impl PortEntries {
    /// An endpoint's entry in the backends map, marked local when it runs on this node.
    pub fn backend_value(&self, endpoint: SocketAddr) -> BackendValue {
        BackendValue::with_locality(endpoint, self.local.contains(&endpoint))
    }
}

/// What the node looks like to the renderer: its own addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeAddresses {
    /// Every address of the node's interfaces (NodePorts answer on those the plan allows).
    pub local: Vec<IpAddr>,
}

pub fn protocol_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => PROTO_TCP,
        Protocol::Udp => PROTO_UDP,
        Protocol::Sctp => PROTO_SCTP,
    }
}

fn family_of(ip: &IpAddr) -> IpFamily {
    IpFamily::of(ip)
}

/// The node's own source address of a family: the configured node IP, else none known.
fn node_source(plan: &NodePlan, family: IpFamily) -> Option<IpAddr> {
    plan.config.node_ips.iter().copied().find(|ip| family_of(ip) == family)
}

fn cluster_cidrs(plan: &NodePlan, family: IpFamily) -> impl Iterator<Item = &IpNet> {
    plan.config.cluster_cidrs.iter().filter(move |c| family_of(&c.addr()) == family)
}

/// Whether a pod's address (somewhere in the cluster CIDRs) is inside `cidrs`: only if the
/// cluster CIDRs are known and each lies inside one of `cidrs`.
fn pod_inside(plan: &NodePlan, family: IpFamily, cidrs: &[IpNet]) -> bool {
    let mut pods = cluster_cidrs(plan, family).peekable();
    pods.peek().is_some() && pods.all(|pod| cidrs.iter().any(|c| c.contains(pod)))
}

fn source_inside(plan: &NodePlan, family: IpFamily, scope: Scope, cidrs: &[IpNet]) -> bool {
    match scope {
        Scope::Node => node_source(plan, family).is_some_and(|ip| cidrs.iter().any(|c| c.contains(&ip))),
        Scope::Pod => pod_inside(plan, family, cidrs),
        // Routes test sources against the cluster CIDRs: an external source is outside them.
        Scope::External => false,
    }
}

fn matches(plan: &NodePlan, family: IpFamily, scope: Scope, sources: &SourceMatch) -> bool {
    match sources {
        SourceMatch::Any => true,
        SourceMatch::ThisNode => scope == Scope::Node,
        SourceMatch::Inside(cidrs) => source_inside(plan, family, scope, cidrs),
        SourceMatch::Outside(cidrs) => !source_inside(plan, family, scope, cidrs),
    }
}

/// The plan's answer for traffic from `scope` to `frontend`, and whether the route
/// masquerades. External sources are checked against `allowed_sources` per packet (the tc
/// programs' source-range map), so their answer assumes an allowed source.
pub fn decide(plan: &NodePlan, port: &ServicePortPlan, frontend: &Frontend, scope: Scope) -> (Decision, bool) {
    let family = port.family;
    if scope != Scope::External
        && !frontend.allowed_sources.is_empty()
        && !source_inside(plan, family, scope, &frontend.allowed_sources)
    {
        return (Decision::Drop, false);
    }
    if let Some(route) = frontend.routes.iter().find(|r| matches(plan, family, scope, &r.sources)) {
        return if port.endpoints(route.endpoints).is_empty() {
            (Decision::Drop, false)
        } else {
            (Decision::Balance(route.endpoints), route.masquerade)
        };
    }
    let decision = match frontend.unrouted {
        Unrouted::Reject => Decision::Reject,
        Unrouted::Drop | Unrouted::Unreachable => Decision::Drop,
    };
    (decision, false)
}

/// Where a frontend listens on this node.
pub fn frontend_addresses(plan: &NodePlan, family: IpFamily, frontend: &Frontend, node: &NodeAddresses) -> Vec<IpAddr> {
    match frontend.destination {
        Destination::Address(ip) => vec![ip],
        Destination::NodePortAddresses => {
            let allowed = plan.node_port_cidrs.get(&family).map(Vec::as_slice).unwrap_or_default();
            let excluded = plan.node_port_exclusions.get(&family).map(Vec::as_slice).unwrap_or_default();
            let mut addresses: Vec<IpAddr> = node
                .local
                .iter()
                .copied()
                .filter(|ip| family_of(ip) == family)
                .filter(|ip| allowed.iter().any(|c| c.contains(ip)) && !excluded.iter().any(|c| c.contains(ip)))
                .collect();
            addresses.sort();
            addresses.dedup();
            addresses
        }
    }
}

/// The entries of one service port.
pub fn render_port(plan: &NodePlan, port: &ServicePortPlan, node: &NodeAddresses) -> PortEntries {
    let mut entries = PortEntries {
        affinity_seconds: port.affinity.map_or(0, |a| u32::try_from(a.timeout.as_secs()).unwrap_or(u32::MAX).max(1)),
        ..PortEntries::default()
    };
    let proto = protocol_number(port.protocol);
    // Only UDP sockets look flows up (a TCP connection is its own flow).
    if port.protocol == Protocol::Udp {
        entries.serving = port.serving_endpoints.clone();
    }
    entries.local = port.local_endpoints.iter().copied().collect();
    for frontend in &port.frontends {
        let addresses = frontend_addresses(plan, port.family, frontend, node);
        for scope in [Scope::Node, Scope::Pod, Scope::External] {
            let (decision, masquerade) = decide(plan, port, frontend, scope);
            if let Decision::Balance(set) = decision {
                entries.sets.get_or_insert_with(set, || port.shared_endpoints(set).clone());
                if scope == Scope::External && frontend.kind != FrontendKind::ClusterIp {
                    entries.maglev_sets.insert(set);
                }
            }
            for &ip in &addresses {
                let key = ServiceKey::new(SocketAddr::new(ip, frontend.port), proto, scope);
                entries.frontends.insert(key, decision);
                if masquerade {
                    entries.masqueraded.insert(key);
                }
                if scope == Scope::External && !frontend.allowed_sources.is_empty() {
                    entries.source_ranges.insert(key, frontend.allowed_sources.clone());
                }
            }
        }
    }
    entries.frontends.shrink_to_fit();
    entries.sets.shrink_to_fit();
    entries.masqueraded.shrink_to_fit();
    entries
}

/// Below this many service ports a thread costs more than it saves.
const PORTS_PER_RENDER_THREAD: usize = 2048;

/// Every service port's entries, in the plan's order, rendered on as many threads as the
/// machine has CPUs for a large plan. A node's first sync renders every port into fresh
/// memory: most of its time is the allocator and first touches of pages, which threads
/// (each with its own allocator arena) do side by side.
pub fn render_ports(plan: &NodePlan, node: &NodeAddresses) -> Vec<PortEntries> {
    let ports: Vec<&ServicePortPlan> = plan.service_ports.values().collect();
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let threads = cpus.min(ports.len() / PORTS_PER_RENDER_THREAD).max(1);
    let render = |part: &[&ServicePortPlan]| part.iter().map(|port| render_port(plan, port, node)).collect::<Vec<_>>();
    if threads == 1 {
        return render(&ports);
    }
    let chunk = ports.len().div_ceil(threads);
    std::thread::scope(|scope| {
        // A part whose thread cannot be started (a thread limit) is rendered here instead.
        let others: Vec<_> = ports
            .chunks(chunk)
            .skip(1)
            .map(|part| (part, std::thread::Builder::new().spawn_scoped(scope, move || render(part)).ok()))
            .collect();
        let mut all = Vec::with_capacity(ports.len());
        all.extend(render(&ports[..chunk]));
        for (part, thread) in others {
            match thread {
                Some(thread) => all.extend(thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))),
                None => all.extend(render(part)),
            }
        }
        all
    })
}

/// Every service port's entries.
pub fn render_all(plan: &NodePlan, node: &NodeAddresses) -> BTreeMap<PlanKey, PortEntries> {
    plan.service_ports.iter().map(|(key, port)| (key.clone(), render_port(plan, port, node))).collect()
}

fn set_name(set: EndpointSetKind) -> &'static str {
    match set {
        EndpointSetKind::Cluster => "cluster",
        EndpointSetKind::Local => "local",
    }
}

/// The entries as readable tables: one line per frontend and scope, with its endpoints.
pub fn render_text(plan: &NodePlan, node: &NodeAddresses) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# svcplane eBPF mode: socket-balancer map entries (frontend, scope -> decision)");
    let _ = writeln!(
        out,
        "# node addresses: {}",
        node.local.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    );
    for (key, entries) in render_all(plan, node) {
        let _ = writeln!(out, "\n{} ({})", key.name, key.family);
        if entries.affinity_seconds > 0 {
            let _ = writeln!(out, "  affinity: ClientIP {}s", entries.affinity_seconds);
        }
        for (frontend, decision) in &entries.frontends {
            let what = match decision {
                Decision::Balance(set) => {
                    let endpoints = &entries.sets[set];
                    let list: Vec<String> = endpoints.iter().map(ToString::to_string).collect();
                    format!("{} [{}]", set_name(*set), list.join(", "))
                }
                Decision::Reject => "reject (ECONNREFUSED)".to_owned(),
                Decision::Drop => "drop".to_owned(),
            };
            let scope = match frontend.scope() {
                Scope::Node => "node",
                Scope::Pod => "pods",
                Scope::External => "outside",
            };
            let mut what = what;
            if entries.masqueraded.contains(frontend) {
                what.push_str(" (masquerade in tc)");
            }
            if let Some(ranges) = entries.source_ranges.get(frontend) {
                let list: Vec<String> = ranges.iter().map(ToString::to_string).collect();
                what.push_str(&format!(" (only from {})", list.join(", ")));
            }
            let _ = writeln!(
                out,
                "  {:<48} {:<5} -> {what}",
                format!("{}/{}", frontend.address(), svcplane_bpf::maps::protocol_name(frontend.proto)),
                scope
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use svcplane_core::{
        Change, ClientIpAffinity, ClusterState, Endpoint, EndpointPort, EndpointSlice, NamespacedName, Node,
        NodeConfig, Service, ServicePort, ServiceType, TrafficPolicy,
    };

    use super::*;

    const NODE_IP: &str = "198.18.0.11";

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn plan_of(service: Service, endpoints: &[(&str, &str)]) -> NodePlan {
        let mut state = ClusterState::new();
        state.apply(Change::NodeUpserted(Node {
            leaving: false,
            name: "node1".into(),
            addresses: vec![ip(NODE_IP)],
            zone: None,
        }));
        let protocol = service.ports[0].protocol;
        let slice = EndpointSlice {
            last_change_trigger: None,
            name: NamespacedName::new("default", format!("{}-1", service.name.name)),
            service: service.name.clone(),
            family: IpFamily::V4,
            ports: vec![EndpointPort { name: "p".into(), protocol, port: 8080 }],
            endpoints: endpoints.iter().map(|(address, node)| Endpoint::ready(ip(address), Some(node))).collect(),
        };
        state.apply(Change::ServiceUpserted(service));
        state.apply(Change::SliceUpserted(slice));
        let config = NodeConfig {
            node_name: "node1".into(),
            node_ips: vec![ip(NODE_IP)],
            cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
            ..NodeConfig::default()
        };
        NodePlan::build(&state, config)
    }

    fn service(protocol: Protocol) -> Service {
        let port = ServicePort { name: "p".into(), protocol, port: 80, node_port: Some(30080) };
        let mut service =
            Service::cluster_ip(NamespacedName::new("default", "web"), vec![ip("198.19.0.10")], vec![port]);
        service.service_type = ServiceType::NodePort;
        service
    }

    fn only_port(plan: &NodePlan, node: &NodeAddresses) -> PortEntries {
        let all = render_all(plan, node);
        assert_eq!(all.len(), 1, "one service port");
        all.into_values().next().unwrap()
    }

    fn decision(entries: &PortEntries, address: &str, scope: Scope) -> Decision {
        let key = entries.frontends.keys().find(|k| k.address() == address.parse().unwrap() && k.scope() == scope);
        entries.frontends[key.unwrap_or_else(|| panic!("no entry for {address} {scope:?}: {:?}", entries.frontends))]
    }

    fn node() -> NodeAddresses {
        NodeAddresses { local: vec![ip("127.0.0.1"), ip(NODE_IP)] }
    }

    #[test]
    fn a_large_plan_rendered_on_several_threads_gives_every_port_in_the_plans_order_as_one_thread_does() {
        // Enough ports for two render threads (and a third part on a bigger machine).
        let mut state = ClusterState::new();
        for n in 0..(2 * PORTS_PER_RENDER_THREAD + 7) as u32 {
            let name = NamespacedName::new("default", format!("web-{n}"));
            let address = IpAddr::from(std::net::Ipv4Addr::from(0xc613_0000 + n));
            let endpoint = IpAddr::from(std::net::Ipv4Addr::from(0xc612_8000 + n));
            let port = ServicePort { name: "p".into(), protocol: Protocol::Tcp, port: 80, node_port: None };
            state.apply(Change::ServiceUpserted(Service::cluster_ip(name.clone(), vec![address], vec![port])));
            state.apply(Change::SliceUpserted(EndpointSlice {
                last_change_trigger: None,
                name: NamespacedName::new("default", format!("web-{n}-1")),
                service: name,
                family: IpFamily::V4,
                ports: vec![EndpointPort { name: "p".into(), protocol: Protocol::Tcp, port: 8080 }],
                endpoints: vec![Endpoint::ready(endpoint, Some("node2"))],
            }));
        }
        let config = NodeConfig { node_name: "node1".into(), node_ips: vec![ip(NODE_IP)], ..NodeConfig::default() };
        let plan = NodePlan::build(&state, config);
        let one_thread: Vec<PortEntries> =
            plan.service_ports.values().map(|p| render_port(&plan, p, &node())).collect();
        assert_eq!(one_thread.len(), 2 * PORTS_PER_RENDER_THREAD + 7);
        assert_eq!(render_ports(&plan, &node()), one_thread);
    }

    #[test]
    fn a_cluster_ip_and_a_node_port_balance_over_every_endpoint_for_the_node_and_its_pods() {
        let plan = plan_of(service(Protocol::Tcp), &[("198.18.129.1", "node1"), ("198.18.130.1", "node2")]);
        let entries = only_port(&plan, &node());
        for scope in [Scope::Node, Scope::Pod] {
            assert_eq!(decision(&entries, "198.19.0.10:80", scope), Decision::Balance(EndpointSetKind::Cluster));
            assert_eq!(decision(&entries, "198.18.0.11:30080", scope), Decision::Balance(EndpointSetKind::Cluster));
        }
        assert_eq!(entries.sets[&EndpointSetKind::Cluster].len(), 2);
        assert!(
            !entries.frontends.keys().any(|k| k.address().ip().is_loopback()),
            "NodePorts never answer on loopback"
        );
        assert!(entries.serving.is_empty(), "TCP ports need no serving-endpoint entries");
    }

    #[test]
    fn a_ports_entries_share_the_plans_endpoint_list_instead_of_copying_it() {
        let plan = plan_of(service(Protocol::Tcp), &[("198.18.129.1", "node1"), ("198.18.130.1", "node2")]);
        let entries = only_port(&plan, &node());
        let port = plan.service_ports.values().next().unwrap();
        assert!(std::sync::Arc::ptr_eq(&entries.sets[&EndpointSetKind::Cluster], &port.cluster_endpoints));
    }

    #[test]
    fn a_service_without_endpoints_is_refused_and_one_without_local_endpoints_is_dropped_for_pods() {
        let plan = plan_of(service(Protocol::Tcp), &[]);
        assert_eq!(decision(&only_port(&plan, &node()), "198.19.0.10:80", Scope::Pod), Decision::Reject);

        let mut local = service(Protocol::Tcp);
        local.internal_traffic_policy = TrafficPolicy::Local;
        let plan = plan_of(local, &[("198.18.130.1", "node2")]);
        let entries = only_port(&plan, &node());
        assert_eq!(decision(&entries, "198.19.0.10:80", Scope::Pod), Decision::Drop);
    }

    #[test]
    fn udp_ports_list_their_serving_endpoints_and_affinity_carries_its_timeout() {
        let mut udp = service(Protocol::Udp);
        udp.session_affinity = Some(ClientIpAffinity { timeout: Duration::from_secs(90) });
        let plan = plan_of(udp, &[("198.18.129.1", "node1")]);
        let entries = only_port(&plan, &node());
        assert_eq!(*entries.serving, ["198.18.129.1:8080".parse::<SocketAddr>().unwrap()]);
        assert_eq!(entries.affinity_seconds, 90);
        let text = render_text(&plan, &node());
        assert!(text.contains("affinity: ClientIP 90s"), "{text}");
        assert!(text.contains("198.19.0.10:80/udp"), "{text}");
    }

    #[test]
    fn traffic_from_outside_is_masqueraded_under_cluster_policy_and_keeps_its_source_under_local_policy() {
        let plan = plan_of(service(Protocol::Tcp), &[("198.18.129.1", "node1"), ("198.18.130.1", "node2")]);
        let entries = only_port(&plan, &node());
        let node_port = entries
            .frontends
            .keys()
            .find(|k| k.address() == "198.18.0.11:30080".parse().unwrap() && k.scope() == Scope::External)
            .copied()
            .expect("an external entry for the NodePort");
        assert_eq!(entries.frontends[&node_port], Decision::Balance(EndpointSetKind::Cluster));
        assert!(entries.masqueraded.contains(&node_port), "Cluster policy masquerades external traffic");

        let mut local = service(Protocol::Tcp);
        local.service_type = ServiceType::LoadBalancer;
        local.external_traffic_policy = TrafficPolicy::Local;
        local.load_balancer_ingress =
            vec![svcplane_core::LoadBalancerIngress { ip: ip("198.18.100.1"), is_proxy_mode: false }];
        local.load_balancer_source_ranges = vec!["198.18.0.0/24".parse().unwrap()];
        local.health_check_node_port = Some(30999);
        let plan = plan_of(local, &[("198.18.129.1", "node1"), ("198.18.130.1", "node2")]);
        let entries = only_port(&plan, &node());
        let lb = entries
            .frontends
            .keys()
            .find(|k| k.address() == "198.18.100.1:80".parse().unwrap() && k.scope() == Scope::External)
            .copied()
            .expect("an external entry for the load-balancer IP");
        assert_eq!(entries.frontends[&lb], Decision::Balance(EndpointSetKind::Local));
        assert!(!entries.masqueraded.contains(&lb), "Local policy keeps the client's address");
        assert_eq!(entries.source_ranges[&lb], vec!["198.18.0.0/24".parse::<IpNet>().unwrap()]);
    }
}
