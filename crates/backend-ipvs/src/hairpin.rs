//! The hairpin sets (`KUBE-LOOP-BACK`, `KUBE-6-LOOP-BACK`) kept in step with the plan one
//! service port at a time, so an endpoint change costs in proportion to the ports it
//! changed instead of a spelling of every set and rule of the plan.
//!
//! An endpoint change moves members of the hairpin set and nothing else of the sets and
//! rules, as long as each changed port keeps its frontends, which of its routes have no
//! endpoints, and which of its frontends need a firewall mark ([`rules_unchanged`]). Two
//! Services can select the same pods on the same port, so a member is counted: it leaves
//! the set when no port holds it any more.

use std::collections::HashMap;

use svcplane_core::{NodePlan, PlanDiff, ServicePortPlan};
use svcplane_ipvs::ipset::Operation;

use crate::fwmark;
use crate::ipset;

/// The hairpin members of `port`: (set, member), an endpoint counted once per list it is in.
pub fn members(port: &ServicePortPlan) -> impl Iterator<Item = (String, String)> + '_ {
    let set = ipset::set_name(port.family, "LOOP-BACK");
    port.cluster_endpoints.iter().chain(port.local_endpoints.iter()).filter(|_| port.masquerade_hairpin).map(
        move |endpoint| (set.clone(), ipset::ip_port_ip(endpoint.ip(), port.protocol, endpoint.port(), endpoint.ip())),
    )
}

/// Whether every set but the hairpin one, and every rule, is the same for `after` as for
/// `before`: the same frontends, the same routes without endpoints, the same frontends
/// needing a firewall mark (what `rules::family_rules` reads of a port besides its
/// hairpin members).
pub fn rules_unchanged(before: &ServicePortPlan, after: &ServicePortPlan) -> bool {
    let empty_routes = |port: &ServicePortPlan| -> Vec<bool> {
        port.frontends
            .iter()
            .flat_map(|frontend| frontend.routes.iter().map(|route| port.endpoints(route.endpoints).is_empty()))
            .collect()
    };
    let marked = |port: &ServicePortPlan| -> Vec<_> {
        port.frontends.iter().map(|frontend| fwmark::other_set(port, frontend)).collect()
    };
    before.family == after.family
        && before.protocol == after.protocol
        && before.masquerade_hairpin == after.masquerade_hairpin
        && before.frontends == after.frontends
        && empty_routes(before) == empty_routes(after)
        && marked(before) == marked(after)
}

/// How many ports of the plan hold each hairpin member.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HairpinCounts {
    counts: HashMap<(String, String), u32>,
}

impl HairpinCounts {
    pub fn of_plan(plan: &NodePlan) -> Self {
        let mut counts = HashMap::new();
        for member in plan.service_ports.values().flat_map(members) {
            *counts.entry(member).or_insert(0) += 1;
        }
        HairpinCounts { counts }
    }

    /// The member changes that take the hairpin sets from before `diff` to `plan`, when
    /// nothing else of the sets and rules changes; `None` when something else may (a port
    /// added or removed, or one whose rules changed), and the counts are then as they were.
    pub fn step(&mut self, plan: &NodePlan, diff: &PlanDiff) -> Option<Vec<(String, String, Operation)>> {
        let mut delta: HashMap<(String, String), i64> = HashMap::new();
        for key in diff.keys() {
            let before = diff.previous(key)?;
            let after = plan.service_ports.get(key)?;
            if !rules_unchanged(before, after) {
                return None;
            }
            for member in members(before) {
                *delta.entry(member).or_insert(0) -= 1;
            }
            for member in members(after) {
                *delta.entry(member).or_insert(0) += 1;
            }
        }
        let mut counted = Vec::new();
        for (member, change) in delta.into_iter().filter(|(_, change)| *change != 0) {
            let count = self.counts.get(&member).copied().unwrap_or(0);
            // Below zero: the counts never had this port's members, so they do not stand
            // for the plan before `diff`.
            let now = u32::try_from(i64::from(count) + change).ok()?;
            counted.push((member, count, now));
        }
        let mut changes = Vec::new();
        for (member, count, now) in counted {
            match (count, now) {
                (0, _) => changes.push((member.0.clone(), member.1.clone(), Operation::Add)),
                (_, 0) => changes.push((member.0.clone(), member.1.clone(), Operation::Delete)),
                _ => {}
            }
            if now == 0 {
                self.counts.remove(&member);
            } else {
                self.counts.insert(member, now);
            }
        }
        changes.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        Some(changes)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::net::IpAddr;

    use svcplane_core::{
        Change, ClusterState, Endpoint, EndpointPort, EndpointSlice, IpFamily, NamespacedName, Protocol, Service,
        ServicePort,
    };

    use super::*;
    use crate::rules;
    use crate::rules::tests::config;

    /// `web{index}` on 198.19.0.{index}:80, its slice's endpoints 198.18.128.{last}:8080.
    fn apply_service(state: &mut ClusterState, index: u8, endpoints: &[u8]) {
        let name = NamespacedName::new("default", format!("web{index}"));
        let port = ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: 80, node_port: None };
        state.apply(Change::ServiceUpserted(Service::cluster_ip(
            name.clone(),
            vec![IpAddr::from([198, 19, 0, index])],
            vec![port],
        )));
        state.apply(Change::SliceUpserted(EndpointSlice {
            last_change_trigger: None,
            name: NamespacedName::new("default", format!("web{index}-abc")),
            service: name,
            family: IpFamily::V4,
            ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
            endpoints: endpoints
                .iter()
                .map(|last| Endpoint::ready(IpAddr::from([198, 18, 128, *last]), Some("node2")))
                .collect(),
        }));
    }

    fn loop_back(plan: &NodePlan) -> BTreeSet<String> {
        rules::family_rules(plan, IpFamily::V4, &[]).sets["KUBE-LOOP-BACK"].members.clone()
    }

    /// web1 and web2 select the same pods 2 and 3: their hairpin members are shared.
    fn shared() -> (ClusterState, NodePlan, HairpinCounts) {
        let mut state = ClusterState::new();
        apply_service(&mut state, 1, &[2, 3]);
        apply_service(&mut state, 2, &[2, 3]);
        state.take_changes();
        let plan = NodePlan::build(&state, config());
        let counts = HairpinCounts::of_plan(&plan);
        (state, plan, counts)
    }

    fn step(
        state: &mut ClusterState,
        plan: &mut NodePlan,
        counts: &mut HairpinCounts,
        index: u8,
        endpoints: &[u8],
    ) -> Option<Vec<(String, String, Operation)>> {
        apply_service(state, index, endpoints);
        let changes = state.take_changes();
        let diff = plan.update(state, &changes);
        counts.step(plan, &diff)
    }

    #[test]
    fn a_moved_endpoint_moves_its_hairpin_member_and_the_set_is_what_a_whole_spelling_makes() {
        let (mut state, mut plan, mut counts) = shared();
        let mut members = loop_back(&plan);
        let moves = step(&mut state, &mut plan, &mut counts, 1, &[2, 4]).expect("only hairpin members change");
        // Pod 3 is still web2's: only pod 4 comes in.
        assert_eq!(
            moves,
            vec![("KUBE-LOOP-BACK".to_owned(), "198.18.128.4,tcp:8080,198.18.128.4".to_owned(), Operation::Add)]
        );
        for (_, member, operation) in moves {
            match operation {
                Operation::Add => members.insert(member),
                Operation::Delete => members.remove(&member),
            };
        }
        assert_eq!(members, loop_back(&plan));
        assert_eq!(counts, HairpinCounts::of_plan(&plan), "the counts follow the plan");

        // web2 lets go of pod 3 too: now it leaves the set.
        let moves = step(&mut state, &mut plan, &mut counts, 2, &[2]).expect("only hairpin members change");
        assert_eq!(
            moves,
            vec![("KUBE-LOOP-BACK".to_owned(), "198.18.128.3,tcp:8080,198.18.128.3".to_owned(), Operation::Delete)]
        );
        assert_eq!(counts, HairpinCounts::of_plan(&plan));
    }

    #[test]
    fn a_port_that_loses_its_last_endpoint_or_is_new_needs_the_whole_spelling() {
        let (mut state, mut plan, mut counts) = shared();
        let before = counts.clone();
        // No endpoints left: the port's frontend now refuses, a rule-level change.
        assert_eq!(step(&mut state, &mut plan, &mut counts, 1, &[]), None);
        assert_eq!(counts, before, "a refused step leaves the counts as they were");
        let (mut state, mut plan, mut counts) = shared();
        assert_eq!(step(&mut state, &mut plan, &mut counts, 3, &[5]), None, "a new Service");
    }
}
