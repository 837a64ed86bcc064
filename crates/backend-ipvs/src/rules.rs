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
