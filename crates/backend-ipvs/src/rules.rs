//! The iptables rules IPVS mode needs beside IPVS, in the nat table of each family, with
//! upstream's chain names: `KUBE-SERVICES` (from `PREROUTING` and `OUTPUT`) marks the
//! traffic the plan says to masquerade, `KUBE-MARK-MASQ` sets the mark, and
//! `KUBE-POSTROUTING` masquerades marked packets after IPVS has rewritten their
//! destination (which needs `net.ipv4.vs.conntrack=1`, so IPVS connections are tracked).
//!
//! Upstream matches through ipsets (`KUBE-CLUSTER-IP`, `KUBE-NODE-PORT-TCP`, ...); these
//! rules match each frontend directly instead, one rule per route, in the plan's order:
//! a masquerading route jumps to `KUBE-MARK-MASQ`, any other route returns, so the first
//! route whose sources match decides, as the plan says.

use std::net::IpAddr;

use svcplane_core::{Destination as PlanDestination, IpFamily, NodePlan, SourceMatch, Unrouted};
use svcplane_iptables::{Family, MarkOp, Match, RejectWith, RestoreTable, Rule, Table, Target};

pub const SERVICES: &str = "KUBE-SERVICES";
pub const MARK_MASQ: &str = "KUBE-MARK-MASQ";
pub const POSTROUTING: &str = "KUBE-POSTROUTING";
/// kube-proxy's masquerade mark bit (`--masquerade-bit 14`).
pub const MASQ_MARK: u32 = 0x4000;

/// The hooks into the built-in chains: (built-in chain, our chain).
pub const HOOKS: &[(&str, &str)] = &[("PREROUTING", SERVICES), ("OUTPUT", SERVICES), ("POSTROUTING", POSTROUTING)];

pub fn family_of(family: IpFamily) -> Family {
    match family {
        IpFamily::V4 => Family::V4,
        IpFamily::V6 => Family::V6,
    }
}

/// The nat table's chains for `family`: declared (so written whole) with all their rules.
/// The hooks are added by the caller where missing.
pub fn nat_table(plan: &NodePlan, family: IpFamily, node_port_addresses: &[IpAddr]) -> RestoreTable {
    let mut table = RestoreTable::new(Table::Nat);
    for chain in [SERVICES, MARK_MASQ, POSTROUTING] {
        table.declare(chain);
    }
    table.append(MARK_MASQ, Rule::new().target(Target::Mark(MarkOp::Or(MASQ_MARK))));
    // Hairpin (upstream's KUBE-LOOP-BACK set): a pod that IPVS sent to itself is
    // masqueraded, or its reply would bypass the node. After IPVS, the packet's source and
    // destination are that endpoint.
    for port in plan.service_ports.values().filter(|port| port.family == family && port.masquerade_hairpin) {
        let endpoints: std::collections::BTreeSet<_> =
            port.cluster_endpoints.iter().chain(&port.local_endpoints).copied().collect();
        for endpoint in endpoints {
            table.append(
                POSTROUTING,
                Rule::new()
                    .comment(format!("{} hairpin", port.name))
                    .protocol(port.protocol)
                    .source(endpoint.ip())
                    .destination(endpoint.ip())
                    .destination_port(endpoint.port())
                    .target(Target::Masquerade { random_fully: false }),
            );
        }
    }
    table.append(
        POSTROUTING,
        Rule::new().matching(Match::Mark { negate: true, value: MASQ_MARK, mask: MASQ_MARK }).target(Target::Return),
    );
    table.append(POSTROUTING, Rule::new().target(Target::Mark(MarkOp::Xor(MASQ_MARK))));
    table.append(POSTROUTING, Rule::new().target(Target::Masquerade { random_fully: true }));
    for port in plan.service_ports.values().filter(|port| port.family == family) {
        for frontend in &port.frontends {
            let addresses = match frontend.destination {
                PlanDestination::Address(address) => vec![address],
                PlanDestination::NodePortAddresses => node_port_addresses.to_vec(),
            };
            for address in addresses {
                let comment = format!("{} {:?}", port.name, frontend.kind);
                for route in &frontend.routes {
                    let base = || {
                        Rule::new()
                            .comment(comment.clone())
                            .protocol(port.protocol)
                            .destination(address)
                            .destination_port(frontend.port)
                    };
                    let rule = match &route.sources {
                        SourceMatch::Any => base(),
                        SourceMatch::ThisNode => base().source_is_local(),
                        SourceMatch::Inside(cidrs) if cidrs.len() == 1 => base().source(cidrs[0]),
                        SourceMatch::Outside(cidrs) if cidrs.len() == 1 => base().not_source(cidrs[0]),
                        SourceMatch::Outside(cidrs) if cidrs.is_empty() => base(),
                        // Several pod CIDRs of one family: not spelled yet (docs/backend-ipvs.md).
                        SourceMatch::Inside(_) | SourceMatch::Outside(_) => continue,
                    };
                    let rule = if route.masquerade { rule.jump(MARK_MASQ) } else { rule.target(Target::Return) };
                    table.append(SERVICES, rule);
                }
            }
        }
    }
    table
}

/// The filter table's chain where what IPVS cannot do is decided: refusing Services
/// without endpoints, dropping what the plan drops, `loadBalancerSourceRanges`.
pub const FILTER: &str = "KUBE-SERVICES";
/// Per frontend with source ranges: `RETURN` for each allowed range, else `DROP`.
const SOURCE_RANGES_PREFIX: &str = "KUBE-FW-";

/// The filter table's hooks: traffic to a Service address reaches the node's INPUT (the
/// addresses are local: on `kube-ipvs0`, or the node's for NodePorts) before IPVS takes
/// it, and the node's own traffic its OUTPUT, where a frontend without a virtual service
/// (nothing to balance to) is still seen with its Service address.
pub const FILTER_HOOKS: &[(&str, &str)] = &[("INPUT", FILTER), ("OUTPUT", FILTER)];

/// The chain of one frontend's source ranges, named by a hash of the frontend.
fn source_ranges_chain(address: IpAddr, protocol: svcplane_core::Protocol, port: u16) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (address, protocol, port).hash(&mut hasher);
    format!("{SOURCE_RANGES_PREFIX}{:016X}", hasher.finish())
}

/// The filter table for `family`: per frontend, only what differs from "IPVS balances it":
/// source ranges (a chain that returns for allowed sources and drops the rest), a route
/// whose endpoint set is empty here (drop, as the plan says), and what no route takes
/// (refuse at once when the Service has no endpoint anywhere, else drop). Frontends whose
/// every source reaches endpoints get no rule.
pub fn filter_table(plan: &NodePlan, family: IpFamily, node_port_addresses: &[IpAddr]) -> RestoreTable {
    let mut table = RestoreTable::new(Table::Filter);
    table.declare(FILTER);
    for port in plan.service_ports.values().filter(|port| port.family == family) {
        for frontend in &port.frontends {
            let empty = |route: &svcplane_core::Route| port.endpoints(route.endpoints).is_empty();
            let every_source_balanced = frontend.routes.iter().any(|route| route.sources == SourceMatch::Any)
                && !frontend.routes.iter().any(empty);
            if every_source_balanced && frontend.allowed_sources.is_empty() {
                continue;
            }
            let addresses = match frontend.destination {
                PlanDestination::Address(address) => vec![address],
                PlanDestination::NodePortAddresses => node_port_addresses.to_vec(),
            };
            for address in addresses {
                let comment = format!("{} {:?}", port.name, frontend.kind);
                let base = || {
                    Rule::new()
                        .comment(comment.clone())
                        .protocol(port.protocol)
                        .destination(address)
                        .destination_port(frontend.port)
                };
                if !frontend.allowed_sources.is_empty() {
                    let chain = source_ranges_chain(address, port.protocol, frontend.port);
                    table.declare(chain.clone());
                    for allowed in frontend.allowed_sources.iter().filter(|net| IpFamily::of(&net.addr()) == family) {
                        table.append(chain.clone(), Rule::new().source(*allowed).target(Target::Return));
                    }
                    table.append(chain.clone(), Rule::new().comment(comment.clone()).target(Target::Drop));
                    table.append(FILTER, base().jump(&chain));
                }
                if every_source_balanced {
                    continue;
                }
                for route in &frontend.routes {
                    let rule = match &route.sources {
                        SourceMatch::Any => base(),
                        SourceMatch::ThisNode => base().source_is_local(),
                        SourceMatch::Inside(cidrs) if cidrs.len() == 1 => base().source(cidrs[0]),
                        SourceMatch::Outside(cidrs) if cidrs.len() == 1 => base().not_source(cidrs[0]),
                        SourceMatch::Outside(cidrs) if cidrs.is_empty() => base(),
                        // Several pod CIDRs of one family: not spelled (as in the nat table).
                        SourceMatch::Inside(_) | SourceMatch::Outside(_) => continue,
                    };
                    table.append(FILTER, rule.target(if empty(route) { Target::Drop } else { Target::Return }));
                }
                let unrouted = match frontend.unrouted {
                    Unrouted::Reject => Target::Reject(Some(reject_with(port.protocol, family))),
                    Unrouted::Drop | Unrouted::Unreachable => Target::Drop,
                };
                table.append(FILTER, base().target(unrouted));
            }
        }
    }
    table
}

/// What a closed port answers: a reset for TCP, ICMP (v6) port unreachable otherwise.
fn reject_with(protocol: svcplane_core::Protocol, family: IpFamily) -> RejectWith {
    match (protocol, family) {
        (svcplane_core::Protocol::Tcp, _) => RejectWith::TcpReset,
        (_, IpFamily::V4) => RejectWith::IcmpPortUnreachable,
        (_, IpFamily::V6) => RejectWith::Icmp6PortUnreachable,
    }
}

/// Whether `chain` is one this mode writes in the filter table.
pub fn is_filter_chain(chain: &str) -> bool {
    chain == FILTER || chain.starts_with(SOURCE_RANGES_PREFIX)
}

/// A hook rule: `-j CHAIN`.
pub fn hook_rule(chain: &str) -> Rule {
    Rule::new().jump(chain)
}

#[cfg(test)]
mod tests {
    use svcplane_core::{
        Change, ClusterState, Endpoint, EndpointPort, EndpointSlice, NamespacedName, NodeConfig, NodePortAddresses,
        Protocol, Service, ServicePort, ServiceType,
    };

    use super::*;

    fn plan() -> NodePlan {
        let mut service = Service::cluster_ip(
            NamespacedName::new("default", "web"),
            vec!["198.19.0.10".parse().unwrap()],
            vec![ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: 80, node_port: Some(30080) }],
        );
        service.service_type = ServiceType::NodePort;
        let slice = EndpointSlice {
            last_change_trigger: None,
            name: NamespacedName::new("default", "web-abc"),
            service: NamespacedName::new("default", "web"),
            family: IpFamily::V4,
            ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
            endpoints: vec![Endpoint::ready("198.18.128.2".parse().unwrap(), Some("node1"))],
        };
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(service));
        state.apply(Change::SliceUpserted(slice));
        NodePlan::build(
            &state,
            NodeConfig {
                node_name: "node1".into(),
                node_ips: vec!["198.18.0.11".parse().unwrap()],
                cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
                node_port_addresses: NodePortAddresses::AllLocal,
            },
        )
    }

    #[test]
    fn masquerade_routes_mark_and_marked_or_hairpin_packets_are_masqueraded() {
        let node_ip: IpAddr = "198.18.0.11".parse().unwrap();
        let text = nat_table(&plan(), IpFamily::V4, &[node_ip]).render();
        for expected in [
            ":KUBE-SERVICES - [0:0]",
            "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
            "-s 198.18.128.2 -d 198.18.128.2 --dport 8080 -j MASQUERADE",
            "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
            "-d 198.19.0.10 --dport 80 ! -s 198.18.128.0/17 -j KUBE-MARK-MASQ",
            "-d 198.19.0.10 --dport 80 -j RETURN",
            "-d 198.18.0.11 --dport 30080 -j KUBE-MARK-MASQ",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
        let hairpin = text.find("-j MASQUERADE\n").unwrap();
        let mark_return = text.find("-j RETURN").unwrap();
        assert!(hairpin < mark_return, "hairpin masquerade comes before the mark test:\n{text}");
    }

    #[test]
    fn a_service_that_reaches_its_endpoints_from_everywhere_has_no_filter_rule() {
        let text = filter_table(&plan(), IpFamily::V4, &["198.18.0.11".parse().unwrap()]).render();
        assert!(!text.contains("198.19.0.10"), "{text}");
    }

    #[test]
    fn a_service_without_endpoints_is_refused_and_source_ranges_drop_what_they_do_not_allow() {
        let mut service = Service::cluster_ip(
            NamespacedName::new("default", "empty"),
            vec!["198.19.0.20".parse().unwrap()],
            vec![ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: 80, node_port: None }],
        );
        service.service_type = ServiceType::ClusterIp;
        let mut lb = Service::cluster_ip(
            NamespacedName::new("default", "lb"),
            vec!["198.19.0.30".parse().unwrap()],
            vec![ServicePort { name: "dns".into(), protocol: Protocol::Udp, port: 53, node_port: Some(30053) }],
        );
        lb.service_type = ServiceType::LoadBalancer;
        lb.load_balancer_ingress =
            vec![svcplane_core::LoadBalancerIngress { ip: "198.18.100.1".parse().unwrap(), is_proxy_mode: false }];
        lb.load_balancer_source_ranges = vec!["198.18.0.100/31".parse().unwrap()];
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(service));
        state.apply(Change::ServiceUpserted(lb));
        let plan = NodePlan::build(
            &state,
            NodeConfig {
                node_name: "node1".into(),
                node_ips: vec!["198.18.0.11".parse().unwrap()],
                cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
                node_port_addresses: NodePortAddresses::AllLocal,
            },
        );
        let text = filter_table(&plan, IpFamily::V4, &["198.18.0.11".parse().unwrap()]).render();
        assert!(text.contains("-d 198.19.0.20 --dport 80 -j REJECT --reject-with tcp-reset"), "{text}");
        assert!(text.contains("-d 198.19.0.30 --dport 53 -j REJECT --reject-with icmp-port-unreachable"), "{text}");
        let chain = text.lines().find_map(|line| line.strip_prefix(":KUBE-FW-")).expect("a source-range chain");
        let chain = format!("KUBE-FW-{}", chain.split_whitespace().next().unwrap());
        assert!(text.contains(&format!("-d 198.18.100.1 --dport 53 -j {chain}")), "{text}");
        assert!(text.contains(&format!("-A {chain} -s 198.18.0.100/31 -j RETURN")), "{text}");
        assert!(text.contains(&format!("-A {chain} -m comment")) && text.contains("-j DROP"), "{text}");
    }

    #[test]
    fn an_ipv6_table_has_no_ipv4_frontends() {
        let text = nat_table(&plan(), IpFamily::V6, &[]).render();
        assert!(!text.contains("198.19.0.10"), "{text}");
    }
}
