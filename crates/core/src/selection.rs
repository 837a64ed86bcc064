//! Endpoint selection: which endpoints of a service port this node may send traffic to,
//! under each traffic policy, with topology and the terminating-endpoint fallback.
//! The rules follow kube-proxy's `CategorizeEndpoints`.

use std::net::SocketAddr;

use crate::model::{Node, Service, TrafficPolicy};
use crate::state::ServiceEndpoint;

/// The endpoints one service port may use on one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// For traffic under a `Cluster` policy (topology-filtered).
    pub cluster: Vec<SocketAddr>,
    /// For traffic under a `Local` policy: endpoints on this node.
    pub local: Vec<SocketAddr>,
    /// Whether the service has any usable endpoint anywhere: decides between rejecting
    /// (nothing exists) and dropping (something exists, just not here).
    pub has_any: bool,
}

/// Whether the service needs endpoints for `Cluster` policy traffic.
pub fn uses_cluster_endpoints(service: &Service) -> bool {
    service.internal_traffic_policy == TrafficPolicy::Cluster
        || (service.is_externally_accessible() && service.external_traffic_policy == TrafficPolicy::Cluster)
}

/// Whether the service needs endpoints for `Local` policy traffic.
pub fn uses_local_endpoints(service: &Service) -> bool {
    service.internal_traffic_policy == TrafficPolicy::Local
        || (service.is_externally_accessible() && service.external_traffic_policy == TrafficPolicy::Local)
}

fn is_usable_fallback(endpoint: &ServiceEndpoint) -> bool {
    endpoint.endpoint.serving && endpoint.endpoint.terminating
}

fn is_local(endpoint: &ServiceEndpoint, node: &Node) -> bool {
    endpoint.endpoint.node_name.as_deref() == Some(node.name.as_str())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TopologyMode {
    None,
    SameNode,
    SameZone,
}

/// Topology applies only when every ready endpoint carries hints and one names us;
/// otherwise hints are ignored, so a half-hinted slice never strands traffic.
fn topology_mode(endpoints: &[ServiceEndpoint], node: &Node) -> TopologyMode {
    let ready = || endpoints.iter().filter(|e| e.endpoint.ready);
    if ready().all(|e| !e.endpoint.node_hints().is_empty())
        && ready().any(|e| names(e.endpoint.node_hints(), &node.name))
    {
        return TopologyMode::SameNode;
    }
    let Some(zone) = node.zone.as_ref() else {
        return TopologyMode::None;
    };
    if ready().all(|e| !e.endpoint.zone_hints().is_empty()) && ready().any(|e| names(e.endpoint.zone_hints(), zone)) {
        return TopologyMode::SameZone;
    }
    TopologyMode::None
}

/// Whether `hints` names `name`.
fn names(hints: &[crate::model::Name], name: &str) -> bool {
    hints.iter().any(|hint| **hint == *name)
}

fn is_available_for_topology(endpoint: &ServiceEndpoint, mode: TopologyMode, node: &Node) -> bool {
    match mode {
        TopologyMode::None => true,
        TopologyMode::SameNode => names(endpoint.endpoint.node_hints(), &node.name),
        TopologyMode::SameZone => node.zone.as_ref().is_some_and(|zone| names(endpoint.endpoint.zone_hints(), zone)),
    }
}

/// Ready endpoints that pass `keep`; if there are none, serving-and-terminating ones.
fn ready_or_terminating(endpoints: &[ServiceEndpoint], keep: impl Fn(&ServiceEndpoint) -> bool) -> Vec<SocketAddr> {
    let ready: Vec<SocketAddr> = endpoints.iter().filter(|e| e.endpoint.ready && keep(e)).map(|e| e.address).collect();
    if !ready.is_empty() {
        return ready;
    }
    endpoints.iter().filter(|e| is_usable_fallback(e) && keep(e)).map(|e| e.address).collect()
}

/// Chooses the endpoints of one service port for this node.
pub fn select_endpoints(service: &Service, endpoints: &[ServiceEndpoint], node: &Node) -> Selection {
    let mut selection = Selection::default();
    if uses_cluster_endpoints(service) {
        let mode = topology_mode(endpoints, node);
        selection.cluster = ready_or_terminating(endpoints, |e| is_available_for_topology(e, mode, node));
    }
    if uses_local_endpoints(service) {
        selection.local = ready_or_terminating(endpoints, |e| is_local(e, node));
    }
    selection.has_any = endpoints.iter().any(|e| e.endpoint.ready || is_usable_fallback(e));
    selection
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, NamespacedName, Protocol, ServicePort, ServiceType};

    fn service() -> Service {
        Service::cluster_ip(
            NamespacedName::new("default", "web"),
            vec!["198.19.0.10".parse().unwrap()],
            vec![ServicePort { name: String::new(), protocol: Protocol::Tcp, port: 80, node_port: None }],
        )
    }

    fn node() -> Node {
        Node { leaving: false, name: "node1".into(), addresses: vec![], zone: Some("zone-a".into()) }
    }

    fn endpoint(ip: &str, node: &str) -> ServiceEndpoint {
        ServiceEndpoint {
            address: SocketAddr::new(ip.parse().unwrap(), 8080),
            endpoint: Endpoint::ready(ip.parse().unwrap(), Some(node)),
        }
    }

    fn terminating(mut e: ServiceEndpoint, serving: bool) -> ServiceEndpoint {
        e.endpoint.ready = false;
        e.endpoint.terminating = true;
        e.endpoint.serving = serving;
        e
    }

    fn addrs(list: &[SocketAddr]) -> Vec<String> {
        list.iter().map(|a| a.ip().to_string()).collect()
    }

    #[test]
    fn cluster_policy_uses_every_ready_endpoint() {
        let eps = [endpoint("198.18.129.2", "node1"), endpoint("198.18.130.2", "node2")];
        let s = select_endpoints(&service(), &eps, &node());
        assert_eq!(addrs(&s.cluster), ["198.18.129.2", "198.18.130.2"]);
        assert!(s.local.is_empty());
        assert!(s.has_any);
    }

    #[test]
    fn endpoints_that_are_not_ready_are_not_used() {
        let mut not_ready = endpoint("198.18.129.3", "node1");
        not_ready.endpoint.ready = false;
        not_ready.endpoint.serving = false;
        let eps = [endpoint("198.18.129.2", "node1"), not_ready];
        assert_eq!(addrs(&select_endpoints(&service(), &eps, &node()).cluster), ["198.18.129.2"]);
    }

    #[test]
    fn serving_terminating_endpoints_are_used_only_when_none_is_ready() {
        let eps = [terminating(endpoint("198.18.129.2", "node1"), true), endpoint("198.18.129.3", "node1")];
        assert_eq!(addrs(&select_endpoints(&service(), &eps, &node()).cluster), ["198.18.129.3"]);
        let eps = [terminating(endpoint("198.18.129.2", "node1"), true)];
        assert_eq!(addrs(&select_endpoints(&service(), &eps, &node()).cluster), ["198.18.129.2"]);
    }

    #[test]
    fn terminating_endpoints_that_are_not_serving_are_never_used() {
        let eps = [terminating(endpoint("198.18.129.2", "node1"), false)];
        let s = select_endpoints(&service(), &eps, &node());
        assert!(s.cluster.is_empty());
        assert!(!s.has_any);
    }

    #[test]
    fn internal_local_policy_uses_only_endpoints_on_this_node() {
        let mut svc = service();
        svc.internal_traffic_policy = TrafficPolicy::Local;
        let eps = [endpoint("198.18.129.2", "node1"), endpoint("198.18.130.2", "node2")];
        let s = select_endpoints(&svc, &eps, &node());
        assert!(s.cluster.is_empty(), "a ClusterIP-only service with internal Local needs no cluster endpoints");
        assert_eq!(addrs(&s.local), ["198.18.129.2"]);
    }

    #[test]
    fn external_local_policy_keeps_cluster_endpoints_for_internal_traffic() {
        let mut svc = service();
        svc.service_type = ServiceType::NodePort;
        svc.external_traffic_policy = TrafficPolicy::Local;
        let eps = [endpoint("198.18.129.2", "node1"), endpoint("198.18.130.2", "node2")];
        let s = select_endpoints(&svc, &eps, &node());
        assert_eq!(addrs(&s.cluster), ["198.18.129.2", "198.18.130.2"]);
        assert_eq!(addrs(&s.local), ["198.18.129.2"]);
    }

    #[test]
    fn local_policy_with_no_local_endpoint_still_knows_others_exist() {
        let mut svc = service();
        svc.internal_traffic_policy = TrafficPolicy::Local;
        let eps = [endpoint("198.18.130.2", "node2")];
        let s = select_endpoints(&svc, &eps, &node());
        assert!(s.local.is_empty());
        assert!(s.has_any);
    }

    #[test]
    fn zone_hints_restrict_cluster_endpoints_to_this_zone() {
        let mut a = endpoint("198.18.129.2", "node1");
        a.endpoint.set_hints(&["zone-a"], &[]);
        let mut b = endpoint("198.18.130.2", "node2");
        b.endpoint.set_hints(&["zone-b"], &[]);
        assert_eq!(addrs(&select_endpoints(&service(), &[a, b], &node()).cluster), ["198.18.129.2"]);
    }

    #[test]
    fn zone_hints_are_ignored_unless_every_ready_endpoint_has_one() {
        let mut a = endpoint("198.18.129.2", "node1");
        a.endpoint.set_hints(&["zone-a"], &[]);
        let b = endpoint("198.18.130.2", "node2");
        assert_eq!(select_endpoints(&service(), &[a, b], &node()).cluster.len(), 2);
    }

    #[test]
    fn zone_hints_are_ignored_when_none_names_this_zone() {
        let mut a = endpoint("198.18.129.2", "node1");
        a.endpoint.set_hints(&["zone-c"], &[]);
        assert_eq!(select_endpoints(&service(), &[a], &node()).cluster.len(), 1);
    }

    #[test]
    fn node_hints_take_precedence_over_zone_hints() {
        let mut a = endpoint("198.18.129.2", "node1");
        a.endpoint.set_hints(&["zone-a"], &["node1"]);
        let mut b = endpoint("198.18.129.3", "node3");
        b.endpoint.set_hints(&["zone-a"], &["node3"]);
        assert_eq!(addrs(&select_endpoints(&service(), &[a, b], &node()).cluster), ["198.18.129.2"]);
    }
}
