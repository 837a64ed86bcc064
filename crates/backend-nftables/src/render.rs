//! Plan -> nftables objects. Pure: the same plan always renders the same objects.
//!
//! Shape (one table per family, or several with the service ports spread over them by a
//! hash of their names, each a complete copy of the shape; all linear in the number of services; see
//! `docs/backend-nftables.md`): named verdict maps dispatch on destination, one chain per
//! endpoint set holds a cascade of `numgen random mod k == 0` DNAT rules (no anonymous
//! sets or maps per service: the kernel charges those quadratically), and rejects/drops for
//! unrouted traffic live in filter-hook maps that only see packets nothing DNATed.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use svcplane_core::{
    Destination, EndpointSetKind, Frontend, FrontendKind, IpFamily, NodePlan, Refusal, Route, ServicePortName,
    ServicePortPlan, SourceMatch, Unrouted,
};
use svcplane_nft::{
    ChainType, CmpOp, DataType, Element, ElementValue, Expr, Family, FibAddress, Hook, Match, Operation, RejectKind,
    Rule, Set, Statement, TableName, Value, Verdict,
};

use crate::names::service_object;

/// The table svcplane owns in each family. Nothing outside it is ever touched.
pub const TABLE: &str = "svcplane";
/// The packet mark bit that asks for masquerade in postrouting (kube-proxy's default bit 14).
pub const MASQUERADE_MARK: u32 = 0x4000;

pub const SERVICE_IPS: &str = "service-ips";
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
pub const FIREWALL_IPS: &str = "firewall-ips";
pub const HAIRPIN_ENDPOINTS: &str = "hairpin-endpoints";
pub const NODEPORT_ADDRESSES: &str = "nodeport-addresses";
/// Where `Refusal::TcpReset` ports go: a reset for TCP (ICMP for anything else reaching it).
const REJECT_WITH_RESET: &str = "reject-with-reset";
/// Where `Refusal::IcmpPortUnreachable` ports go.
const REJECT_WITH_ICMP: &str = "reject-with-icmp";

/// The first table of a family; also the only one while the plan is small.
pub fn table_name(family: IpFamily) -> TableName {
    tables_table_name(family, 0)
}

/// The table number `index` of a family: `svcplane`, then `svcplane-1`, `svcplane-2`, …
pub fn tables_table_name(family: IpFamily, index: usize) -> TableName {
    let name = if index == 0 { TABLE.to_owned() } else { format!("{TABLE}-{index}") };
    TableName { family: nft_family(family), name }
}

/// Whether `name` is one of the tables [`tables_table_name`] names.
pub fn is_svcplane_table(name: &str) -> bool {
    name == TABLE
        || name
            .strip_prefix(TABLE)
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|index| index.parse::<usize>().ok())
            .is_some_and(|index| {
                (1..MAX_TABLES).contains(&index) && name == tables_table_name(IpFamily::V4, index).name
            })
}

/// The most tables a family is spread over.
pub const MAX_TABLES: usize = 64;

/// How many service ports one table is sized for. The kernel re-validates a whole table
/// (every chain its base chains reach) on each commit that adds a DNAT rule or a verdict
/// map element, so a one-endpoint change costs in proportion to the table it lands in
/// (~13 µs per service port on this machine): spreading the ports over tables of about
/// this size keeps a change near a millisecond or two instead of 100 ms at 10k ports.
pub const SERVICE_PORTS_PER_TABLE: usize = 1000;

/// How many tables a family with `service_ports` ports is spread over: a power of two, so
/// that doubling it moves only the ports whose hash has the new bit.
pub fn tables_for(service_ports: usize) -> usize {
    service_ports.div_ceil(SERVICE_PORTS_PER_TABLE).next_power_of_two().clamp(1, MAX_TABLES)
}

/// Which of `tables` tables a service port's objects live in: a hash of its name, the
/// same in every process and for both families.
pub fn table_index(name: &ServicePortName, tables: usize) -> usize {
    if tables <= 1 {
        return 0;
    }
    // FNV-1a: stable across processes and releases (the std hasher is not).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.to_string().bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % tables as u64) as usize
}

pub fn nft_family(family: IpFamily) -> Family {
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

/// The objects one service port owns in one family's table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PortObjects {
    /// Chains with their complete rule lists, in the order they must be created.
    pub chains: Vec<(String, Vec<Rule>)>,
    /// Elements of the shared maps that point at those chains (or reject/drop).
    pub elements: Vec<Element>,
    /// Endpoint addresses that need hairpin masquerade.
    pub endpoint_addresses: Vec<IpAddr>,
    /// Sets the chains use (session affinity), created before and deleted after them.
    pub sets: Vec<Set>,
}

fn dispatch_keys() -> Vec<Expr> {
    vec![Expr::DestinationAddress, Expr::L4Proto, Expr::DestinationPort]
}

/// Matches a destination where NodePorts answer: a local address inside the node-port
/// CIDRs and outside the plan's exclusions.
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

/// The fixed part of a family's table: maps, hooks and the rules that dispatch into them.
pub fn base_operations(family: IpFamily, plan: &NodePlan) -> Vec<Operation> {
    let addr = address_type(family);
    let mut ops = vec![Operation::AddTable { comment: Some("rules for svcplane".to_owned()) }];
    ops.push(Operation::AddSet(crate::digest::set()));
    ops.push(Operation::add_verdict_map(SERVICE_IPS, vec![addr, DataType::InetProto, DataType::InetService]));
    ops.push(Operation::add_verdict_map(SERVICE_NODEPORTS, vec![DataType::InetProto, DataType::InetService]));
    ops.push(Operation::add_verdict_map(NO_ENDPOINT_SERVICES, vec![addr, DataType::InetProto, DataType::InetService]));
    ops.push(Operation::add_verdict_map(NO_ENDPOINT_NODEPORTS, vec![DataType::InetProto, DataType::InetService]));
    ops.push(Operation::add_verdict_map(FIREWALL_IPS, vec![addr, DataType::InetProto, DataType::InetService]));
    ops.push(Operation::AddSet(Set {
        name: HAIRPIN_ENDPOINTS.to_owned(),
        key: vec![addr, addr],
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

    // Regular chains before the rules that jump to them.
    for name in [
        "services",
        "masquerading",
        "firewall-check",
        "service-endpoints-check",
        "nodeport-endpoints-check",
        REJECT_WITH_RESET,
        REJECT_WITH_ICMP,
    ] {
        ops.push(Operation::add_chain(name, None));
    }
    ops.push(Operation::add_chain("nat-prerouting", Some((ChainType::Nat, Hook::Prerouting, -100))));
    ops.push(Operation::add_chain("nat-output", Some((ChainType::Nat, Hook::Output, -100))));
    ops.push(Operation::add_chain("nat-postrouting", Some((ChainType::Nat, Hook::Postrouting, 100))));
    ops.push(Operation::add_chain("filter-prerouting-pre-dnat", Some((ChainType::Filter, Hook::Prerouting, -110))));
    ops.push(Operation::add_chain("filter-output-pre-dnat", Some((ChainType::Filter, Hook::Output, -110))));
    ops.push(Operation::add_chain("filter-input", Some((ChainType::Filter, Hook::Input, 0))));
    ops.push(Operation::add_chain("filter-forward", Some((ChainType::Filter, Hook::Forward, 0))));
    ops.push(Operation::add_chain("filter-output", Some((ChainType::Filter, Hook::Output, 0))));

    let new = || Statement::Match(Match::CtStateNew);
    ops.push(Operation::add_rule("nat-prerouting", vec![Statement::jump("services")]));
    ops.push(Operation::add_rule("nat-output", vec![Statement::jump("services")]));
    ops.push(Operation::add_rule("nat-postrouting", vec![Statement::jump("masquerading")]));
    ops.push(Operation::add_rule("filter-prerouting-pre-dnat", vec![new(), Statement::jump("firewall-check")]));
    ops.push(Operation::add_rule("filter-output-pre-dnat", vec![new(), Statement::jump("firewall-check")]));
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
    // `reject` is not a verdict a map can hold, hence a chain per way of refusing (the
    // plan says which a port uses). A reset needs a TCP packet to answer.
    ops.push(Operation::add_rule(
        REJECT_WITH_RESET,
        vec![
            Statement::Match(Match::Compare { left: Expr::L4Proto, op: CmpOp::Eq, right: Value::Protocol(6) }),
            Statement::Reject(RejectKind::TcpReset),
        ],
    ));
    ops.push(Operation::add_rule(REJECT_WITH_RESET, vec![Statement::Reject(RejectKind::PortUnreachable)]));
    ops.push(Operation::add_rule(REJECT_WITH_ICMP, vec![Statement::Reject(RejectKind::PortUnreachable)]));

    // Hairpin: the endpoints of ports whose plan says `masquerade_hairpin` are in the set.
    ops.push(Operation::add_rule(
        "masquerading",
        vec![
            Statement::Match(Match::InSet {
                keys: vec![Expr::SourceAddress, Expr::DestinationAddress],
                negate: false,
                set: HAIRPIN_ENDPOINTS.to_owned(),
            }),
            Statement::SetMarkBits(MASQUERADE_MARK),
        ],
    ));
    ops.push(Operation::add_rule(
        "masquerading",
        vec![
            Statement::Match(Match::MarkMasked { mask: MASQUERADE_MARK, op: CmpOp::Eq, value: 0 }),
            Statement::Verdict(Verdict::Return),
        ],
    ));
    // Clear the bit so a packet that passes postrouting twice (tunnels) is not re-masqueraded.
    ops.push(Operation::add_rule("masquerading", vec![Statement::ToggleMarkBits(MASQUERADE_MARK)]));
    ops.push(Operation::add_rule("masquerading", vec![Statement::Masquerade { fully_random: true }]));
    ops
}

fn protocol_number(plan: &ServicePortPlan) -> u8 {
    plan.protocol.number()
}

fn endpoint_chain_name(plan: &ServicePortPlan, set: EndpointSetKind) -> String {
    match set {
        EndpointSetKind::Cluster => service_object("service", &plan.name),
        EndpointSetKind::Local => service_object("local", &plan.name),
    }
}

/// A cascade that picks each of `n` endpoints with probability 1/n: rule `i` matches with
/// probability 1/(n-i) given that no earlier rule did; the last one always matches.
///
/// With ClientIP affinity, each endpoint also has a dynamic set of the clients it served
/// recently: a client found in one goes straight back to that endpoint, and every pick
/// (re)records the client in the chosen endpoint's set.
fn endpoint_chain_rules(chain: &str, plan: &ServicePortPlan, set: EndpointSetKind) -> (Vec<Rule>, Vec<Set>) {
    let endpoints = plan.endpoints(set);
    let count = endpoints.len();
    let l4proto = || {
        Statement::Match(Match::Compare {
            left: Expr::L4Proto,
            op: CmpOp::Eq,
            right: Value::Protocol(protocol_number(plan)),
        })
    };
    let dnat = |endpoint: &SocketAddr| Statement::Dnat { address: endpoint.ip(), port: Some(endpoint.port()) };
    let mut rules = Vec::with_capacity(if plan.affinity.is_some() { 2 * count } else { count });
    let mut sets = Vec::new();
    if let Some(affinity) = plan.affinity {
        for endpoint in endpoints {
            let set_name = affinity_set_name(plan, endpoint);
            sets.push(Set {
                name: set_name.clone(),
                key: vec![address_type(plan.family)],
                value: None,
                interval: false,
                dynamic_timeout: Some(affinity.timeout),
                comment: None,
            });
            // Each new connection of a known client renews its entry, so affinity lasts
            // until the client has been quiet for the timeout.
            rules.push(Rule {
                chain: chain.to_owned(),
                statements: vec![
                    Statement::Match(Match::InSet {
                        keys: vec![Expr::SourceAddress],
                        negate: false,
                        set: set_name.clone(),
                    }),
                    l4proto(),
                    Statement::UpdateSet { keys: vec![Expr::SourceAddress], set: set_name },
                    Statement::Counter,
                    dnat(endpoint),
                ],
                comment: None,
            });
        }
    }
    for (index, endpoint) in endpoints.iter().enumerate() {
        let mut statements = Vec::with_capacity(5);
        let remaining = count - index;
        if remaining > 1 {
            statements.push(Statement::Match(Match::Compare {
                left: Expr::RandomModulo(remaining as u32),
                op: CmpOp::Eq,
                right: Value::Integer(0),
            }));
        }
        statements.push(l4proto());
        if plan.affinity.is_some() {
            statements
                .push(Statement::UpdateSet { keys: vec![Expr::SourceAddress], set: affinity_set_name(plan, endpoint) });
        }
        // Per-endpoint connection counters (read by the `counters` module): NAT sees each new connection once.
        statements.push(Statement::Counter);
        statements.push(dnat(endpoint));
        rules.push(Rule { chain: chain.to_owned(), statements, comment: None });
    }
    (rules, sets)
}

/// `affinity-<hash>-ns/svc/proto/port__<ip>/<port>`, with IPv6 colons as dots (nft names
/// cannot hold colons).
fn affinity_set_name(plan: &ServicePortPlan, endpoint: &SocketAddr) -> String {
    let ip = endpoint.ip().to_string().replace(':', ".");
    format!("{}__{ip}/{}", service_object("affinity", &plan.name), endpoint.port())
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

fn route_rule(chain: &str, route: &Route, plan: &ServicePortPlan) -> Rule {
    let mut statements = Vec::with_capacity(3);
    if let Some(condition) = source_match(&route.sources) {
        statements.push(Statement::Match(condition));
    }
    if route.masquerade {
        statements.push(Statement::SetMarkBits(MASQUERADE_MARK));
    }
    statements.push(Statement::Verdict(Verdict::Goto(endpoint_chain_name(plan, route.endpoints))));
    Rule { chain: chain.to_owned(), statements, comment: None }
}

/// A frontend whose only route takes everyone, unmasqueraded, can point straight at the
/// endpoint chain; anything else needs a chain of its own for the route rules.
fn direct_target(frontend: &Frontend, plan: &ServicePortPlan) -> Option<String> {
    match frontend.routes.as_slice() {
        [Route { sources: SourceMatch::Any, masquerade: false, endpoints }] => {
            Some(endpoint_chain_name(plan, *endpoints))
        }
        _ => None,
    }
}

fn frontend_key(frontend: &Frontend, family: IpFamily, plan: &ServicePortPlan) -> Vec<Value> {
    let proto = Value::Protocol(protocol_number(plan));
    match frontend.destination {
        Destination::Address(address) => {
            debug_assert_eq!(IpFamily::of(&address), family);
            vec![Value::Address(address), proto, Value::Port(frontend.port)]
        }
        Destination::NodePortAddresses => vec![proto, Value::Port(frontend.port)],
    }
}

fn dispatch_map(frontend: &Frontend) -> (&'static str, &'static str) {
    match frontend.destination {
        Destination::Address(_) => (SERVICE_IPS, NO_ENDPOINT_SERVICES),
        Destination::NodePortAddresses => (SERVICE_NODEPORTS, NO_ENDPOINT_NODEPORTS),
    }
}

/// Frontends of one class share their route list (the core plans them that way), so they
/// share one chain: `internal-…` for ClusterIPs, `external-…` for the rest.
fn route_chain_name(frontend: &Frontend, plan: &ServicePortPlan) -> String {
    match frontend.kind {
        FrontendKind::ClusterIp => service_object("internal", &plan.name),
        FrontendKind::NodePort | FrontendKind::ExternalIp | FrontendKind::LoadBalancer => {
            service_object("external", &plan.name)
        }
    }
}

/// [`render_port`] with or without the per-endpoint `counter` statements: counting costs a
/// little per new connection (docs/benchmarks.md), and an operator may turn it off.
pub fn render_port_counting(plan: &ServicePortPlan, counting: bool) -> PortObjects {
    let mut objects = render_port(plan);
    if !counting {
        for (_, rules) in &mut objects.chains {
            for rule in rules {
                rule.statements.retain(|statement| !matches!(statement, Statement::Counter));
            }
        }
    }
    objects
}

/// Everything one service port owns in its family's table.
pub fn render_port(plan: &ServicePortPlan) -> PortObjects {
    let family = plan.family;
    let mut objects = PortObjects::default();
    let mut used_sets: Vec<EndpointSetKind> = Vec::new();
    for frontend in &plan.frontends {
        for route in &frontend.routes {
            if !used_sets.contains(&route.endpoints) {
                used_sets.push(route.endpoints);
            }
        }
    }
    used_sets.sort();
    for set in used_sets {
        let name = endpoint_chain_name(plan, set);
        let (rules, sets) = endpoint_chain_rules(&name, plan, set);
        objects.chains.push((name, rules));
        for set in sets {
            // Cluster and Local chains share an endpoint's affinity set.
            if !objects.sets.iter().any(|known| known.name == set.name) {
                objects.sets.push(set);
            }
        }
        if plan.masquerade_hairpin {
            objects.endpoint_addresses.extend(plan.endpoints(set).iter().map(SocketAddr::ip));
        }
    }
    objects.endpoint_addresses.sort();
    objects.endpoint_addresses.dedup();

    for frontend in &plan.frontends {
        let key = frontend_key(frontend, family, plan);
        let (dispatch, no_endpoint) = dispatch_map(frontend);
        if !frontend.routes.is_empty() {
            let target = match direct_target(frontend, plan) {
                Some(target) => target,
                None => {
                    let name = route_chain_name(frontend, plan);
                    if !objects.chains.iter().any(|(existing, _)| *existing == name) {
                        let rules = frontend.routes.iter().map(|route| route_rule(&name, route, plan)).collect();
                        objects.chains.push((name.clone(), rules));
                    }
                    name
                }
            };
            objects.elements.push(Element {
                set: dispatch.to_owned(),
                key: key.clone(),
                value: Some(ElementValue::Verdict(Verdict::Goto(target))),
                comment: None,
            });
        }
        let unrouted = match frontend.unrouted {
            Unrouted::Reject => Some(Verdict::Goto(
                match plan.refusal {
                    Refusal::TcpReset => REJECT_WITH_RESET,
                    Refusal::IcmpPortUnreachable => REJECT_WITH_ICMP,
                }
                .to_owned(),
            )),
            Unrouted::Drop => Some(Verdict::Drop),
            Unrouted::Unreachable => None,
        };
        if let Some(verdict) = unrouted {
            objects.elements.push(Element {
                set: no_endpoint.to_owned(),
                key: key.clone(),
                value: Some(ElementValue::Verdict(verdict)),
                comment: None,
            });
        }
        if !frontend.allowed_sources.is_empty()
            && let Destination::Address(_) = frontend.destination
        {
            let name = service_object("firewall", &plan.name);
            if !objects.chains.iter().any(|(existing, _)| *existing == name) {
                let rules = vec![Rule {
                    chain: name.clone(),
                    statements: vec![
                        Statement::Match(Match::InPrefixes {
                            left: Expr::SourceAddress,
                            negate: true,
                            prefixes: frontend.allowed_sources.clone(),
                        }),
                        Statement::Verdict(Verdict::Drop),
                    ],
                    comment: None,
                }];
                objects.chains.push((name.clone(), rules));
            }
            objects.elements.push(Element {
                set: FIREWALL_IPS.to_owned(),
                key,
                value: Some(ElementValue::Verdict(Verdict::Goto(name))),
                comment: None,
            });
        }
    }
    objects
}

/// The hairpin element for one endpoint address: source and destination both the endpoint.
pub fn hairpin_element(address: IpAddr) -> Element {
    Element {
        set: HAIRPIN_ENDPOINTS.to_owned(),
        key: vec![Value::Address(address), Value::Address(address)],
        value: None,
        comment: None,
    }
}
