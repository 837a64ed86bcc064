//! Which UDP conntrack entries a plan change leaves pointing nowhere.
//!
//! UDP has no connection end, so an entry keeps steering a client's packets to the same
//! place for as long as the client keeps sending: to an endpoint that is gone, or (when
//! the service had no endpoint) past the DNAT rules altogether. After such a change the
//! entries must go, or a resolver re-using its source port fails until it falls silent.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use crate::model::{IpFamily, Protocol};
use crate::plan::{Destination, Frontend, NodePlan, PlanDiff, ServicePortPlan};

/// Where a stale flow was originally sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FlowDestination {
    /// A ClusterIP, external IP or load-balancer IP.
    Address(IpAddr),
    /// A NodePort, on whichever node address.
    NodePort,
}

/// "Delete the UDP entries sent to `destination:port` whose replies do not come from one of
/// `keep_replies_from`."
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StaleUdpFlows {
    pub family: IpFamily,
    pub destination: FlowDestination,
    pub port: u16,
    pub keep_replies_from: BTreeSet<SocketAddr>,
}

impl StaleUdpFlows {
    /// The flows sent to `frontend` whose replies do not come from `keep`.
    fn on(family: IpFamily, frontend: &Frontend, keep: &BTreeSet<SocketAddr>) -> Self {
        let destination = match frontend.destination {
            Destination::Address(address) => FlowDestination::Address(address),
            Destination::NodePortAddresses => FlowDestination::NodePort,
        };
        Self { family, destination, port: frontend.port, keep_replies_from: keep.clone() }
    }
}

/// Flows to any serving endpoint stay valid, whatever policy or topology now prefers, so
/// an established UDP exchange ends like a TCP connection would: when the endpoint goes.
fn serving(plan: Option<&ServicePortPlan>) -> BTreeSet<SocketAddr> {
    plan.map(|p| p.serving_endpoints.iter().copied().collect()).unwrap_or_default()
}

fn is_udp(plan: Option<&ServicePortPlan>) -> bool {
    plan.is_some_and(|p| p.protocol == Protocol::Udp)
}

/// The cleanups a change of the plan calls for: `diff` is what changed, `plan` is the plan after it.
pub fn stale_udp_flows(plan: &NodePlan, diff: &PlanDiff) -> Vec<StaleUdpFlows> {
    let mut cleanups = BTreeSet::new();
    for key in diff.keys() {
        let old = diff.previous(key);
        let new = plan.service_ports.get(key);
        if !is_udp(old) && !is_udp(new) {
            continue;
        }
        let before = serving(old);
        let after = serving(new);
        let lost_an_endpoint = !before.is_subset(&after);
        let got_first_endpoint = before.is_empty() && !after.is_empty();
        if !lost_an_endpoint && !got_first_endpoint {
            continue;
        }
        for frontend in old.into_iter().chain(new).flat_map(|p| &p.frontends) {
            cleanups.insert(StaleUdpFlows::on(key.family, frontend, &after));
        }
    }
    cleanups.into_iter().collect()
}

/// The cleanups after the mode's rules were replaced wholesale ([`crate::SyncReport::rules_replaced`]):
/// on every frontend of every UDP service port, the flows whose replies do not come from a
/// serving endpoint. A flow that arrived while the rules were being replaced was not
/// translated, and its entry would keep every later packet of that client port off the
/// rules; a flow that was translated replies from its endpoint and is kept.
pub fn udp_flows_not_to_serving_endpoints(plan: &NodePlan) -> Vec<StaleUdpFlows> {
    let mut cleanups = BTreeSet::new();
    for (key, port_plan) in &plan.service_ports {
        if port_plan.protocol != Protocol::Udp {
            continue;
        }
        let keep = serving(Some(port_plan));
        for frontend in &port_plan.frontends {
            cleanups.insert(StaleUdpFlows::on(key.family, frontend, &keep));
        }
    }
    cleanups.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, EndpointPort, EndpointSlice, NamespacedName, Service, ServicePort, ServiceType};
    use crate::plan::{NodeConfig, NodePortAddresses};
    use crate::state::{Change, ClusterState};

    fn dns_service(protocol: Protocol) -> Service {
        let mut s = Service::cluster_ip(
            NamespacedName::new("kube-system", "dns"),
            vec!["198.19.0.10".parse().unwrap()],
            vec![ServicePort { name: "dns".into(), protocol, port: 53, node_port: Some(30053) }],
        );
        s.service_type = ServiceType::NodePort;
        s
    }

    fn slice(protocol: Protocol, addresses: &[&str]) -> EndpointSlice {
        EndpointSlice {
            last_change_trigger: None,
            name: NamespacedName::new("kube-system", "dns-1"),
            service: NamespacedName::new("kube-system", "dns"),
            family: IpFamily::V4,
            ports: vec![EndpointPort { name: "dns".into(), protocol, port: 5353 }],
            endpoints: addresses.iter().map(|a| Endpoint::ready(a.parse().unwrap(), Some("node1"))).collect(),
        }
    }

    /// Applies `before`, then `after`, and returns the cleanups the second update needs.
    fn cleanups(protocol: Protocol, before: &[&str], after: &[&str]) -> Vec<StaleUdpFlows> {
        let config = NodeConfig {
            node_name: "node1".into(),
            node_port_addresses: NodePortAddresses::AllLocal,
            ..NodeConfig::default()
        };
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(dns_service(protocol)));
        state.apply(Change::SliceUpserted(slice(protocol, before)));
        let mut plan = NodePlan::build(&state, config);
        state.take_changes();
        state.apply(Change::SliceUpserted(slice(protocol, after)));
        let changes = state.take_changes();
        let changed = plan.update(&state, &changes);
        stale_udp_flows(&plan, &changed)
    }

    #[test]
    fn losing_a_udp_endpoint_cleans_flows_on_every_frontend_keeping_the_survivors() {
        let got = cleanups(Protocol::Udp, &["198.18.129.2", "198.18.129.3"], &["198.18.129.3"]);
        let destinations: Vec<_> = got.iter().map(|c| (c.destination, c.port)).collect();
        assert_eq!(
            destinations,
            [(FlowDestination::Address("198.19.0.10".parse().unwrap()), 53), (FlowDestination::NodePort, 30053)]
        );
        let keep: Vec<String> = got[0].keep_replies_from.iter().map(ToString::to_string).collect();
        assert_eq!(keep, ["198.18.129.3:5353"]);
    }

    #[test]
    fn a_udp_service_getting_its_first_endpoint_cleans_the_flows_that_bypassed_dnat() {
        let got = cleanups(Protocol::Udp, &[], &["198.18.129.2"]);
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn adding_an_endpoint_to_a_udp_service_that_had_one_needs_no_cleanup() {
        assert!(cleanups(Protocol::Udp, &["198.18.129.2"], &["198.18.129.2", "198.18.129.3"]).is_empty());
    }

    #[test]
    fn a_udp_endpoint_that_is_terminating_but_serving_keeps_its_flows() {
        let config = NodeConfig { node_name: "node1".into(), ..NodeConfig::default() };
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(dns_service(Protocol::Udp)));
        state.apply(Change::SliceUpserted(slice(Protocol::Udp, &["198.18.129.2", "198.18.129.3"])));
        let mut plan = NodePlan::build(&state, config);
        state.take_changes();
        let mut draining = slice(Protocol::Udp, &["198.18.129.2", "198.18.129.3"]);
        draining.endpoints[0].ready = false;
        draining.endpoints[0].terminating = true;
        state.apply(Change::SliceUpserted(draining));
        let changes = state.take_changes();
        let changed = plan.update(&state, &changes);
        assert!(stale_udp_flows(&plan, &changed).is_empty(), "no endpoint stopped serving");
    }

    #[test]
    fn tcp_services_never_need_a_cleanup() {
        assert!(cleanups(Protocol::Tcp, &["198.18.129.2"], &[]).is_empty());
    }

    #[test]
    fn a_udp_service_losing_its_last_endpoint_cleans_everything_sent_to_it() {
        let got = cleanups(Protocol::Udp, &["198.18.129.2"], &[]);
        assert!(got.iter().all(|c| c.keep_replies_from.is_empty()));
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn after_the_rules_were_replaced_every_udp_frontend_is_cleaned_keeping_flows_to_serving_endpoints() {
        let config = NodeConfig {
            node_name: "node1".into(),
            node_port_addresses: NodePortAddresses::AllLocal,
            ..NodeConfig::default()
        };
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(dns_service(Protocol::Udp)));
        state.apply(Change::SliceUpserted(slice(Protocol::Udp, &["198.18.129.2", "198.18.129.3"])));
        let plan = NodePlan::build(&state, config.clone());
        let got = udp_flows_not_to_serving_endpoints(&plan);
        let destinations: Vec<_> = got.iter().map(|c| (c.destination, c.port)).collect();
        assert_eq!(
            destinations,
            vec![(FlowDestination::Address("198.19.0.10".parse().unwrap()), 53), (FlowDestination::NodePort, 30053)]
        );
        let kept: BTreeSet<SocketAddr> =
            ["198.18.129.2:5353".parse().unwrap(), "198.18.129.3:5353".parse().unwrap()].into();
        assert!(got.iter().all(|c| c.keep_replies_from == kept), "{got:?}");

        let mut tcp = ClusterState::new();
        tcp.apply(Change::ServiceUpserted(dns_service(Protocol::Tcp)));
        tcp.apply(Change::SliceUpserted(slice(Protocol::Tcp, &["198.18.129.2"])));
        assert!(udp_flows_not_to_serving_endpoints(&NodePlan::build(&tcp, config)).is_empty(), "TCP ends on its own");
    }
}
