//! Plan -> the redirect rules of one family's table. Pure: the same plan and the same
//! listener ports always render the same transaction.
//!
//! Shape: a verdict map dispatches each frontend (destination address or node port,
//! protocol, port) to the route chain of its service port and class (`internal-…` for
//! ClusterIPs, `external-…` for the rest); each route rule matches the plan's source test
//! and DNATs to the relay's listener for that route's endpoint set, on the node's own
//! address. Traffic no route takes is refused or dropped in filter hooks that only see
//! packets nothing DNATed (as in the nftables mode), `loadBalancerSourceRanges` drop
//! before NAT, and nothing is masqueraded: the relay's own connection to the endpoint
//! already comes from the node.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use svcplane_core::{
    Destination, EndpointSetKind, Frontend, FrontendKind, IpFamily, NodePlan, PlanKey, Protocol, Refusal,
    ServicePortName, ServicePortPlan, SourceMatch, Unrouted,
};
use svcplane_nft::{
    ChainType, CmpOp, DataType, Element, ElementValue, Expr, Family, FibAddress, Hook, Match, Operation, RejectKind,
    Set, Statement, TableName, Transaction, Value, Verdict,
};

/// The table svcplane owns in each family (the same name as the nftables mode's, so
/// switching modes replaces it rather than stacking two).
pub const TABLE: &str = "svcplane";

const SERVICE_IPS: &str = "service-ips";
const SERVICE_NODEPORTS: &str = "service-nodeports";
const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
const FIREWALL_IPS: &str = "firewall-ips";
const NODEPORT_ADDRESSES: &str = "nodeport-addresses";
const REJECT_WITH_RESET: &str = "reject-with-reset";
const REJECT_WITH_ICMP: &str = "reject-with-icmp";
/// The set of the relay's listeners (node address, protocol, port): reached only through
/// a route's DNAT, which marks the packet; anything else sent there is dropped, so nobody
/// bypasses source ranges or traffic policies by connecting to a listener directly.
const RELAY_LISTENERS: &str = "relay-listeners";
/// The packet mark bit a route sets before its DNAT to a listener.
pub const RELAYED_MARK: u32 = 0x0001_0000;
/// A chain the base chains always hold a rule in: what the drift check counts.
pub const DRIFT_CHAIN: &str = "nat-prerouting";

/// Where the relay listens for one route's endpoint set of one service port.
pub type ListenerPorts = BTreeMap<(PlanKey, EndpointSetKind), u16>;

pub fn table_name(family: IpFamily) -> TableName {
    TableName { family: nft_family(family), name: TABLE.to_owned() }
}

fn nft_family(family: IpFamily) -> Family {
    match family {
        IpFamily::V4 => Family::Ip,
        IpFamily::V6 => Family::Ip6,
    }
}

fn address_type(family: IpFamily) -> DataType {
    match family {
        IpFamily::V4 => DataType::Ipv4Addr,
        IpFamily::V6 => DataType::Ipv6Addr,
    }
}

/// Whether the relay serves this protocol; other ports are refused in the kernel.
pub fn relayed(protocol: Protocol) -> bool {
    matches!(protocol, Protocol::Tcp | Protocol::Udp)
}

/// The endpoint sets a service port's routes use: one listener each.
pub fn used_sets(plan: &ServicePortPlan) -> Vec<EndpointSetKind> {
    let mut sets: Vec<EndpointSetKind> =
        plan.frontends.iter().flat_map(|f| f.routes.iter().map(|r| r.endpoints)).collect();
    sets.sort();
    sets.dedup();
    sets
}

/// `<ns>/<name>/<proto>/<port-name>`, readable in `nft list ruleset`.
fn port_base(name: &ServicePortName) -> String {
    format!("{}/{}/{}/{}", name.service.namespace, name.service.name, name.protocol, name.port_name)
}

fn dispatch_keys() -> Vec<Expr> {
    vec![Expr::DestinationAddress, Expr::L4Proto, Expr::DestinationPort]
}

fn node_port_destination(family: IpFamily, plan: &NodePlan) -> Vec<Statement> {
    let mut statements = vec![Statement::Match(Match::FibLocal { address: FibAddress::Destination, negate: false })];
    let exclusions: Vec<IpNet> = plan.node_port_exclusions.get(&family).cloned().unwrap_or_default();
    if !exclusions.is_empty() {
        statements.push(Statement::Match(Match::InPrefixes {
            left: Expr::DestinationAddress,
            negate: true,
            prefixes: exclusions,
        }));
    }
    statements.push(Statement::Match(Match::InSet {
        keys: vec![Expr::DestinationAddress],
        negate: false,
        set: NODEPORT_ADDRESSES.to_owned(),
    }));
    statements
}

fn base_operations(family: IpFamily, plan: &NodePlan) -> Vec<Operation> {
    let addr = address_type(family);
    let mut ops = vec![
        Operation::AddTable { comment: Some("rules for svcplane (userspace mode)".to_owned()) },
        // Replaced whole, in the same transaction: the kernel applies both or neither.
        Operation::DeleteTable,
        Operation::AddTable { comment: Some("rules for svcplane (userspace mode)".to_owned()) },
    ];
    ops.push(Operation::add_verdict_map(SERVICE_IPS, vec![addr, DataType::InetProto, DataType::InetService]));
    ops.push(Operation::add_verdict_map(SERVICE_NODEPORTS, vec![DataType::InetProto, DataType::InetService]));
    ops.push(Operation::add_verdict_map(NO_ENDPOINT_SERVICES, vec![addr, DataType::InetProto, DataType::InetService]));
    ops.push(Operation::add_verdict_map(NO_ENDPOINT_NODEPORTS, vec![DataType::InetProto, DataType::InetService]));
    ops.push(Operation::add_verdict_map(FIREWALL_IPS, vec![addr, DataType::InetProto, DataType::InetService]));
    ops.push(Operation::AddSet(Set {
        name: RELAY_LISTENERS.to_owned(),
        key: vec![addr, DataType::InetProto, DataType::InetService],
        value: None,
        interval: false,
        dynamic_timeout: None,
        comment: None,
    }));
    ops.push(Operation::AddSet(Set {
        name: NODEPORT_ADDRESSES.to_owned(),
        key: vec![addr],
        value: None,
        interval: true,
        dynamic_timeout: None,
        comment: None,
    }));
    for cidr in plan.node_port_cidrs.get(&family).into_iter().flatten() {
        ops.push(Operation::AddElement(Element {
            set: NODEPORT_ADDRESSES.to_owned(),
            key: vec![Value::Prefix(*cidr)],
            value: None,
            comment: None,
        }));
    }
    for name in [
        "services",
        "firewall-check",
        "service-endpoints-check",
        "nodeport-endpoints-check",
        REJECT_WITH_RESET,
        REJECT_WITH_ICMP,
    ] {
        ops.push(Operation::add_chain(name, None));
    }
    ops.push(Operation::add_chain(DRIFT_CHAIN, Some((ChainType::Nat, Hook::Prerouting, -100))));
    ops.push(Operation::add_chain("nat-output", Some((ChainType::Nat, Hook::Output, -100))));
    ops.push(Operation::add_chain("filter-prerouting-pre-dnat", Some((ChainType::Filter, Hook::Prerouting, -110))));
    ops.push(Operation::add_chain("filter-output-pre-dnat", Some((ChainType::Filter, Hook::Output, -110))));
    ops.push(Operation::add_chain("filter-input", Some((ChainType::Filter, Hook::Input, 0))));
    ops.push(Operation::add_chain("filter-forward", Some((ChainType::Filter, Hook::Forward, 0))));
    ops.push(Operation::add_chain("filter-output", Some((ChainType::Filter, Hook::Output, 0))));

    let new = || Statement::Match(Match::CtStateNew);
    ops.push(Operation::add_rule(DRIFT_CHAIN, vec![Statement::jump("services")]));
    ops.push(Operation::add_rule("nat-output", vec![Statement::jump("services")]));
    ops.push(Operation::add_rule("filter-prerouting-pre-dnat", vec![new(), Statement::jump("firewall-check")]));
    ops.push(Operation::add_rule("filter-output-pre-dnat", vec![new(), Statement::jump("firewall-check")]));
    ops.push(Operation::add_rule(
        "filter-input",
        vec![
            new(),
            Statement::Match(Match::MarkMasked { mask: RELAYED_MARK, op: CmpOp::Eq, value: 0 }),
            Statement::Match(Match::InSet { keys: dispatch_keys(), negate: false, set: RELAY_LISTENERS.to_owned() }),
            Statement::Verdict(Verdict::Drop),
        ],
    ));
    ops.push(Operation::add_rule("filter-input", vec![new(), Statement::jump("nodeport-endpoints-check")]));
    ops.push(Operation::add_rule("filter-input", vec![new(), Statement::jump("service-endpoints-check")]));
    ops.push(Operation::add_rule("filter-forward", vec![new(), Statement::jump("service-endpoints-check")]));
    ops.push(Operation::add_rule("filter-output", vec![new(), Statement::jump("service-endpoints-check")]));

    ops.push(Operation::add_rule(
        "services",
        vec![Statement::VerdictMap { keys: dispatch_keys(), map: SERVICE_IPS.to_owned() }],
    ));
    let mut node_ports = node_port_destination(family, plan);
    node_ports.push(Statement::VerdictMap {
        keys: vec![Expr::L4Proto, Expr::DestinationPort],
        map: SERVICE_NODEPORTS.to_owned(),
    });
    ops.push(Operation::add_rule("services", node_ports));
    ops.push(Operation::add_rule(
        "firewall-check",
        vec![Statement::VerdictMap { keys: dispatch_keys(), map: FIREWALL_IPS.to_owned() }],
    ));
    ops.push(Operation::add_rule(
        "service-endpoints-check",
        vec![Statement::VerdictMap { keys: dispatch_keys(), map: NO_ENDPOINT_SERVICES.to_owned() }],
    ));
    let mut no_node_port = node_port_destination(family, plan);
    no_node_port.push(Statement::VerdictMap {
        keys: vec![Expr::L4Proto, Expr::DestinationPort],
        map: NO_ENDPOINT_NODEPORTS.to_owned(),
    });
    ops.push(Operation::add_rule("nodeport-endpoints-check", no_node_port));
    ops.push(Operation::add_rule(
        REJECT_WITH_RESET,
        vec![
            Statement::Match(Match::Compare { left: Expr::L4Proto, op: CmpOp::Eq, right: Value::Protocol(6) }),
            Statement::Reject(RejectKind::TcpReset),
        ],
    ));
    ops.push(Operation::add_rule(REJECT_WITH_RESET, vec![Statement::Reject(RejectKind::PortUnreachable)]));
    ops.push(Operation::add_rule(REJECT_WITH_ICMP, vec![Statement::Reject(RejectKind::PortUnreachable)]));
    ops
}

fn source_match(sources: &SourceMatch) -> Option<Match> {
    match sources {
        SourceMatch::Any => None,
        SourceMatch::Inside(prefixes) => {
            Some(Match::InPrefixes { left: Expr::SourceAddress, negate: false, prefixes: prefixes.clone() })
        }
        SourceMatch::Outside(prefixes) => {
            Some(Match::InPrefixes { left: Expr::SourceAddress, negate: true, prefixes: prefixes.clone() })
        }
        SourceMatch::ThisNode => Some(Match::FibLocal { address: FibAddress::Source, negate: false }),
    }
}

fn frontend_key(frontend: &Frontend, plan: &ServicePortPlan) -> Vec<Value> {
    let proto = Value::Protocol(plan.protocol.number());
    match frontend.destination {
        Destination::Address(address) => vec![Value::Address(address), proto, Value::Port(frontend.port)],
        Destination::NodePortAddresses => vec![proto, Value::Port(frontend.port)],
    }
}

fn route_chain_name(frontend: &Frontend, plan: &ServicePortPlan) -> String {
    let class = match frontend.kind {
        FrontendKind::ClusterIp => "internal",
        FrontendKind::NodePort | FrontendKind::ExternalIp | FrontendKind::LoadBalancer => "external",
    };
    format!("{class}-{}", port_base(&plan.name))
}

/// Everything one service port adds to its family's table: route chains (created before
/// the elements that point at them) and map elements.
fn port_operations(
    key: &PlanKey,
    plan: &ServicePortPlan,
    relay_address: IpAddr,
    ports: &ListenerPorts,
    chains: &mut Vec<Operation>,
    elements: &mut Vec<Operation>,
) {
    let mut made: Vec<String> = Vec::new();
    for frontend in &plan.frontends {
        let frontend_key = frontend_key(frontend, plan);
        let (dispatch, no_endpoint) = match frontend.destination {
            Destination::Address(_) => (SERVICE_IPS, NO_ENDPOINT_SERVICES),
            Destination::NodePortAddresses => (SERVICE_NODEPORTS, NO_ENDPOINT_NODEPORTS),
        };
        let relay = relayed(plan.protocol);
        if relay && !frontend.routes.is_empty() {
            let name = route_chain_name(frontend, plan);
            if !made.contains(&name) {
                made.push(name.clone());
                chains.push(Operation::add_chain(&name, None));
                for route in &frontend.routes {
                    let Some(&port) = ports.get(&(key.clone(), route.endpoints)) else { continue };
                    let mut statements = Vec::with_capacity(3);
                    statements.extend(source_match(&route.sources).map(Statement::Match));
                    statements.push(Statement::Match(Match::Compare {
                        left: Expr::L4Proto,
                        op: CmpOp::Eq,
                        right: Value::Protocol(plan.protocol.number()),
                    }));
                    statements.push(Statement::SetMarkBits(RELAYED_MARK));
                    statements.push(Statement::Dnat { address: relay_address, port: Some(port) });
                    chains.push(Operation::add_rule(&name, statements));
                }
            }
            elements.push(Operation::AddElement(Element {
                set: dispatch.to_owned(),
                key: frontend_key.clone(),
                value: Some(ElementValue::Verdict(Verdict::Goto(name))),
                comment: None,
            }));
        }
        let refuse = |refusal: Refusal| {
            Verdict::Goto(
                match refusal {
                    Refusal::TcpReset => REJECT_WITH_RESET,
                    Refusal::IcmpPortUnreachable => REJECT_WITH_ICMP,
                }
                .to_owned(),
            )
        };
        let unrouted = match frontend.unrouted {
            // A protocol the relay does not speak is refused, never black-holed.
            _ if !relay => Some(refuse(plan.refusal)),
            Unrouted::Reject => Some(refuse(plan.refusal)),
            Unrouted::Drop => Some(Verdict::Drop),
            Unrouted::Unreachable => None,
        };
        if let Some(verdict) = unrouted {
            elements.push(Operation::AddElement(Element {
                set: no_endpoint.to_owned(),
                key: frontend_key.clone(),
                value: Some(ElementValue::Verdict(verdict)),
                comment: None,
            }));
        }
        if !frontend.allowed_sources.is_empty()
            && let Destination::Address(_) = frontend.destination
        {
            let name = format!("firewall-{}", port_base(&plan.name));
            if !made.contains(&name) {
                made.push(name.clone());
                chains.push(Operation::add_chain(&name, None));
                chains.push(Operation::add_rule(
                    &name,
                    vec![
                        Statement::Match(Match::InPrefixes {
                            left: Expr::SourceAddress,
                            negate: true,
                            prefixes: frontend.allowed_sources.clone(),
                        }),
                        Statement::Verdict(Verdict::Drop),
                    ],
                ));
            }
            elements.push(Operation::AddElement(Element {
                set: FIREWALL_IPS.to_owned(),
                key: frontend_key,
                value: Some(ElementValue::Verdict(Verdict::Goto(name))),
                comment: None,
            }));
        }
    }
}

/// The whole table of `family`, replacing what is there in one transaction. Service ports
/// whose listeners are missing from `ports` only get their refusals and drops.
pub fn render_family(
    plan: &NodePlan,
    family: IpFamily,
    relay_address: Option<IpAddr>,
    ports: &ListenerPorts,
) -> Transaction {
    let mut operations = base_operations(family, plan);
    let mut chains = Vec::new();
    let mut elements = Vec::new();
    for (key, port_plan) in plan.service_ports.iter().filter(|(key, _)| key.family == family) {
        // Without an address to relay on, a port's routes have no target: only its
        // refusals are written (the sync reports why).
        let address = relay_address.unwrap_or(match family {
            IpFamily::V4 => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            IpFamily::V6 => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        });
        let ports = if relay_address.is_some() { ports } else { &ListenerPorts::new() };
        port_operations(key, port_plan, address, ports, &mut chains, &mut elements);
    }
    if let Some(address) = relay_address {
        for ((key, _), port) in ports.iter().filter(|((key, _), _)| key.family == family) {
            let Some(plan) = plan.service_ports.get(key) else { continue };
            operations.push(Operation::AddElement(Element {
                set: RELAY_LISTENERS.to_owned(),
                key: vec![Value::Address(address), Value::Protocol(plan.protocol.number()), Value::Port(*port)],
                value: None,
                comment: None,
            }));
        }
    }
    operations.extend(chains);
    operations.extend(elements);
    Transaction { table: table_name(family), operations }
}

#[cfg(test)]
mod tests {
    use super::*;
    use svcplane_core::{
        Change, ClusterState, Endpoint, EndpointPort, EndpointSlice, NamespacedName, NodeConfig, NodePortAddresses,
        Service, ServicePort,
    };
    use svcplane_nft::{FakeNftables, Nftables};

    const NODE: &str = "198.18.0.11";

    fn plan(protocol: Protocol, endpoints: &[&str]) -> NodePlan {
        let mut state = ClusterState::new();
        let name = NamespacedName::new("default", "web");
        state.apply(Change::ServiceUpserted(Service::cluster_ip(
            name.clone(),
            vec!["198.19.0.10".parse().unwrap()],
            vec![ServicePort { name: "http".into(), protocol, port: 80, node_port: None }],
        )));
        state.apply(Change::SliceUpserted(EndpointSlice {
            last_change_trigger: None,
            name: NamespacedName::new("default", "web-abc"),
            service: name,
            family: IpFamily::V4,
            ports: vec![EndpointPort { name: "http".into(), protocol, port: 8080 }],
            endpoints: endpoints.iter().map(|ip| Endpoint::ready(ip.parse().unwrap(), Some("node1"))).collect(),
        }));
        NodePlan::build(
            &state,
            NodeConfig {
                node_name: "node1".into(),
                node_ips: vec![NODE.parse().unwrap()],
                cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
                node_port_addresses: NodePortAddresses::AllLocal,
            },
        )
    }

    /// Renders the IPv4 table with a listener on `port` for every used set, and applies it
    /// to the fake kernel, which refuses what the kernel would.
    fn applied(plan: &NodePlan, port: u16) -> FakeNftables {
        let mut ports = ListenerPorts::new();
        for (key, port_plan) in &plan.service_ports {
            for set in used_sets(port_plan) {
                ports.insert((key.clone(), set), port);
            }
        }
        let mut nft = FakeNftables::new();
        nft.apply(&render_family(plan, IpFamily::V4, Some(NODE.parse().unwrap()), &ports)).expect("a valid table");
        // A second sync replaces the table whole.
        nft.apply(&render_family(plan, IpFamily::V4, Some(NODE.parse().unwrap()), &ports)).expect("a resync");
        nft
    }

    #[test]
    fn every_route_marks_the_packet_and_dnats_it_to_its_listener_on_the_node_address() {
        let plan = plan(Protocol::Tcp, &["198.18.129.2", "198.18.130.2"]);
        let nft = applied(&plan, 40_000);
        let table = nft.table(&table_name(IpFamily::V4)).expect("the table");
        let chain = "internal-default/web/tcp/http";
        let rules = table.rules(chain).unwrap_or_else(|| panic!("{chain} in {}", nft.dump()));
        // The plan's two ClusterIP routes (off-cluster sources first), both to the cluster set.
        assert_eq!(rules.len(), 2);
        for rule in rules {
            let tail = &rule.statements[rule.statements.len() - 2..];
            assert_eq!(
                tail,
                [
                    Statement::SetMarkBits(RELAYED_MARK),
                    Statement::Dnat { address: NODE.parse().unwrap(), port: Some(40_000) }
                ]
            );
        }
        let key = [Value::Address(NODE.parse().unwrap()), Value::Protocol(6), Value::Port(40_000)];
        assert!(table.element(RELAY_LISTENERS, &key).is_some(), "the listener is guarded");
        let frontend = [Value::Address("198.19.0.10".parse().unwrap()), Value::Protocol(6), Value::Port(80)];
        assert!(table.element(SERVICE_IPS, &frontend).is_some(), "the ClusterIP dispatches to its chain");
        assert!(table.element(NO_ENDPOINT_SERVICES, &frontend).is_none(), "and is not refused");
    }

    #[test]
    fn a_service_without_endpoints_is_refused_in_the_kernel_and_gets_no_listener() {
        let plan = plan(Protocol::Tcp, &[]);
        assert!(plan.service_ports.values().all(|p| used_sets(p).is_empty()));
        let nft = applied(&plan, 40_000);
        let table = nft.table(&table_name(IpFamily::V4)).expect("the table");
        let frontend = [Value::Address("198.19.0.10".parse().unwrap()), Value::Protocol(6), Value::Port(80)];
        let refused = table.element(NO_ENDPOINT_SERVICES, &frontend).expect("a refusal");
        assert_eq!(refused.value, Some(ElementValue::Verdict(Verdict::Goto(REJECT_WITH_RESET.to_owned()))));
        assert!(table.element(SERVICE_IPS, &frontend).is_none());
        assert!(table.elements(RELAY_LISTENERS).unwrap_or_default().is_empty());
    }

    #[test]
    fn an_sctp_port_is_refused_even_with_endpoints_since_the_relay_does_not_speak_it() {
        let plan = plan(Protocol::Sctp, &["198.18.129.2"]);
        let nft = applied(&plan, 40_000);
        let table = nft.table(&table_name(IpFamily::V4)).expect("the table");
        let frontend = [Value::Address("198.19.0.10".parse().unwrap()), Value::Protocol(132), Value::Port(80)];
        assert!(table.element(SERVICE_IPS, &frontend).is_none(), "no route to a listener");
        let refused = table.element(NO_ENDPOINT_SERVICES, &frontend).expect("a refusal");
        assert_eq!(refused.value, Some(ElementValue::Verdict(Verdict::Goto(REJECT_WITH_ICMP.to_owned()))));
    }
}
