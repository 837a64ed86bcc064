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

use svcplane_core::{Destination as PlanDestination, IpFamily, NodePlan, SourceMatch};
use svcplane_iptables::{Family, MarkOp, Match, RestoreTable, Rule, Table, Target};

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
    fn an_ipv6_table_has_no_ipv4_frontends() {
        let text = nat_table(&plan(), IpFamily::V6, &[]).render();
        assert!(!text.contains("198.19.0.10"), "{text}");
    }
}
