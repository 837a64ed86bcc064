//! The iptables rules IPVS mode needs beside IPVS, and the ipsets they match through, as
//! upstream lays them out: the rules do not grow with the Services, the sets do.
//!
//! The nat table of each family: `KUBE-SERVICES` (from `PREROUTING` and `OUTPUT`) marks
//! the traffic the plan says to masquerade, `KUBE-MARK-MASQ` sets the mark, and
//! `KUBE-POSTROUTING` masquerades marked packets after IPVS has rewritten their
//! destination (which needs `net.ipv4.vs.conntrack=1`, so IPVS connections are tracked),
//! and the hairpin packets of `KUBE-LOOP-BACK`.
//!
//! Frontends are grouped by what the plan's routes say, with the endpoint sets left out:
//! the list of (sources, masquerade) in the plan's order. Each group is one set of
//! frontends (`address,protocol:port`, or the port alone in upstream's `bitmap:port`
//! NodePort sets), and the group's routes are written once, matching the set: a
//! masquerading route jumps to `KUBE-MARK-MASQ`, any other returns, so the first route
//! whose sources match decides. The usual groups have upstream's names (`KUBE-CLUSTER-IP`,
//! `KUBE-EXTERNAL-IP`, `KUBE-EXTERNAL-IP-LOCAL`, `KUBE-LOAD-BALANCER`,
//! `KUBE-LOAD-BALANCER-LOCAL`, `KUBE-NODE-PORT-TCP`, `KUBE-NODE-PORT-LOCAL-TCP`, ...,
//! `KUBE-6-...` for IPv6); a group the plan makes that upstream's layout has no name for
//! gets a set of its own (`KUBE-N-<hash>`), so no plan decision is lost.
//!
//! The filter table's `KUBE-SERVICES` (from `INPUT` and `OUTPUT`) decides what IPVS cannot:
//! `loadBalancerSourceRanges` (upstream's `KUBE-LOAD-BALANCER-FW` and
//! `KUBE-LOAD-BALANCER-SOURCE-CIDR`), and per group of frontends that not every source
//! reaches (no endpoints, endpoint sets empty on this node) the drops and refusals the
//! plan says (`KUBE-REJECT-<PROTO>`, `KUBE-DROP-<PROTO>`, `KUBE-F-<hash>`: upstream has no
//! such rules).

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

use svcplane_core::{
    Destination as PlanDestination, FrontendKind, IpFamily, NodePlan, Protocol, Route, ServicePortPlan, SourceMatch,
    Unrouted,
};
use svcplane_iptables::{Family, MarkOp, Match, RejectWith, RestoreTable, Rule, Table, Target};

use crate::fwmark;
use crate::ipset::{self, IpSet, SetType};

pub const SERVICES: &str = "KUBE-SERVICES";
pub const MARK_MASQ: &str = "KUBE-MARK-MASQ";
pub const POSTROUTING: &str = "KUBE-POSTROUTING";
/// kube-proxy's masquerade mark bit (`--masquerade-bit 14`).
pub const MASQ_MARK: u32 = 0x4000;

/// The hooks into the built-in chains: (built-in chain, our chain).
pub const HOOKS: &[(&str, &str)] = &[("PREROUTING", SERVICES), ("OUTPUT", SERVICES), ("POSTROUTING", POSTROUTING)];

/// The sets upstream names, created in every family whether used or not (as upstream).
const NAMED_SETS: &[(&str, SetType)] = &[
    ("LOOP-BACK", SetType::HashIpPortIp),
    ("CLUSTER-IP", SetType::HashIpPort),
    ("EXTERNAL-IP", SetType::HashIpPort),
    ("EXTERNAL-IP-LOCAL", SetType::HashIpPort),
    ("LOAD-BALANCER", SetType::HashIpPort),
    ("LOAD-BALANCER-LOCAL", SetType::HashIpPort),
    ("LOAD-BALANCER-FW", SetType::HashIpPort),
    ("LOAD-BALANCER-SOURCE-CIDR", SetType::HashIpPortNet),
    ("NODE-PORT-TCP", SetType::BitmapPort),
    ("NODE-PORT-LOCAL-TCP", SetType::BitmapPort),
    ("NODE-PORT-UDP", SetType::BitmapPort),
    ("NODE-PORT-LOCAL-UDP", SetType::BitmapPort),
    ("NODE-PORT-SCTP-HASH", SetType::HashIpPort),
    ("NODE-PORT-LOCAL-SCTP-HASH", SetType::HashIpPort),
];

/// Prefixes (after `KUBE-` or `KUBE-6-`) of the sets this mode names itself.
const OWN_SET_PREFIXES: &[&str] = &["N-", "F-", "REJECT-", "DROP-", "NETS-"];

/// Whether `name` is a set this mode writes (and so may destroy).
pub fn is_our_set(name: &str) -> bool {
    [IpFamily::V4, IpFamily::V6].into_iter().any(|family| {
        NAMED_SETS.iter().any(|(base, _)| ipset::set_name(family, base) == name)
            || OWN_SET_PREFIXES.iter().any(|prefix| {
                let stem = ipset::set_name(family, prefix);
                name.starts_with(&stem)
            })
    })
}

pub fn family_of(family: IpFamily) -> Family {
    match family {
        IpFamily::V4 => Family::V4,
        IpFamily::V6 => Family::V6,
    }
}

/// What one family needs: both tables' chains (declared, so written whole; the hooks are
/// added by the caller where missing) and the sets they match through.
#[derive(Debug, Clone)]
pub struct FamilyRules {
    pub nat: RestoreTable,
    pub filter: RestoreTable,
    pub sets: BTreeMap<String, IpSet>,
}

/// A frontend's routes as the nat table sees them: (sources, masquerade), in order, ended
/// by a route for any source (a frontend with no catch-all route leaves the rest alone,
/// which is what returning does).
type NatShape = Vec<(SourceMatch, bool)>;

fn nat_shape(routes: &[Route]) -> NatShape {
    let mut shape: NatShape = routes.iter().map(|route| (route.sources.clone(), route.masquerade)).collect();
    if shape.last().is_none_or(|(sources, _)| *sources != SourceMatch::Any) {
        shape.push((SourceMatch::Any, false));
    }
    shape
}

/// A frontend's routes as the filter table sees them: (sources, endpoint set empty here),
/// then what no route takes.
type FilterShape = (Protocol, Vec<(SourceMatch, bool)>, Unrouted);

/// A stable short hash (sets and chains are named by it across restarts).
fn short_hash(value: &impl Hash) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut hasher);
    format!("{:012X}", hasher.finish() & 0xFFFF_FFFF_FFFF)
}

/// How frontends of one group are matched: a set of `address,protocol:port`, or of ports
/// on any local address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Matching {
    IpPort,
    LocalPort(Protocol),
}

/// A group of frontends in one set, and the routes written for it.
struct Group<S> {
    shape: S,
    matching: Matching,
}

/// The spelling of one family.
struct Builder<'a> {
    family: IpFamily,
    node_port_addresses: &'a [IpAddr],
    sets: BTreeMap<String, IpSet>,
    nat_groups: BTreeMap<String, Group<NatShape>>,
    filter_groups: BTreeMap<String, Group<FilterShape>>,
}

impl Builder<'_> {
    fn set(&mut self, name: &str, set_type: SetType) -> &mut IpSet {
        self.sets.entry(name.to_owned()).or_insert_with(|| IpSet::new(set_type, self.family))
    }

    /// The addresses a frontend listens on.
    fn addresses(&self, destination: PlanDestination) -> Vec<IpAddr> {
        match destination {
            PlanDestination::Address(address) => vec![address],
            PlanDestination::NodePortAddresses => self.node_port_addresses.to_vec(),
        }
    }

    /// Adds a frontend to `name` (`matching` as the set is), every address of it.
    fn add_members(
        &mut self,
        name: &str,
        matching: Matching,
        port: &ServicePortPlan,
        frontend_port: u16,
        at: PlanDestination,
    ) {
        let addresses = self.addresses(at);
        match matching {
            Matching::LocalPort(_) => {
                self.set(name, SetType::BitmapPort).members.insert(frontend_port.to_string());
            }
            Matching::IpPort => {
                let set = self.set(name, SetType::HashIpPort);
                for address in addresses {
                    set.members.insert(ipset::ip_port(address, port.protocol, frontend_port));
                }
            }
        }
    }

    /// The rules matching `sources` on top of `base`: none when nothing can match.
    fn with_sources(&mut self, base: Rule, sources: &SourceMatch) -> Vec<Rule> {
        let of_family = |cidrs: &[ipnet::IpNet]| -> Vec<ipnet::IpNet> {
            cidrs.iter().copied().filter(|cidr| IpFamily::of(&cidr.addr()) == self.family).collect()
        };
        match sources {
            SourceMatch::Any => vec![base],
            SourceMatch::ThisNode => vec![base.source_is_local()],
            SourceMatch::Inside(cidrs) => match of_family(cidrs).as_slice() {
                [] => Vec::new(),
                [cidr] => vec![base.source(*cidr)],
                several => {
                    let name = self.nets_set(several);
                    vec![base.matching(set_match(&name, false, "src"))]
                }
            },
            SourceMatch::Outside(cidrs) => match of_family(cidrs).as_slice() {
                [] => vec![base],
                [cidr] => vec![base.not_source(*cidr)],
                several => {
                    let name = self.nets_set(several);
                    vec![base.matching(set_match(&name, true, "src"))]
                }
            },
        }
    }

    /// A `hash:net` set of several source ranges.
    fn nets_set(&mut self, cidrs: &[ipnet::IpNet]) -> String {
        let name = ipset::set_name(self.family, &format!("NETS-{}", short_hash(&cidrs)));
        let set = self.set(&name, SetType::HashNet);
        set.members.extend(cidrs.iter().map(|cidr| ipset::net(*cidr)));
        name
    }

    /// The nat set a frontend of `kind` with `shape` goes in: upstream's name for the
    /// usual groups, one of our own when upstream's is taken by another group.
    fn nat_group(&mut self, kind: FrontendKind, protocol: Protocol, shape: NatShape) -> (String, Matching) {
        let plain = shape == [(SourceMatch::Any, true)];
        let local = if plain { "" } else { "-LOCAL" };
        let (base, matching) = match (kind, protocol) {
            (FrontendKind::ClusterIp, _) => ("CLUSTER-IP".to_owned(), Matching::IpPort),
            (FrontendKind::ExternalIp, _) => (format!("EXTERNAL-IP{local}"), Matching::IpPort),
            (FrontendKind::LoadBalancer, _) => (format!("LOAD-BALANCER{local}"), Matching::IpPort),
            (FrontendKind::NodePort, Protocol::Sctp) => (format!("NODE-PORT{local}-SCTP-HASH"), Matching::IpPort),
            (FrontendKind::NodePort, protocol) => {
                (format!("NODE-PORT{local}-{}", protocol.as_str().to_uppercase()), Matching::LocalPort(protocol))
            }
        };
        let name = ipset::set_name(self.family, &base);
        match self.nat_groups.get(&name) {
            Some(group) if group.shape != shape => {
                let own = ipset::set_name(self.family, &format!("N-{}", short_hash(&(kind, protocol, &shape))));
                self.nat_groups.entry(own.clone()).or_insert(Group { shape, matching: Matching::IpPort });
                (own, Matching::IpPort)
            }
            Some(_) => (name, matching),
            None => {
                self.nat_groups.insert(name.clone(), Group { shape, matching });
                (name, matching)
            }
        }
    }

    fn filter_group(&mut self, shape: FilterShape) -> String {
        let (protocol, routes, unrouted) = &shape;
        let proto = protocol.as_str().to_uppercase();
        let base = match (routes.is_empty(), unrouted) {
            (true, Unrouted::Reject) => format!("REJECT-{proto}"),
            (true, Unrouted::Drop | Unrouted::Unreachable) => format!("DROP-{proto}"),
            (false, _) => format!("F-{proto}-{}", short_hash(&shape)),
        };
        let name = ipset::set_name(self.family, &base);
        self.filter_groups.entry(name.clone()).or_insert(Group { shape, matching: Matching::IpPort });
        name
    }
}

/// `-m set [!] --match-set NAME FLAGS`.
fn set_match(name: &str, negate: bool, flags: &str) -> Match {
    let mut options = Vec::new();
    if negate {
        options.push("!".to_owned());
    }
    options.extend(["--match-set".to_owned(), name.to_owned(), flags.to_owned()]);
    Match::Other { module: "set".to_owned(), options }
}

/// The rule head matching a group's set.
fn group_base(name: &str, matching: Matching) -> Rule {
    match matching {
        Matching::IpPort => Rule::new().matching(set_match(name, false, "dst,dst")),
        Matching::LocalPort(protocol) => {
            Rule::new().protocol(protocol).destination_is_local().matching(set_match(name, false, "dst"))
        }
    }
}

/// Both tables and the sets for `family`. NodePorts listen on `node_port_addresses`.
pub fn family_rules(plan: &NodePlan, family: IpFamily, node_port_addresses: &[IpAddr]) -> FamilyRules {
    let mut builder = Builder {
        family,
        node_port_addresses,
        sets: BTreeMap::new(),
        nat_groups: BTreeMap::new(),
        filter_groups: BTreeMap::new(),
    };
    for (base, set_type) in NAMED_SETS {
        builder.set(&ipset::set_name(family, base), *set_type);
    }
    let loop_back = ipset::set_name(family, "LOOP-BACK");
    let firewall = ipset::set_name(family, "LOAD-BALANCER-FW");
    let allowed = ipset::set_name(family, "LOAD-BALANCER-SOURCE-CIDR");
    let marks = fwmark::marks(plan, family, node_port_addresses);
    let mut mark_rules = Vec::new();
    for port in plan.service_ports.values().filter(|port| port.family == family) {
        for frontend in &port.frontends {
            let Some(other) = fwmark::other_set(port, frontend) else { continue };
            for address in builder.addresses(frontend.destination) {
                let key = fwmark::MarkedFrontend { address, protocol: port.protocol, port: frontend.port };
                let Some(mark) = marks.get(&key) else { continue };
                // The first route whose sources match decides: written last to first, so
                // the last rule that sets the bits is the first route's. A route to the
                // catch-all set clears them (the address service takes the packet).
                let mut written = false;
                for route in frontend.routes.iter().rev() {
                    let value = if route.endpoints == other { mark.mark } else { 0 };
                    if value == 0 && !written {
                        continue;
                    }
                    written = true;
                    let base = Rule::new()
                        .protocol(port.protocol)
                        .destination(address)
                        .destination_port(frontend.port)
                        .target(Target::Mark(MarkOp::SetXmark { value, mask: fwmark::MARK_MASK }));
                    mark_rules.extend(builder.with_sources(base, &route.sources));
                }
            }
        }
        // Hairpin: a pod that IPVS sent to itself is masqueraded, or its reply would
        // bypass the node. After IPVS, the packet's source and destination are that
        // endpoint.
        for (set, member) in crate::hairpin::members(port) {
            builder.set(&set, SetType::HashIpPortIp).members.insert(member);
        }
        for frontend in &port.frontends {
            if !frontend.routes.is_empty() {
                let (name, matching) = builder.nat_group(frontend.kind, port.protocol, nat_shape(&frontend.routes));
                builder.add_members(&name, matching, port, frontend.port, frontend.destination);
            }
            if !frontend.allowed_sources.is_empty() {
                let ranges: Vec<ipnet::IpNet> = frontend
                    .allowed_sources
                    .iter()
                    .copied()
                    .filter(|net| IpFamily::of(&net.addr()) == family)
                    .collect();
                // A range of every address allows everything (and a set cannot hold it).
                if !ranges.iter().any(|range| range.prefix_len() == 0) {
                    for address in builder.addresses(frontend.destination) {
                        builder.set(&firewall, SetType::HashIpPort).members.insert(ipset::ip_port(
                            address,
                            port.protocol,
                            frontend.port,
                        ));
                        let set = builder.set(&allowed, SetType::HashIpPortNet);
                        for range in &ranges {
                            set.members.insert(ipset::ip_port_net(address, port.protocol, frontend.port, *range));
                        }
                    }
                }
            }
            let empty = |route: &Route| port.endpoints(route.endpoints).is_empty();
            let every_source_balanced = frontend.routes.iter().any(|route| route.sources == SourceMatch::Any)
                && !frontend.routes.iter().any(empty);
            if !every_source_balanced {
                let routes = frontend.routes.iter().map(|route| (route.sources.clone(), empty(route))).collect();
                let name = builder.filter_group((port.protocol, routes, frontend.unrouted));
                builder.add_members(&name, Matching::IpPort, port, frontend.port, frontend.destination);
            }
        }
    }

    let mut nat = RestoreTable::new(Table::Nat);
    for chain in [SERVICES, MARK_MASQ, POSTROUTING] {
        nat.declare(chain);
    }
    nat.append(MARK_MASQ, Rule::new().target(Target::Mark(MarkOp::Or(MASQ_MARK))));
    nat.append(
        POSTROUTING,
        Rule::new()
            .comment("Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose")
            .matching(set_match(&loop_back, false, "dst,dst,src"))
            .target(Target::Masquerade { random_fully: false }),
    );
    nat.append(
        POSTROUTING,
        Rule::new().matching(Match::Mark { negate: true, value: MASQ_MARK, mask: MASQ_MARK }).target(Target::Return),
    );
    nat.append(POSTROUTING, Rule::new().target(Target::Mark(MarkOp::Xor(MASQ_MARK))));
    nat.append(POSTROUTING, Rule::new().target(Target::Masquerade { random_fully: true }));
    // Firewall marks first: they decide nothing but which virtual service IPVS takes.
    for rule in mark_rules {
        nat.append(SERVICES, rule);
    }
    // Sets of addresses first; ports on any local address last, so a Service address that
    // shares a NodePort's number is decided by its own set.
    let groups = std::mem::take(&mut builder.nat_groups);
    let (by_address, by_port): (Vec<_>, Vec<_>) =
        groups.iter().partition(|(_, group)| group.matching == Matching::IpPort);
    for (name, group) in by_address.into_iter().chain(by_port) {
        for (sources, masquerade) in &group.shape {
            for rule in builder.with_sources(group_base(name, group.matching), sources) {
                nat.append(SERVICES, if *masquerade { rule.jump(MARK_MASQ) } else { rule.target(Target::Return) });
            }
        }
    }

    let mut filter = RestoreTable::new(Table::Filter);
    filter.declare(FILTER);
    filter.append(
        FILTER,
        Rule::new()
            .comment("Kubernetes service load balancer ip + port for load balancer with sourceRange")
            .matching(set_match(&firewall, false, "dst,dst"))
            .matching(set_match(&allowed, true, "dst,dst,src"))
            .target(Target::Drop),
    );
    let groups = std::mem::take(&mut builder.filter_groups);
    for (name, group) in &groups {
        let (protocol, routes, unrouted) = &group.shape;
        let base = || Rule::new().protocol(*protocol).matching(set_match(name, false, "dst,dst"));
        for (sources, empty) in routes {
            for rule in builder.with_sources(base(), sources) {
                filter.append(FILTER, rule.target(if *empty { Target::Drop } else { Target::Return }));
            }
        }
        let unrouted = match unrouted {
            Unrouted::Reject => Target::Reject(Some(reject_with(*protocol, family))),
            Unrouted::Drop | Unrouted::Unreachable => Target::Drop,
        };
        filter.append(FILTER, base().target(unrouted));
    }
    FamilyRules { nat, filter, sets: builder.sets }
}

/// The filter table's chain where what IPVS cannot do is decided: refusing Services
/// without endpoints, dropping what the plan drops, `loadBalancerSourceRanges`.
pub const FILTER: &str = "KUBE-SERVICES";
/// Per frontend with source ranges, in earlier versions: deleted where found.
const SOURCE_RANGES_PREFIX: &str = "KUBE-FW-";

/// The filter table's hooks: traffic to a Service address reaches the node's INPUT (the
/// addresses are local: on `kube-ipvs0`, or the node's for NodePorts) before IPVS takes
/// it, and the node's own traffic its OUTPUT, where a frontend without a virtual service
/// (nothing to balance to) is still seen with its Service address.
pub const FILTER_HOOKS: &[(&str, &str)] = &[("INPUT", FILTER), ("OUTPUT", FILTER)];

/// What a closed port answers: a reset for TCP, ICMP (v6) port unreachable otherwise.
fn reject_with(protocol: Protocol, family: IpFamily) -> RejectWith {
    match (protocol, family) {
        (Protocol::Tcp, _) => RejectWith::TcpReset,
        (_, IpFamily::V4) => RejectWith::IcmpPortUnreachable,
        (_, IpFamily::V6) => RejectWith::Icmp6PortUnreachable,
    }
}

/// Whether `chain` is one this mode writes (or wrote) in the filter table.
pub fn is_filter_chain(chain: &str) -> bool {
    chain == FILTER || chain.starts_with(SOURCE_RANGES_PREFIX)
}

/// A hook rule: `-j CHAIN`.
pub fn hook_rule(chain: &str) -> Rule {
    Rule::new().jump(chain)
}

#[cfg(test)]
pub(crate) mod tests {
    use svcplane_core::{
        Change, ClusterState, Endpoint, EndpointPort, EndpointSlice, NamespacedName, NodeConfig, NodePortAddresses,
        Service, ServicePort, ServiceType, TrafficPolicy,
    };

    use super::*;

    /// node1 at 198.18.0.11, pods in 198.18.128.0/17 (other modules' tests plan for it too).
    pub(crate) fn config() -> NodeConfig {
        NodeConfig {
            node_name: "node1".into(),
            node_ips: vec!["198.18.0.11".parse().unwrap()],
            cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
            node_port_addresses: NodePortAddresses::AllLocal,
        }
    }

    fn web(name: &str, address: &str, node_port: u16, endpoint: &str) -> (Service, EndpointSlice) {
        let mut service = Service::cluster_ip(
            NamespacedName::new("default", name),
            vec![address.parse().unwrap()],
            vec![ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: 80, node_port: Some(node_port) }],
        );
        service.service_type = ServiceType::NodePort;
        let slice = EndpointSlice {
            last_change_trigger: None,
            name: NamespacedName::new("default", format!("{name}-abc")),
            service: NamespacedName::new("default", name),
            family: IpFamily::V4,
            ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
            endpoints: vec![Endpoint::ready(endpoint.parse().unwrap(), Some("node1"))],
        };
        (service, slice)
    }

    fn plan_of(services: Vec<(Service, EndpointSlice)>) -> NodePlan {
        let mut state = ClusterState::new();
        for (service, slice) in services {
            state.apply(Change::ServiceUpserted(service));
            state.apply(Change::SliceUpserted(slice));
        }
        NodePlan::build(&state, config())
    }

    fn members<'a>(rules: &'a FamilyRules, name: &str) -> Vec<&'a str> {
        rules.sets[name].members.iter().map(String::as_str).collect()
    }

    #[test]
    fn frontends_are_set_members_and_the_rules_match_the_sets_once() {
        let node_ip: IpAddr = "198.18.0.11".parse().unwrap();
        let rules =
            family_rules(&plan_of(vec![web("web", "198.19.0.10", 30080, "198.18.128.2")]), IpFamily::V4, &[node_ip]);
        assert_eq!(members(&rules, "KUBE-CLUSTER-IP"), vec!["198.19.0.10,tcp:80"]);
        assert_eq!(members(&rules, "KUBE-NODE-PORT-TCP"), vec!["30080"]);
        assert_eq!(members(&rules, "KUBE-LOOP-BACK"), vec!["198.18.128.2,tcp:8080,198.18.128.2"]);
        assert_eq!(rules.sets["KUBE-NODE-PORT-TCP"].set_type, SetType::BitmapPort);
        assert!(rules.sets.contains_key("KUBE-LOAD-BALANCER-SOURCE-CIDR"), "every upstream set exists");
        let text = rules.nat.render();
        for expected in [
            "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
            "-m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE",
            "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
            "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 198.18.128.0/17 -j KUBE-MARK-MASQ",
            "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN",
            "-m addrtype --dst-type LOCAL -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
        let cluster_ip = text.find("KUBE-CLUSTER-IP dst,dst -j RETURN").unwrap();
        let node_port = text.find("KUBE-NODE-PORT-TCP").unwrap();
        assert!(cluster_ip < node_port, "address sets come before port sets:\n{text}");
        assert!(!text.contains("198.19.0.10"), "no rule names a Service:\n{text}");
    }

    #[test]
    fn the_rule_count_does_not_grow_with_the_services() {
        let one = family_rules(&plan_of(vec![web("a", "198.19.0.10", 30080, "198.18.128.2")]), IpFamily::V4, &[]);
        let three = family_rules(
            &plan_of(vec![
                web("a", "198.19.0.10", 30080, "198.18.128.2"),
                web("b", "198.19.0.11", 30081, "198.18.128.3"),
                web("c", "198.19.0.12", 30082, "198.18.128.4"),
            ]),
            IpFamily::V4,
            &[],
        );
        assert_eq!(one.nat.commands.len(), three.nat.commands.len());
        assert_eq!(one.filter.commands.len(), three.filter.commands.len());
        assert_eq!(three.sets["KUBE-CLUSTER-IP"].members.len(), 3);
    }

    #[test]
    fn external_traffic_policy_local_frontends_go_in_the_local_sets_with_the_plans_routes() {
        let (mut service, slice) = web("web", "198.19.0.10", 30080, "198.18.128.2");
        service.service_type = ServiceType::LoadBalancer;
        service.external_traffic_policy = TrafficPolicy::Local;
        service.load_balancer_ingress =
            vec![svcplane_core::LoadBalancerIngress { ip: "198.18.100.1".parse().unwrap(), is_proxy_mode: false }];
        let rules = family_rules(&plan_of(vec![(service, slice)]), IpFamily::V4, &[]);
        assert_eq!(members(&rules, "KUBE-LOAD-BALANCER-LOCAL"), vec!["198.18.100.1,tcp:80"]);
        assert_eq!(members(&rules, "KUBE-NODE-PORT-LOCAL-TCP"), vec!["30080"]);
        assert!(rules.sets["KUBE-LOAD-BALANCER"].members.is_empty());
        let text = rules.nat.render();
        for expected in [
            "--match-set KUBE-LOAD-BALANCER-LOCAL dst,dst -s 198.18.128.0/17 -j RETURN",
            "--match-set KUBE-LOAD-BALANCER-LOCAL dst,dst -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ",
            "--match-set KUBE-LOAD-BALANCER-LOCAL dst,dst -j RETURN",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
    }

    #[test]
    fn pods_and_the_node_to_an_external_traffic_policy_local_address_are_marked_for_every_endpoint() {
        let (mut service, mut slice) = web("web", "198.19.0.10", 30080, "198.18.128.2");
        service.service_type = ServiceType::LoadBalancer;
        service.external_traffic_policy = TrafficPolicy::Local;
        service.load_balancer_ingress =
            vec![svcplane_core::LoadBalancerIngress { ip: "198.18.100.1".parse().unwrap(), is_proxy_mode: false }];
        slice.endpoints.push(Endpoint::ready("198.18.129.2".parse().unwrap(), Some("node2")));
        let node_ip: IpAddr = "198.18.0.11".parse().unwrap();
        let plan = plan_of(vec![(service, slice)]);
        let rules = family_rules(&plan, IpFamily::V4, &[node_ip]);
        let marks = fwmark::marks(&plan, IpFamily::V4, &[node_ip]);
        let lb = fwmark::MarkedFrontend { address: "198.18.100.1".parse().unwrap(), protocol: Protocol::Tcp, port: 80 };
        let node_port = fwmark::MarkedFrontend { address: node_ip, protocol: Protocol::Tcp, port: 30080 };
        assert_eq!(
            marks.keys().copied().collect::<Vec<_>>(),
            vec![node_ip_first(node_port, lb), node_ip_last(node_port, lb)]
        );
        let mark = marks[&lb].mark;
        assert_ne!(mark, marks[&node_port].mark, "one mark per frontend address");
        assert_eq!(mark & !fwmark::MARK_MASK, 0);
        assert_eq!(marks[&lb].endpoints, svcplane_core::EndpointSetKind::Cluster);
        let text = rules.nat.render();
        let set = format!("-j MARK --set-xmark {mark:#x}/0xfff0000");
        for expected in [
            format!("-A KUBE-SERVICES -m tcp -p tcp -d 198.18.100.1 --dport 80 -m addrtype --src-type LOCAL {set}"),
            format!("-A KUBE-SERVICES -m tcp -p tcp -d 198.18.100.1 --dport 80 -s 198.18.128.0/17 {set}"),
        ] {
            assert!(text.contains(&expected), "missing {expected:?} in:\n{text}");
        }
        let first_mark = text.find("--set-xmark").unwrap();
        let first_set = text.find("-A KUBE-SERVICES -m set").unwrap();
        assert!(first_mark < first_set, "marks come before the masquerade decisions:\n{text}");
        // Later rules win: the pod route (first in the plan) is written after the node's.
        assert!(
            text.find("-d 198.18.100.1 --dport 80 -m addrtype").unwrap()
                < text.find("-d 198.18.100.1 --dport 80 -s 198.18.128.0/17").unwrap(),
            "{text}"
        );
    }

    fn node_ip_first(a: fwmark::MarkedFrontend, b: fwmark::MarkedFrontend) -> fwmark::MarkedFrontend {
        a.min(b)
    }

    fn node_ip_last(a: fwmark::MarkedFrontend, b: fwmark::MarkedFrontend) -> fwmark::MarkedFrontend {
        a.max(b)
    }

    #[test]
    fn a_service_without_endpoints_is_refused_and_source_ranges_drop_what_they_do_not_allow() {
        let (mut empty, mut slice) = web("empty", "198.19.0.20", 30090, "198.18.128.2");
        empty.service_type = ServiceType::ClusterIp;
        slice.endpoints.clear();
        let (mut lb, lb_slice) = web("lb", "198.19.0.30", 30053, "198.18.128.3");
        lb.service_type = ServiceType::LoadBalancer;
        lb.load_balancer_ingress =
            vec![svcplane_core::LoadBalancerIngress { ip: "198.18.100.1".parse().unwrap(), is_proxy_mode: false }];
        lb.load_balancer_source_ranges = vec!["198.18.0.100/31".parse().unwrap(), "2001:db8::/64".parse().unwrap()];
        let rules = family_rules(&plan_of(vec![(empty, slice), (lb, lb_slice)]), IpFamily::V4, &[]);
        assert_eq!(members(&rules, "KUBE-REJECT-TCP"), vec!["198.19.0.20,tcp:80"]);
        assert_eq!(members(&rules, "KUBE-LOAD-BALANCER-FW"), vec!["198.18.100.1,tcp:80"]);
        assert_eq!(members(&rules, "KUBE-LOAD-BALANCER-SOURCE-CIDR"), vec!["198.18.100.1,tcp:80,198.18.0.100/31"]);
        let text = rules.filter.render();
        for expected in [
            "-m set --match-set KUBE-REJECT-TCP dst,dst -j REJECT --reject-with tcp-reset",
            "-m set --match-set KUBE-LOAD-BALANCER-FW dst,dst -m set ! --match-set KUBE-LOAD-BALANCER-SOURCE-CIDR dst,dst,src -j DROP",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
    }

    #[test]
    fn several_pod_cidrs_of_one_family_are_matched_through_a_net_set() {
        let mut state = ClusterState::new();
        let (service, slice) = web("web", "198.19.0.10", 30080, "198.18.128.2");
        state.apply(Change::ServiceUpserted(service));
        state.apply(Change::SliceUpserted(slice));
        let cidrs = vec!["198.18.128.0/18".parse().unwrap(), "198.18.192.0/18".parse().unwrap()];
        let plan = NodePlan::build(&state, NodeConfig { cluster_cidrs: cidrs, ..config() });
        let rules = family_rules(&plan, IpFamily::V4, &[]);
        let nets = rules.sets.keys().find(|name| name.starts_with("KUBE-NETS-")).expect("a net set");
        assert_eq!(members(&rules, nets), vec!["198.18.128.0/18", "198.18.192.0/18"]);
        let text = rules.nat.render();
        assert!(
            text.contains(&format!("KUBE-CLUSTER-IP dst,dst -m set ! --match-set {nets} src -j KUBE-MARK-MASQ")),
            "{text}"
        );
    }

    #[test]
    fn an_ipv6_family_has_its_own_sets_and_no_ipv4_frontends() {
        let rules = family_rules(&plan_of(vec![web("web", "198.19.0.10", 30080, "198.18.128.2")]), IpFamily::V6, &[]);
        assert!(rules.sets.keys().all(|name| name.starts_with("KUBE-6-")), "{:?}", rules.sets.keys());
        assert!(rules.sets.values().all(|set| set.members.is_empty()));
        assert!(rules.sets.keys().all(|name| is_our_set(name)));
        assert!(!is_our_set("KUBE-SOMETHING-ELSE") && !is_our_set("other"));
    }
}
